"""`Semaphore.acquire(permits=n)`: a lease of several permits, taken all at once, held in n
slots, renewed and released together; the oldest refused request keeps later ones from
the permits freed (no starvation behind single permits); limits changed under it; bad
input refused.

Each client stands for a process (its own notifier and wait queue).
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio

from aiolock import AcquireTimeoutError, ConfigError, LeaseLostError, Semaphore
from aiolock._lua.layout import LockKeys, permits_key
from aiolock.testing import expire_now

from ..conftest import CommandLog
from ..support.waits import eventually, within


def state_key(name: str) -> str:
    return LockKeys.build("aiolock", name, "sem:").lock


async def permit_fields(client: redis.asyncio.Redis, name: str) -> dict[str, str]:
    fields = await client.hgetall(state_key(name))
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in fields.items()
        if (k.decode() if isinstance(k, bytes) else k).startswith("p:")
    }


async def test_a_lease_of_n_permits_holds_n_slots_and_counts_n(
    client: redis.asyncio.Redis, name: str
) -> None:
    semaphore = Semaphore(client, name, limit=8, ttl=10)
    lease = await semaphore.acquire(permits=3)
    assert lease.permits == 3
    fields = await permit_fields(client, name)
    # One field per permit: the first under the token, the others under "<token>~k".
    assert sorted(fields) == sorted(
        [f"p:{lease.token}", f"p:{lease.token}~2", f"p:{lease.token}~3"]
    )
    slots = sorted(int(value.split(" ", 1)[0]) for value in fields.values())
    assert slots == [0, 1, 2] and lease.slot == 0
    assert await client.zcard(permits_key(state_key(name))) == 3
    info = await semaphore.info()
    assert [(h.permits, h.slots) for h in info.holders] == [(3, (0, 1, 2))]
    assert info.held == 3 and info.free == 5
    # Five more fit, a sixth does not: the lease counts three.
    others = [await semaphore.acquire(timeout=0) for _ in range(5)]
    assert await semaphore.try_acquire() is None
    assert await semaphore.try_acquire(permits=2) is None
    await lease.release()
    assert await permit_fields(client, name) == {
        f"p:{other.token}": (await permit_fields(client, name))[f"p:{other.token}"]
        for other in others
    }
    # Its three permits are free again: three single permits fit, a fourth does not.
    again = [await semaphore.acquire(timeout=0) for _ in range(3)]
    assert await semaphore.try_acquire() is None
    for held in (*others, *again):
        await held.release()
    assert (await semaphore.info()).holders == ()


async def test_renewals_keep_every_permit_of_the_lease(
    client: redis.asyncio.Redis, name: str
) -> None:
    """The watchdog renews the extra permits with the first (RENEW's 'ps<n>'): past several
    ttls, the lease still counts n and holds its fields."""
    semaphore = Semaphore(client, name, limit=4, ttl=1, renew_interval=0.2)
    lease = await semaphore.acquire(permits=4)
    expires = {
        field: int(value.split(" ")[1])
        for field, value in (await permit_fields(client, name)).items()
    }

    async def renewed() -> bool:
        now = await permit_fields(client, name)
        return len(now) == 4 and all(
            int(value.split(" ")[1]) > expires[field] + 1500 for field, value in now.items()
        )

    await eventually(renewed, what="every permit renewed past two ttls", interval=0.05)
    assert lease.held and await semaphore.try_acquire() is None
    await lease.release()
    assert await permit_fields(client, name) == {}


async def test_extend_renews_every_permit(client: redis.asyncio.Redis, name: str) -> None:
    semaphore = Semaphore(client, name, limit=3, ttl=5, renew=False)
    lease = await semaphore.acquire(permits=3)
    await lease.extend(60)
    fields = await permit_fields(client, name)
    ttls = {int(value.split(" ")[1]) - int(value.split(" ")[3]) for value in fields.values()}
    assert len(fields) == 3 and min(ttls) > 50_000
    await lease.release()


async def test_resume_takes_over_every_permit(client: redis.asyncio.Redis, name: str) -> None:
    semaphore = Semaphore(client, name, limit=5, ttl=10)
    lease = await semaphore.acquire(permits=3)
    taken = await Semaphore(client, name, limit=5, ttl=10).resume(lease.token)
    assert taken.permits == 3 and taken.slot == lease.slot
    await taken.release()
    assert await permit_fields(client, name) == {}
    await lease.release()  # the token was released: reported as its own, no error


async def test_permits_out_of_range_are_refused_before_anything_is_sent(
    client: redis.asyncio.Redis, name: str, commands: CommandLog
) -> None:
    semaphore = Semaphore(client, name, limit=3)
    for bad in (0, -1, 10_001):
        with pytest.raises(ConfigError, match=r"permits must be an int from 1 to 10000"):
            await semaphore.acquire(permits=bad)
        with pytest.raises(ConfigError, match="permits"):
            await semaphore.try_acquire(permits=bad)
    with pytest.raises(TypeError, match="permits must be an int"):
        await semaphore.acquire(permits=2.0)  # type: ignore[arg-type]
    assert await client.exists(state_key(name)) == 0


async def test_more_permits_than_the_limit_in_force_are_refused_holding_nothing(
    client: redis.asyncio.Redis, name: str
) -> None:
    holder = await Semaphore(client, name, limit=3).acquire()
    # The limit in force is the stored one (3), not this object's (10).
    semaphore = Semaphore(client, name, limit=10)
    with pytest.raises(ConfigError, match=r"limit in force of semaphore .*, 3; got 4"):
        await semaphore.acquire(permits=4, timeout=1)
    assert list(await permit_fields(client, name)) == [f"p:{holder.token}"]
    two = await semaphore.acquire(permits=2, timeout=0)
    await two.release()
    await holder.release()


async def test_a_request_for_several_permits_is_not_starved_by_single_ones(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """The policy: the first request for several permits that is refused keeps every later
    request from the permits freed until it has its own. Single permits keep coming (each
    taken as another is released, so one is always free for them without the barrier):
    the large request still gets its permits."""
    small, large = (Semaphore(c, name, limit=4, ttl=10) for c in clients[:2])
    held = [await small.acquire() for _ in range(3)]  # one free, the large one needs 3
    big = asyncio.create_task(large.acquire(permits=3, timeout=30))

    async def barrier_up() -> bool:
        return await clients[0].hexists(state_key(name), "w")

    await eventually(barrier_up, what="the large request refused", interval=0.005)
    # A stream of single permits: each newcomer would fit (one is free), yet none gets
    # in while the large request waits.
    for _ in range(3):
        assert await small.try_acquire() is None
        await held.pop(0).release()
    lease = await within(big, what="the large request served")
    assert lease.permits == 3
    assert (await small.info()).held == 3
    await lease.release()
    assert not await clients[0].hexists(state_key(name), "w")


async def test_single_permits_get_in_again_once_the_large_request_gives_up(
    client: redis.asyncio.Redis, name: str
) -> None:
    semaphore = Semaphore(client, name, limit=3, ttl=10)
    held = await semaphore.acquire(permits=2)
    with pytest.raises(AcquireTimeoutError):
        await semaphore.acquire(permits=2, timeout=0.2)
    # Its timeout ended the barrier at once (not BARRIER_MS later).
    assert not await client.hexists(state_key(name), "w")
    single = await semaphore.try_acquire()
    assert single is not None
    await single.release()
    await held.release()


async def test_queued_single_waiters_wait_behind_the_large_request(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """A waiter that queued after the large request is not granted a permit freed while
    the large request waits: the permits freed go to the large request first."""
    first, second, third = (Semaphore(c, name, limit=2, ttl=10) for c in clients[:3])
    a, b = await first.acquire(), await first.acquire()
    big = asyncio.create_task(second.acquire(permits=2, timeout=30))

    async def barrier_up() -> bool:
        return await clients[0].hexists(state_key(name), "w")

    await eventually(barrier_up, what="the large request refused", interval=0.005)
    late = asyncio.create_task(third.acquire(timeout=30))

    async def late_queued() -> bool:
        # (the large request has an entry of its own: see SEM_ACQUIRE_SEVERAL)
        return await clients[0].zcard(LockKeys.build("aiolock", name, "sem:").queue) >= 2

    await eventually(late_queued, what="the single waiter queued", interval=0.005)
    await a.release()
    await b.release()
    lease = await within(big, what="the large request served first")
    assert not late.done()
    await lease.release()
    single = await within(late, what="the single waiter served next")
    await single.release()


async def test_a_lowered_limit_keeps_a_lease_of_several_permits_and_counts_it(
    client: redis.asyncio.Redis, name: str
) -> None:
    semaphore = Semaphore(client, name, limit=6, ttl=10)
    lease = await semaphore.acquire(permits=4)
    assert await semaphore.set_limit(3) == 6
    info = await semaphore.info()
    assert info.held == 4 and info.free == 0 and lease.held
    assert await semaphore.try_acquire() is None
    await lease.release()
    three = await semaphore.acquire(permits=3, timeout=0)
    assert await semaphore.try_acquire() is None
    assert await semaphore.set_limit(5) == 3
    two = await semaphore.acquire(permits=2, timeout=0)
    assert (await semaphore.info()).held == 5
    await three.release()
    await two.release()


async def test_a_raised_limit_lets_the_waiting_large_request_in(
    client: redis.asyncio.Redis, name: str
) -> None:
    semaphore = Semaphore(client, name, limit=2, ttl=10)
    held = await semaphore.acquire(permits=2)
    with pytest.raises(ConfigError, match="limit in force"):
        await semaphore.acquire(permits=3, timeout=30)
    await semaphore.set_limit(5)
    lease = await within(semaphore.acquire(permits=3, timeout=30), what="the large request served")
    assert (await semaphore.info()).held == 5
    await lease.release()
    await held.release()


async def test_a_lease_that_lost_one_of_its_permits_is_not_renewed(
    client: redis.asyncio.Redis, name: str
) -> None:
    """Its permits expire together; one that expired alone (here by `expire_now`) is
    freed for the others, and the lease is lost: renewed, it would count a permit it no
    longer holds."""
    semaphore = Semaphore(client, name, limit=3, ttl=30, renew=False)
    lease = await semaphore.acquire(permits=3)
    assert await expire_now(client, semaphore, slot=2)
    with pytest.raises(LeaseLostError):
        await lease.extend(30)
    single = await semaphore.acquire(timeout=0)  # the expired slot, reaped
    assert single.slot == 2
    await single.release()


async def test_a_waiter_queued_before_the_large_request_is_served_before_it(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """First come, first served across sizes: the barrier keeps out only the requests that
    came after it."""
    holder, early, large = (Semaphore(c, name, limit=2, ttl=10) for c in clients[:3])
    a, b = await holder.acquire(), await holder.acquire()
    first = asyncio.create_task(early.acquire(timeout=30))

    async def queued() -> bool:
        return await clients[0].zcard(LockKeys.build("aiolock", name, "sem:").queue) >= 1

    await eventually(queued, what="the single waiter queued", interval=0.005)
    big = asyncio.create_task(large.acquire(permits=2, timeout=30))

    async def barrier_up() -> bool:
        return await clients[0].hexists(state_key(name), "w")

    await eventually(barrier_up, what="the large request refused", interval=0.005)
    await a.release()
    single = await within(first, what="the earlier single waiter served first")
    assert not big.done()
    await b.release()
    await single.release()
    lease = await within(big, what="the large request served next")
    assert lease.permits == 2
    await lease.release()


async def test_a_cancelled_large_request_stops_keeping_the_others_out_at_once(
    client: redis.asyncio.Redis, name: str
) -> None:
    semaphore = Semaphore(client, name, limit=3, ttl=10)
    held = await semaphore.acquire(permits=2)
    big = asyncio.create_task(semaphore.acquire(permits=2, timeout=60))

    async def parked() -> bool:
        fields = await permit_fields(client, name)
        return await client.hexists(state_key(name), "w") and any("~w" in f for f in fields)

    await eventually(parked, what="the free permit parked for the large request", interval=0.005)
    big.cancel()
    with pytest.raises(asyncio.CancelledError):
        await big
    # Its barrier and the permit parked for it are gone: a single permit gets in at once.
    assert not await client.hexists(state_key(name), "w")
    single = await semaphore.try_acquire()
    assert single is not None
    await single.release()
    await held.release()


@pytest.mark.parametrize("wait", [0, 0.3], ids=["try", "wait"])
async def test_several_permits_asked_under_the_token_of_a_permit_that_expired(
    client: redis.asyncio.Redis, name: str, wait: float
) -> None:
    """Slot 0's permit expired (its holder stopped renewing) under token A, slot 1 is held:
    a request for 2 permits with token A is refused as one with a fresh token is (a
    timeout), where the script raised "no free slot below the limit" after writing part of
    its effect; the semaphore then serves as before."""
    semaphore = Semaphore(client, name, limit=2, ttl=10)
    first = await semaphore.acquire()
    second = await semaphore.acquire()
    assert (first.slot, second.slot) == (0, 1)
    assert await expire_now(client, semaphore, slot=0)
    with pytest.raises(LeaseLostError):
        await first.release()
    with pytest.raises(AcquireTimeoutError):
        await semaphore.acquire(permits=2, timeout=wait, token=first.token)
    await second.release()
    both = await semaphore.acquire(permits=2, timeout=5)
    assert both.permits == 2
    await both.release()
    assert (await semaphore.info()).held == 0
