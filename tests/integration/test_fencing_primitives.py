"""Fenced storage with every primitive's fencing token: a `Redlock`'s agreed token, an
`Election` term's number, a `MultiLease`'s token per name, a semaphore permit's token per
slot. In each, the holder that came first writes late, after the next one wrote: refused.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio

from aiolock import (
    Election,
    FencedValue,
    LeaseLostError,
    MultiLock,
    Redlock,
    Semaphore,
    fenced_get,
    fenced_set,
)
from aiolock._lua.layout import LockKeys
from aiolock.testing import expire_now

from ..support.servers import (
    RedisServer,
    ServerBinary,
    clients_of,
    independent_servers,
    quorum_calls_ended,
)
from ..support.waits import within


@pytest.fixture(scope="module")
def redlock_servers(binaries: list[ServerBinary]) -> Iterator[list[RedisServer]]:
    with independent_servers(binaries[0], 3) as started:
        yield started


@pytest.fixture
async def nodes(redlock_servers: list[RedisServer]) -> AsyncIterator[list[redis.asyncio.Redis]]:
    async with clients_of(redlock_servers) as clients:
        try:
            yield clients
        finally:
            await quorum_calls_ended(clients)


@pytest.mark.real_only
async def test_a_redlocks_agreed_token_fences_the_data(
    nodes: list[redis.asyncio.Redis], client: redis.asyncio.Redis, name: str
) -> None:
    """The data lives on a server of its own (`client`); the lock on three others. A's
    lease ends on every node (its keys expire, as during a pause: no renewal here to give
    them back), B takes the lock with a higher agreed token and writes, A's write is
    refused."""
    key = f"{name}:report"
    a = await Redlock(nodes, name, ttl=10, renew=False).acquire()
    assert await fenced_set(client, key, "A's report", a.fencing_token)
    for node in nodes:
        await node.delete(LockKeys.build("aiolock", name, "rl:").lock)
    async with Redlock(nodes, name, ttl=10) as b:
        assert b.fencing_token > a.fencing_token
        assert await fenced_set(client, key, "B's report", b.fencing_token)
        assert not await fenced_set(client, key, "A's late report", a.fencing_token)
    with pytest.raises(LeaseLostError):
        await a.release()
    assert await fenced_get(client, key) == FencedValue(
        value=b"B's report", fencing_token=b.fencing_token
    )


async def test_an_election_terms_number_fences_the_data(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """Leader A's term ends (it resigns: the same holds for a term lost); B wins the next
    term and writes; A, still acting on its old term, writes late: refused."""
    store, key = clients[0], f"{name}:schedule"
    first, second = (
        Election(clients[1], name, identity="a"),
        Election(clients[2], name, identity="b"),
    )
    async with contextlib.aclosing(first.campaign()) as terms_a:
        a = await within(anext(terms_a), what="A's term")
        assert await fenced_set(store, key, "A's plan", a.fencing_token)
        await a.resign()
        async with contextlib.aclosing(second.campaign()) as terms_b:
            b = await within(anext(terms_b), what="B's term")
            async with b:
                assert b.fencing_token > a.fencing_token
                assert await fenced_set(store, key, "B's plan", b.fencing_token)
                assert not await fenced_set(store, key, "A's late plan", a.fencing_token)
    assert await fenced_get(store, key) == FencedValue(
        value=b"B's plan", fencing_token=b.fencing_token
    )


async def test_a_multileases_token_per_name_fences_each_names_data(
    client: redis.asyncio.Redis, name: str
) -> None:
    """Each name's data is fenced with that name's token: A's leases expire, B takes both
    names with higher tokens and writes, A's late writes are refused for each."""
    names = [f"{name}:from", f"{name}:to"]
    a = await MultiLock(client, names, ttl=10).acquire()
    for each in names:
        assert await fenced_set(client, f"{each}:balance", 100, a.fencing_tokens[each])
    for each in names:
        assert await expire_now(client, each)  # as an expiry during A's pause would
    async with MultiLock(client, names, ttl=10) as b:
        for each in names:
            assert b.fencing_tokens[each] > a.fencing_tokens[each]
            assert await fenced_set(client, f"{each}:balance", 90, b.fencing_tokens[each])
            assert not await fenced_set(client, f"{each}:balance", 50, a.fencing_tokens[each])
    with pytest.raises(LeaseLostError):
        await a.release()
    for each in names:
        assert await fenced_get(client, f"{each}:balance") == FencedValue(
            value=b"90", fencing_token=b.fencing_tokens[each]
        )


async def test_a_semaphore_permits_token_fences_its_slots_data(
    client: redis.asyncio.Redis, name: str
) -> None:
    """A permit's data is its slot's: a permit whose slot was taken again after it expired
    writes late, refused."""
    semaphore = Semaphore(client, name, limit=1, ttl=10)
    a = await semaphore.acquire()
    key = f"{name}:slot:{a.slot}"
    assert await fenced_set(client, key, "A", a.fencing_token)
    assert await expire_now(client, semaphore, slot=a.slot)
    async with Semaphore(client, name, limit=1, ttl=10) as b:
        assert b.slot == a.slot and b.fencing_token > a.fencing_token
        assert await fenced_set(client, key, "B", b.fencing_token)
        assert not await fenced_set(client, key, "A late", a.fencing_token)
    with pytest.raises(LeaseLostError):
        await a.release()
    assert (await fenced_get(client, key)).value == b"B"
