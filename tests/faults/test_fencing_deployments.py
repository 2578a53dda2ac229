"""Fenced storage (`fenced_set`, `fenced_get`, `fenced_delete`) on the deployments of
docs/deployments.md, over real processes: a Redis Cluster (keys on every primary, a
resharding of a key's slot, a failover of its primary) and Sentinel (a failover that keeps
the highest token, and the documented limit: one that loses the last write loses its
highest token with it).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from aiolock import FencedValue, fenced_delete, fenced_get, fenced_set

from ..deployments.cluster import SLOTS, ClusterGroup, _is_primary
from ..deployments.sentinel import SentinelGroup, _ask, closing
from ..support.servers import ServerBinary, key_slot_of

pytestmark = pytest.mark.real_only


@pytest.fixture
async def cluster(binaries: list[ServerBinary]) -> AsyncIterator[ClusterGroup]:
    with ClusterGroup(binaries[0]) as group:
        await group.create()
        yield group


def keys_in_thirds(base: str) -> list[str]:
    """A key in each third of the slots: one on each primary."""
    found: list[str] = []
    for third in range(3):
        low, high = third * SLOTS // 3, (third + 1) * SLOTS // 3
        found.append(
            next(
                f"{base}:{third}:{i}"
                for i in range(100_000)
                if low <= key_slot_of(f"{base}:{third}:{i}") < high
            )
        )
    return found


async def test_fenced_keys_on_every_primary_through_a_resharding_and_a_failover(
    cluster: ClusterGroup, name: str
) -> None:
    """Any key name works (no hash tag needed: the token is in the key itself). A slot
    moved to another primary, and a primary failed over to its replica, keep the highest
    token: a late write with a lower one is still refused there."""
    client = cluster.client()
    try:
        keys = keys_in_thirds(name)
        for key in keys:
            assert await fenced_set(client, key, "v", 10, ttl=60)
            assert await fenced_set(client, key, "w", 11, ttl=60)
            assert not await fenced_set(client, key, "late", 10)
            assert await fenced_get(client, key) == FencedValue(value=b"w", fencing_token=11)
        owners = {await cluster.owner(key_slot_of(key)) for key in keys}
        assert len(owners) == 3

        moved, failed_over, deleted = keys
        source = await cluster.owner(key_slot_of(moved))
        target = next(s for s in owners if s is not source)
        await cluster.move_slot(key_slot_of(moved), target)
        assert await cluster.owner(key_slot_of(moved)) is target
        assert not await fenced_set(client, moved, "late", 10)
        assert await fenced_set(client, moved, "after the move", 12)
        assert await fenced_get(client, moved) == FencedValue(
            value=b"after the move", fencing_token=12
        )

        old = await cluster.owner(key_slot_of(failed_over))
        new = await cluster.fail_over(key_slot_of(failed_over))
        assert new is not old and await _is_primary(new)
        assert not await fenced_set(client, failed_over, "late", 10)
        assert await fenced_get(client, failed_over) == FencedValue(value=b"w", fencing_token=11)

        assert await fenced_delete(client, deleted, 13, keep=30)
        assert not await fenced_set(client, deleted, "late", 11)
        assert await fenced_get(client, deleted) == FencedValue(value=None, fencing_token=13)
    finally:
        await client.aclose()


@pytest.fixture
async def sentinel(binaries: list[ServerBinary]) -> AsyncIterator[SentinelGroup]:
    with SentinelGroup(binaries[0]) as group:
        await group.ready()
        yield group


@contextlib.asynccontextmanager
async def master_client(group: SentinelGroup) -> AsyncIterator[redis.asyncio.Redis]:
    """`master_for`'s client, closed on the way out with its Sentinel's connections."""
    client = group.master_client()
    async with closing(client):
        yield client


async def test_a_failover_that_replicated_the_writes_keeps_the_highest_token(
    sentinel: SentinelGroup, name: str
) -> None:
    key = f"{name}:data"
    async with master_client(sentinel) as client:
        assert await fenced_set(client, key, "A", 10)
        assert await fenced_set(client, key, "B", 20)
        await sentinel.replicated()
        await sentinel.failover()
        assert not await fenced_set(client, key, "A, late", 10)  # on the new master
        assert await fenced_get(client, key) == FencedValue(value=b"B", fencing_token=20)


async def test_a_failover_that_loses_the_last_write_loses_its_highest_token(
    sentinel: SentinelGroup, name: str
) -> None:
    """The documented limit: replication is asynchronous, so the last write may never
    reach the replica that is promoted (simulated by putting the replica's copy back as
    it was before that write). Its value and its token are lost together, and a late
    write with the older token is then accepted."""
    key = f"{name}:data"
    assert sentinel.replica is not None
    replica = sentinel.replica
    async with master_client(sentinel) as client:
        assert await fenced_set(client, key, "A", 10)
        assert await fenced_set(client, key, "B", 20)
        await sentinel.replicated()
        await _ask(replica.port, "CONFIG", "SET", "replica-read-only", "no")
        await _ask(replica.port, "HSET", key, "value", "A", "fence", "10")  # B's write lost
        await sentinel.failover()
        assert await fenced_get(client, key) == FencedValue(value=b"A", fencing_token=10)
        assert await fenced_set(client, key, "A, late", 10)
