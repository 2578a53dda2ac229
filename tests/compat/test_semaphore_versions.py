"""A semaphore shared by processes of this version and of the version before the permits'
index (its scripts in `semaphore_before_index`), as during a rolling upgrade: never more
permits live than the limit, never two in one slot, and each side gets a permit whenever
one is free (the index notices what the older scripts did: `aiolock._lua.permit_index`)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid

import pytest
import redis.asyncio

from aiolock import Lease, LeaseLostError, Semaphore
from aiolock._lua.layout import LockKeys, permits_key
from aiolock._lua.lease import RENEW
from aiolock.testing import expire_now

from ..support.waits import eventually, within
from . import semaphore_before_index as before
from . import semaphore_before_weights as weights_before

pytestmark = pytest.mark.real_only

LIMIT = 3
TTL_MS = 30_000


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def live_slots(client: redis.asyncio.Redis, key: str) -> list[int]:
    """The slots of the permits live now, read from their fields (what every version reads)."""
    seconds, micros = await client.time()
    now_ms = seconds * 1000 + micros // 1000
    slots = []
    for field, value in (await client.hgetall(key)).items():
        if text(field).startswith("p:"):
            slot, expires = text(value).split()[:2]
            if int(expires) > now_ms:
                slots.append(int(slot))
    return slots


async def test_old_and_new_processes_never_exceed_the_limit_together(
    client: redis.asyncio.Redis, name: str
) -> None:
    keys = LockKeys.build("aiolock", name, "sem:")
    semaphore = Semaphore(client, name, limit=LIMIT, ttl=TTL_MS / 1000, renew=False)
    rng = random.Random(20261126)
    new_held: list[Lease] = []
    old_held: list[str] = []

    async def old_acquire() -> bool:
        token = uuid.uuid4().hex
        args = before.sem_acquire_args(token, TTL_MS, "old-host 1 old-task", LIMIT)
        reply = await client.eval(before.SEM_ACQUIRE.source, 3, *keys.scripts[:3], *args)
        if int(reply[0]) == 1:
            old_held.append(token)
            return True
        return False

    async def old_release() -> None:
        token = old_held.pop(rng.randrange(len(old_held)))
        await client.eval(before.SEM_RELEASE.source, 4, *keys.scripts, token)

    async def old_renew() -> None:
        token = rng.choice(old_held)
        await client.eval(RENEW.source, 1, keys.lock, token, TTL_MS, "p")

    async def new_acquire() -> bool:
        lease = await semaphore.try_acquire()
        if lease is not None:
            new_held.append(lease)
        return lease is not None

    async def new_release() -> None:
        lease = new_held.pop(rng.randrange(len(new_held)))
        with contextlib.suppress(LeaseLostError):  # lapsed meanwhile
            await lease.release()

    async def lapse() -> None:
        """A permit of either side reaches its expiry unrenewed."""
        slots = await live_slots(client, keys.lock)
        if slots:
            await expire_now(client, semaphore, slot=rng.choice(slots))

    for step in range(400):
        free = LIMIT - len(await live_slots(client, keys.lock))
        action = rng.choice(["old", "new", "old", "new", "release", "renew", "lapse"])
        if action == "old":
            assert await old_acquire() == (free > 0), f"step {step}: old acquire, {free} free"
        elif action == "new":
            assert await new_acquire() == (free > 0), f"step {step}: new acquire, {free} free"
        elif action == "release" and (old_held or new_held):
            if old_held and (not new_held or rng.random() < 0.5):
                await old_release()
            else:
                await new_release()
        elif action == "renew" and old_held:
            await old_renew()
        elif action == "lapse":
            await lapse()
        slots = await live_slots(client, keys.lock)
        assert len(slots) <= LIMIT, f"step {step} ({action}): {len(slots)} permits live"
        assert len(set(slots)) == len(slots), f"step {step} ({action}): a slot held twice"
        assert all(slot < LIMIT for slot in slots), f"step {step} ({action}): {slots}"

    for lease in new_held:
        with contextlib.suppress(LeaseLostError):
            await lease.release()
    for token in old_held:
        await client.eval(before.SEM_RELEASE.source, 4, *keys.scripts, token)
    # Everything given back: this version takes every permit again.
    taken = [await semaphore.try_acquire() for _ in range(LIMIT)]
    leases = [lease for lease in taken if lease is not None]
    assert len(leases) == LIMIT
    assert sorted(lease.slot or 0 for lease in leases) == [0, 1, 2]
    for lease in leases:
        await lease.release()


async def test_each_change_an_older_process_makes_is_seen_at_once(
    client: redis.asyncio.Redis, name: str
) -> None:
    """Its acquire (a permit the index lacks), its release (a permit the index still
    counts) and its renewal (an expiry the index has not seen), one at a time."""
    keys = LockKeys.build("aiolock", name, "sem:")
    semaphore = Semaphore(client, name, limit=2, ttl=TTL_MS / 1000, renew=False)

    async def old_acquire(token: str, ttl_ms: int = TTL_MS) -> int:
        args = before.sem_acquire_args(token, ttl_ms, "old-host 1 old-task", 2)
        reply = await client.eval(before.SEM_ACQUIRE.source, 3, *keys.scripts[:3], *args)
        return int(reply[0])

    first = await semaphore.try_acquire()
    assert first is not None and first.slot == 0
    # An older process takes the second permit: this version sees the semaphore full.
    old = uuid.uuid4().hex
    assert await old_acquire(old) == 1
    assert await semaphore.try_acquire() is None
    # It gives it back: this version takes it at once, in its slot.
    await client.eval(before.SEM_RELEASE.source, 4, *keys.scripts, old)
    second = await semaphore.try_acquire()
    assert second is not None and second.slot == 1
    await second.release()
    # An older permit with a short ttl, renewed by its process for longer: when its first
    # expiry has passed, this version finds it renewed, and does not take its slot.
    short = uuid.uuid4().hex
    assert await old_acquire(short, ttl_ms=200) == 1
    assert await semaphore.try_acquire() is None  # indexed, with its 200 ms expiry
    await client.eval(RENEW.source, 1, keys.lock, short, TTL_MS, "p")
    seconds, micros = await client.time()
    until = seconds + (micros + 300_000) / 1e6
    while True:  # the server's clock past the permit's first expiry (bounded: 300 ms)
        seconds, micros = await client.time()
        if seconds + micros / 1e6 > until:
            break
    assert await semaphore.try_acquire() is None, "a renewed permit's slot was taken"
    assert sorted(await live_slots(client, keys.lock)) == [0, 1]
    await first.release()


# ------------------------------------------------- beside the version before weighted leases
async def lease_slots(client: redis.asyncio.Redis, key: str, token: str) -> tuple[int, ...]:
    """The slots of the lease under `token` (its permits' fields, `p:<token>~k` too)."""
    fields = await client.hgetall(key)
    return tuple(
        sorted(
            int(text(value).split()[0])
            for field, value in fields.items()
            if text(field) == f"p:{token}" or text(field).startswith(f"p:{token}~")
        )
    )


async def test_older_single_permits_and_leases_of_several_never_exceed_the_limit(
    client: redis.asyncio.Redis, name: str
) -> None:
    """Processes of the version before leases of several permits take single permits with
    their scripts (`semaphore_before_weights`), this version's leases of 1 to 3 permits:
    the older scripts count each lease's n permits (n fields, n slots in the index), so
    together they never hold more than the limit, and each side gets what is free."""
    limit = 5
    keys = LockKeys.build("aiolock", name, "sem:")
    script_keys = (*keys.scripts, permits_key(keys.lock))
    semaphore = Semaphore(client, name, limit=limit, ttl=TTL_MS / 1000, renew=False)
    rng = random.Random(20261206)
    new_held: list[Lease] = []
    old_held: list[str] = []

    async def old_acquire() -> bool:
        token = uuid.uuid4().hex
        args = weights_before.sem_acquire_args(token, TTL_MS, "old-host 1 old-task", limit)
        reply = await client.eval(weights_before.SEM_ACQUIRE.source, 5, *script_keys, *args)
        if int(reply[0]) == 1:
            old_held.append(token)
            return True
        return False

    async def old_release() -> None:
        token = old_held.pop(rng.randrange(len(old_held)))
        await client.eval(weights_before.SEM_RELEASE.source, 5, *script_keys, token)

    async def new_release() -> None:
        lease = new_held.pop(rng.randrange(len(new_held)))
        with contextlib.suppress(LeaseLostError):  # lapsed meanwhile
            await lease.release()

    async def lapse() -> None:
        """A lease of either side reaches its expiry unrenewed (every permit of it)."""
        if new_held and (not old_held or rng.random() < 0.5):
            lease = rng.choice(new_held)
            for slot in await lease_slots(client, keys.lock, lease.token):
                await expire_now(client, semaphore, slot=slot)
        elif old_held:
            for slot in await lease_slots(client, keys.lock, rng.choice(old_held)):
                await expire_now(client, semaphore, slot=slot)

    for step in range(500):
        free = limit - len(await live_slots(client, keys.lock))
        action = rng.choice(["old", "new", "old", "new", "release", "renew", "lapse"])
        if action == "old":
            assert await old_acquire() == (free > 0), f"step {step}: old acquire, {free} free"
        elif action == "new":
            permits = rng.randint(1, 3)
            lease = await semaphore.try_acquire(permits=permits)
            assert (lease is not None) == (free >= permits), f"step {step}: {permits}, {free}"
            if lease is not None:
                new_held.append(lease)
        elif action == "release" and (old_held or new_held):
            if old_held and (not new_held or rng.random() < 0.5):
                await old_release()
            else:
                await new_release()
        elif action == "renew" and old_held:
            await client.eval(RENEW.source, 1, keys.lock, rng.choice(old_held), TTL_MS, "ps")
        elif action == "lapse":
            await lapse()
        slots = await live_slots(client, keys.lock)
        assert len(slots) <= limit, f"step {step} ({action}): {len(slots)} permits live"
        assert len(set(slots)) == len(slots), f"step {step} ({action}): a slot held twice"
        assert all(slot < limit for slot in slots), f"step {step} ({action}): {slots}"

    for lease in new_held:
        with contextlib.suppress(LeaseLostError):
            await lease.release()
    for token in old_held:
        await client.eval(weights_before.SEM_RELEASE.source, 5, *script_keys, token)
    # Everything given back: one lease takes every permit.
    whole = await semaphore.acquire(permits=limit, timeout=0)
    assert sorted(await lease_slots(client, keys.lock, whole.token)) == list(range(limit))
    await whole.release()


async def test_a_waiting_lease_of_several_permits_beside_older_processes(
    client: redis.asyncio.Redis, name: str
) -> None:
    """The older scripts do not know the barrier of a waiting request for several permits,
    but they count the permits parked for it (fields of their own): they cannot take them,
    and the request gets its permits once enough are free."""
    limit = 3
    keys = LockKeys.build("aiolock", name, "sem:")
    script_keys = (*keys.scripts, permits_key(keys.lock))
    semaphore = Semaphore(client, name, limit=limit, ttl=TTL_MS / 1000)

    async def old_acquire() -> str | None:
        token = uuid.uuid4().hex
        args = weights_before.sem_acquire_args(token, TTL_MS, "old-host 1 old-task", limit)
        reply = await client.eval(weights_before.SEM_ACQUIRE.source, 5, *script_keys, *args)
        return token if int(reply[0]) == 1 else None

    first, second = await old_acquire(), await old_acquire()
    assert first and second
    big = asyncio.create_task(semaphore.acquire(permits=2, timeout=60))

    async def barrier_up() -> bool:
        return bool(await client.hexists(keys.lock, "w"))

    await eventually(barrier_up, what="the request for two permits refused", interval=0.005)
    # The one permit free is parked for it: neither version takes it.
    assert await semaphore.try_acquire() is None
    assert await old_acquire() is None
    assert len(await live_slots(client, keys.lock)) == limit
    waiting = [h for h in (await semaphore.info()).holders if h.fencing_token == 0]
    assert [h.permits for h in waiting] == [1]
    await client.eval(weights_before.SEM_RELEASE.source, 5, *script_keys, first)
    lease = await within(big, what="the request for two permits served")
    assert lease.permits == 2 and len(await live_slots(client, keys.lock)) == limit
    await lease.release()
    await client.eval(weights_before.SEM_RELEASE.source, 5, *script_keys, second)
    assert await live_slots(client, keys.lock) == []
