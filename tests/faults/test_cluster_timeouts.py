"""A timed acquire on a Redis Cluster whose slot migrates ends within its timeout, and says
why it did not get the name.

The migration is held open (the name's keys on both sides: every script naming several of
them is answered TRYAGAIN) for as long as the acquires run, so the scenario does not
depend on timing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiolock import AcquireTimeoutError, ReadWriteLock, Semaphore

from ..deployments.cluster import ClusterGroup
from ..support.load import scaled
from ..support.waits import within
from .test_cluster import cluster, contended

pytestmark = pytest.mark.real_only

__all__ = ("cluster",)

TIMEOUT = 1.0
MARGIN = 0.5
"""What a timed acquire may take beyond its timeout while a slot migrates (it took 2.0 s
for `timeout=1`: a try in flight at the bound was let run for up to a second more)."""


async def test_a_timed_acquire_of_a_free_name_whose_slot_migrates_ends_within_its_timeout(
    cluster: ClusterGroup, name: str
) -> None:
    """A semaphore's and a read-write lock's acquire (`timeout=1`) of a free name, while
    its slot's migration is held open: `AcquireTimeoutError` within the timeout plus a
    small margin, saying that the slot was migrating (not that the name was busy)."""
    async with cluster.clients(3) as (client, other, third):
        holder, waiting, keys, slot = await contended(client, other, name, ttl=10, timeout=30)
        _, target = await cluster.migration_of(slot)
        loop = asyncio.get_running_loop()
        ended: dict[str, tuple[float, BaseException | None]] = {}

        async def timed(what: str, acquire: Any) -> None:
            started = loop.time()
            try:
                lease = await acquire(timeout=TIMEOUT)
            except AcquireTimeoutError as error:
                ended[what] = (loop.time() - started, error)
            else:
                ended[what] = (loop.time() - started, None)
                await lease.release()

        async def held_open() -> None:
            await asyncio.gather(
                timed("semaphore", Semaphore(third, name, limit=2, ttl=10).acquire),
                timed("read", ReadWriteLock(third, name, ttl=10).read().acquire),
            )

        def the_state_first(found: list[str]) -> list[str]:
            return [key for key in found if key == keys.lock]

        await cluster.move_slot(slot, target, first=the_state_first, midway=held_open)
        await holder.release()
        await (await within(waiting, what="the queued waiter")).release()
    margin = scaled(MARGIN)  # (and the stalls of a loaded machine's event loop)
    problems = []
    for what, (took, error) in sorted(ended.items()):
        if took > TIMEOUT + margin:
            problems.append(f"{what}: {took:.3f}s for timeout={TIMEOUT:g}")
        said = str(error).replace(name, "NAME")  # (the test's name says "migrates")
        if not isinstance(error, AcquireTimeoutError) or "migrat" not in said:
            problems.append(f"{what}: {error!r} does not say the slot was migrating")
    assert sorted(ended) == ["read", "semaphore"]
    assert problems == []
