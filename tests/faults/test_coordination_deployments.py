"""Elections and MultiLock on Redis Cluster (three primaries, three replicas: `cluster.py`)
and over Sentinel (`sentinel.py`): a term handed over by notification, observed, and read
back; several names in different slots held as one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from aiolock import Election, Leader, Lock, MultiLock, cli
from aiolock._lua.layout import LockKeys

from ..deployments.cluster import SLOTS, ClusterGroup
from ..deployments.sentinel import SentinelGroup, closing
from ..support.servers import ServerBinary, key_slot_of
from ..support.waits import eventually, within

pytestmark = pytest.mark.real_only

NOTIFIED_BOUND = 1.0
"""Longest a candidate may take to get a resigned term when the notification wakes it;
without one it would wait for the term's expiry (the ttl, 10 s here)."""


def in_each_third(base: str) -> list[str]:
    """Three lock names, each in a slot served by another primary (slots split in three)."""
    names: list[str] = []
    for third in range(3):
        low, high = third * SLOTS // 3, (third + 1) * SLOTS // 3
        names.append(
            next(
                f"{base}:{third}:{i}"
                for i in range(100_000)
                if low <= key_slot_of(LockKeys.build("aiolock", f"{base}:{third}:{i}").lock) < high
            )
        )
    return names


async def hand_over_and_observe(
    first: Election, second: Election, watcher: Election, client: redis.asyncio.Redis | RedisCluster
) -> None:
    """`first` leads, `second` waits; `first` resigns and `second` leads at once; the
    watcher sees both terms, and nobody between them."""
    changes = watcher.observe()
    seen: list[Leader | None] = [await within(anext(changes), what="the observer's first")]

    async def observe() -> None:
        async for leader in changes:
            seen.append(leader)  # noqa: PERF401 - as they come, until cancelled

    observer = asyncio.create_task(observe())
    terms = first.campaign(value="first")
    try:
        term = await within(anext(terms), what="the first term")
        await terms.aclose()
        assert await first.leader() == await second.leader() != None
        second_terms = second.campaign()
        waiting = asyncio.create_task(anext(second_terms))
        await eventually(lambda: len(seen) >= 2, what="the first leader observed")

        async def queued() -> bool:
            return bool(await client.zcard(first.key + ":queue"))

        await eventually(queued, what="the second candidate queued in Redis")
        loop = asyncio.get_running_loop()
        resigned = loop.time()
        await term.resign()
        taken = await within(waiting, what="the second candidate's term")
        assert loop.time() - resigned < NOTIFIED_BOUND, "not handed over by the notification"
        assert taken.fencing_token > term.fencing_token
        await eventually(lambda: len(seen) >= 4, what="the hand-over observed")
        assert [None if s is None else (s.identity, s.fencing_token) for s in seen[:4]] == [
            None,
            (first.identity, term.fencing_token),
            None,
            (second.identity, taken.fencing_token),
        ]
        await taken.resign()
        await second_terms.aclose()
    finally:
        await terms.aclose()
        observer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await observer
        await changes.aclose()


# ------------------------------------------------------------------- cluster
@pytest.fixture
async def cluster(binaries: list[ServerBinary]) -> AsyncIterator[ClusterGroup]:
    with ClusterGroup(binaries[0]) as group:
        await group.create()
        yield group


async def test_elections_and_multilocks_on_a_cluster(cluster: ClusterGroup, name: str) -> None:
    clients: list[RedisCluster] = [cluster.client() for _ in range(3)]
    try:
        a, b, watcher = (
            Election(client, name, ttl=10, identity=who)
            for client, who in zip(clients, ("a", "b", "watcher"), strict=True)
        )
        await hand_over_and_observe(a, b, watcher, clients[0])
        # The command line reads the election from the node serving it.
        shown = await asyncio.to_thread(
            cli.main, ["--url", cluster.servers[0].url, "show", name, "--kind", "election"]
        )
        assert shown == 0

        # Names served by three primaries, held as one; a holder listing them in another
        # order waits for them all, then gets them all.
        names = in_each_third(name)
        held = await MultiLock(clients[0], names, ttl=10).acquire()
        assert set(held.fencing_tokens) == set(names)
        for lock_name in names:
            assert await Lock(clients[1], lock_name).locked()
        waiting = asyncio.create_task(MultiLock(clients[1], names[::-1], ttl=10).acquire())
        await asyncio.sleep(0.1)
        assert not waiting.done()
        await held.release()
        second = await within(waiting, what="the second MultiLock")
        assert second.names == tuple(sorted(names))
        await second.release()
        for lock_name in names:
            assert not await Lock(clients[0], lock_name).locked()
    finally:
        for client in clients:
            await client.aclose()


# ------------------------------------------------------------------- Sentinel
@pytest.fixture
async def group(binaries: list[ServerBinary]) -> AsyncIterator[SentinelGroup]:
    with SentinelGroup(binaries[0]) as group:
        await group.ready()
        yield group


async def test_an_election_and_a_multilock_over_sentinel(group: SentinelGroup, name: str) -> None:
    a, b, c = group.master_client(), group.master_client(), group.master_client()
    async with closing(a, b, c):
        await hand_over_and_observe(
            Election(a, name, ttl=10, identity="a", replicas=1),
            Election(b, name, ttl=10, identity="b", replicas=1),
            Election(c, name, identity="watcher"),
            c,
        )
        async with MultiLock(a, [f"{name}:x", f"{name}:y"], ttl=10, replicas=1) as held:
            assert held.held and len(held.fencing_tokens) == 2
