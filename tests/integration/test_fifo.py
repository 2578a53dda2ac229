"""Hand-off across processes: the waiter queue in Redis, reservations, withdrawal.

Each client stands for a process: it has its own notifier and its own wait queue id.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from aiolock import EventKind, Lease, Lock, add_listener, hold_stats
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import RESERVATION_MS, LockKeys
from aiolock._model.holder import text

from ..conftest import CommandLog, make_client
from ..support.load import scaled
from ..support.waits import eventually, within


@pytest.fixture
async def logged_pair(
    server_url: str, name: str
) -> AsyncIterator[tuple[redis.asyncio.Redis, redis.asyncio.Redis, list[CommandLog]]]:
    """Two processes' clients on one server, each logging its commands, scripts loaded (what
    the tests then count is the steady state)."""
    logs = [CommandLog(), CommandLog()]
    a, b = (make_client(server_url, log) for log in logs)
    try:
        for client in (a, b):
            await (await Lock(client, f"{name}:warm-up").acquire()).release()
        yield a, b, logs
    finally:
        await a.aclose()
        await b.aclose()


async def queued_in_redis(client: redis.asyncio.Redis, name: str, count: int) -> None:
    keys = LockKeys.build("aiolock", name)

    async def enough() -> bool:
        return await client.zcard(keys.queue) >= count

    await eventually(enough, what=f"{count} process(es) in the queue in Redis", interval=0.001)


async def test_waiting_processes_are_served_in_arrival_order(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    holder = await Lock(clients[0], name, ttl=10).acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        async with Lock(clients[i], name, ttl=10):
            order.append(i)

    tasks = []
    for i in (3, 1, 2):
        tasks.append(asyncio.create_task(waiter(i)))
        await queued_in_redis(clients[0], name, len(tasks))
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert order == [3, 1, 2]


async def later(seconds: float = 0.2) -> None:
    """Let time pass before the next waiter comes: the queue orders processes by when their
    oldest waiter came, as the server's clock puts it (a release's own waiter is placed by
    how long it has waited, which its latency makes look up to a round trip shorter), so a
    waiter meant to come later comes later by more than a release's latency, also on a
    loaded machine."""
    await asyncio.sleep(scaled(seconds))


async def local_waiters(client: redis.asyncio.Redis, name: str, count: int) -> None:
    channel = LockKeys.build("aiolock", name).channel

    def enough() -> bool:
        queue = runtime_for(client).notifier.queue_for(channel)
        return queue is not None and len(queue.waiters) >= count

    await eventually(enough, what=f"{count} waiter(s) in the process", interval=0.001)


async def test_the_oldest_waiter_of_any_process_is_served_first(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    # Process A's two tasks wait before process C's: when A's first task releases, A's
    # second has waited longest and goes next (in its own process, without a message),
    # although C's queue entry reached Redis before A's was put back in line.
    a, b, c = clients[:3]
    holder = await Lock(b, name, ttl=10).acquire()
    order: list[str] = []

    async def waiter(client: redis.asyncio.Redis, label: str) -> None:
        async with Lock(client, name, ttl=10):
            order.append(label)

    first = asyncio.create_task(waiter(a, "a1"))
    await queued_in_redis(b, name, 1)
    second = asyncio.create_task(waiter(a, "a2"))
    await local_waiters(a, name, 2)
    await later()
    third = asyncio.create_task(waiter(c, "c"))
    await queued_in_redis(b, name, 2)
    await holder.release()
    await within(asyncio.gather(first, second, third), what="every waiter served")
    assert order == ["a1", "a2", "c"]


async def test_a_release_puts_its_process_in_line_by_its_oldest_waiter(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    # A's first task waits, then C, then A's second task, then D. A's first task is
    # granted the lock, which takes A's queue out of Redis; its release hands the lock to
    # C and puts A's queue back in line in its second task's place: ahead of D's.
    a, b, c, d = clients[:4]
    holder = await Lock(b, name, ttl=10).acquire()
    order: list[str] = []
    gate = asyncio.Event()

    async def waiter(client: redis.asyncio.Redis, label: str) -> None:
        async with Lock(client, name, ttl=10):
            order.append(label)
            if label == "a1":
                await gate.wait()

    tasks = [asyncio.create_task(waiter(a, "a1"))]
    await queued_in_redis(b, name, 1)
    tasks.append(asyncio.create_task(waiter(c, "c")))
    await queued_in_redis(b, name, 2)
    tasks.append(asyncio.create_task(waiter(a, "a2")))
    await local_waiters(a, name, 2)
    await later()
    tasks.append(asyncio.create_task(waiter(d, "d")))
    await queued_in_redis(b, name, 3)
    await holder.release()
    await eventually(lambda: order == ["a1"], what="a1 holds", interval=0.001)
    gate.set()
    await within(asyncio.gather(*tasks), what="every waiter served")
    assert order == ["a1", "c", "a2", "d"]


async def test_a_released_lock_is_reserved_for_the_first_waiting_process(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    holder = await Lock(clients[0], name, ttl=10).acquire()
    first = asyncio.create_task(Lock(clients[1], name, ttl=10).acquire())
    await queued_in_redis(clients[0], name, 1)
    await holder.release()
    # Between the release and the claim, a newcomer cannot barge in.
    assert await Lock(clients[2], name, ttl=10).try_acquire() is None
    lease = await asyncio.wait_for(first, 5)
    await lease.release()


DEAD_QUEUE = "deadbeefdeadbeef"
DEAD_TOKEN = "ab" * 16


@pytest.mark.parametrize(
    ("tail", "left_as"),
    [
        pytest.param("gone 1", ("reserved", DEAD_QUEUE), id="reservation"),
        pytest.param(f"gone 1 1 1000 10000 {DEAD_TOKEN} t", ("token", DEAD_TOKEN), id="grant"),
    ],
)
async def test_a_crashed_waiters_entry_costs_one_reservation_at_most(
    clients: list[redis.asyncio.Redis], name: str, tail: str, left_as: tuple[str, str]
) -> None:
    keys = LockKeys.build("aiolock", name)
    holder = await Lock(clients[0], name, ttl=10).acquire()
    # A process that queued (with a grant token, or without) and then died: its entry is
    # still there, with time to live.
    now_ms = int((await clients[0].time())[0]) * 1000
    await clients[0].zadd(keys.queue, {DEAD_QUEUE: 1})
    await clients[0].hset(keys.waiters, DEAD_QUEUE, f"{now_ms + 60_000} 1 {tail}")
    live = asyncio.create_task(Lock(clients[1], name, ttl=10).acquire())
    await queued_in_redis(clients[0], name, 2)
    loop = asyncio.get_running_loop()
    released_at = loop.time()
    await holder.release()
    field, value = left_as
    assert await clients[0].hget(keys.lock, field) == value.encode()
    assert 0 < await clients[0].pttl(keys.lock) <= RESERVATION_MS
    lease = await asyncio.wait_for(live, 10)
    waited = loop.time() - released_at
    assert waited < RESERVATION_MS / 1000 + 1.0, "one lapsed reservation, then the live waiter"
    assert lease.fencing_token > holder.fencing_token
    await lease.release()


async def test_a_release_that_reserves_the_lock_for_this_process_wakes_its_head(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """A release that reserves the name for this process's queue instead of granting it
    (as the previous data layout's releases do; here its entry has no grant token): the
    head tries at once and takes the reservation, which lapses 1 s after the release. Its
    fencing token then follows the holder's, held ahead of the clock by the state the
    reservation keeps (a try after the lapse starts again from the clock).

    A run in which the waiter took longer than the reservation lasts (a loaded machine, or
    a head left to its poll timer) says nothing, and is run again."""
    for attempt in range(3):
        holder, lease, took = await _reserved_for_a_waiter(clients, f"{name}:{attempt}")
        await lease.release()
        if took < RESERVATION_MS / 1000:
            assert lease.fencing_token > holder.fencing_token
            return
    pytest.fail("the waiter took the lock only after the reservation lapsed, three times")


async def _reserved_for_a_waiter(
    clients: list[redis.asyncio.Redis], name: str
) -> tuple[Lease, Lease, float]:
    """The holder's lease (its fencing token ahead of the clock), the lease of the waiter
    that its release reserved the name for, and how long after the release it came."""
    keys = LockKeys.build("aiolock", name)
    await clients[0].hset(keys.lock, "fence", 4 * 10**15)  # exact in Lua (below 2**53)
    holder = await Lock(clients[0], name, ttl=30).acquire()
    waiting = asyncio.create_task(Lock(clients[1], name, ttl=30).acquire())
    await queued_in_redis(clients[0], name, 1)
    wid = text((await clients[0].zrange(keys.queue, 0, 0))[0])
    until_ms, count, host, pid, *_ = text(await clients[0].hget(keys.waiters, wid)).split(" ")
    await clients[0].hset(keys.waiters, wid, f"{until_ms} {count} {host} {pid}")
    loop = asyncio.get_running_loop()
    released = loop.time()
    await holder.release()
    lease = await within(waiting, what="the waiter, woken by the reservation")
    return holder, lease, loop.time() - released


async def test_a_waiter_that_gives_up_withdraws_from_the_queue(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    keys = LockKeys.build("aiolock", name)
    holder = await Lock(clients[0], name, ttl=10).acquire()
    with pytest.raises(TimeoutError):
        await Lock(clients[1], name, ttl=10).acquire(timeout=0.2)
    assert await clients[0].zcard(keys.queue) == 0
    await holder.release()
    assert not await Lock(clients[0], name).locked(), "nothing reserved for a queue that left"


async def test_a_cancelled_waiter_passes_on_a_grant_made_for_it(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    holder = await Lock(clients[0], name, ttl=10).acquire()
    first = asyncio.create_task(Lock(clients[1], name, ttl=10).acquire())
    await queued_in_redis(clients[0], name, 1)
    second = asyncio.create_task(Lock(clients[2], name, ttl=10).acquire())
    await queued_in_redis(clients[0], name, 2)
    notifier = runtime_for(clients[1]).notifier
    await holder.release()  # granted to the first queue...
    # ...which gives up before or while taking it: either its withdrawal passes the grant
    # on, or the abort of its claim releases the lock to the next queue.
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await within(first, what="the cancelled waiter to end")
    assert notifier.queue_length(LockKeys.build("aiolock", name).channel) == 0
    lease: Lease = await asyncio.wait_for(second, 5)
    await lease.release()


async def test_hold_durations_are_recorded(clients: list[redis.asyncio.Redis], name: str) -> None:
    keys = LockKeys.build("aiolock", name)
    for _ in range(3):
        async with Lock(clients[0], name, hold_stats=True):
            await asyncio.sleep(0.02)
    holds = [int(ms) for ms in await clients[0].lrange(keys.holds, 0, -1)]
    assert len(holds) == 3
    assert all(15 <= ms < 1000 for ms in holds)
    assert 0 < await clients[0].pttl(keys.holds) <= 86_400_000


async def test_the_hold_list_stays_between_100_and_150_entries(
    client: redis.asyncio.Redis, name: str
) -> None:
    """It is trimmed back to 100 every 50 holds, not at every release, and the statistics
    read the newest 100."""
    keys = LockKeys.build("aiolock", name)
    lock = Lock(client, name, ttl=5, hold_stats=True)
    lengths = []
    for _ in range(260):
        async with lock:
            pass
        lengths.append(await client.llen(keys.holds))
    assert lengths[:100] == list(range(1, 101))
    assert max(lengths) == 150 and min(lengths[100:]) == 100
    assert lengths[150] == 100  # the 151st hold trimmed the list
    assert 0 < await client.pttl(keys.holds) <= 86_400_000
    stats = await hold_stats(client, name)
    assert stats.count == 100


@pytest.mark.real_only
async def test_a_hand_off_between_processes_costs_one_release(
    logged_pair: tuple[redis.asyncio.Redis, redis.asyncio.Redis, list[CommandLog]], name: str
) -> None:
    a, b, logs = logged_pair
    holder = await Lock(a, name, ttl=10).acquire()
    waiting = asyncio.create_task(Lock(b, name, ttl=10).acquire())
    await queued_in_redis(a, name, 1)
    channel = LockKeys.build("aiolock", name).channel
    await eventually(
        lambda: runtime_for(b).notifier.is_subscribed(channel),
        what="the waiter subscribed",
        interval=0.001,
    )
    marks = [log.mark() for log in logs]
    await holder.release()
    lease = await asyncio.wait_for(waiting, 5)
    assert logs[0].since(marks[0]) == Counter({"EVALSHA release": 1})
    # The release granted the lock to the waiter's registered token, and said so on the
    # channel: the waiter holds it without an acquire. Its only command is the renewal of
    # the grant's short expiry to its ttl (by its text: EVAL), sent before its body runs,
    # not waited for.
    assert logs[1].since(marks[1]) == Counter({"EVAL renew_holder": 1})
    assert lease.held and lease.fencing_token > holder.fencing_token
    info = await Lock(a, name).info()
    assert info is not None and info.fencing_token == lease.fencing_token
    await lease.release()


# --------------------------------------------------------------------------- direct grants
async def test_a_granted_lease_is_renewed_to_its_full_ttl(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    keys = LockKeys.build("aiolock", name)
    holder = await Lock(clients[0], name, ttl=10).acquire()
    waiting = asyncio.create_task(Lock(clients[1], name, ttl=10).acquire())
    await queued_in_redis(clients[0], name, 1)
    renewed = asyncio.Event()
    remove = add_listener(lambda event: renewed.set() if event.kind is EventKind.RENEWED else None)
    try:
        await holder.release()
        lease = await asyncio.wait_for(waiting, 5)
        info = await Lock(clients[0], name).info()
        assert info is not None and info.fencing_token == lease.fencing_token
        assert info.ttl == 10  # the holder's record shows the lease's ttl, not the grant's
        # Granted with a short expiry (what a crashed grantee would cost), then renewed at
        # once to the lock's own ttl: the renewal was sent before acquire() returned.
        await asyncio.wait_for(renewed.wait(), 5)
        assert lease.remaining() > 9
        assert await clients[0].pttl(keys.lock) > 9000
        await lease.release()
    finally:
        remove()


@pytest.mark.real_only
async def test_a_grant_heard_of_too_late_is_claimed_by_an_acquire(
    logged_pair: tuple[redis.asyncio.Redis, redis.asyncio.Redis, list[CommandLog]], name: str
) -> None:
    a, b, logs = logged_pair
    holder = await Lock(a, name, ttl=10).acquire()
    start = logs[1].mark()
    waiting = asyncio.create_task(Lock(b, name, ttl=10).acquire())
    # Its try, SUBSCRIBE, and its try once subscribed (the last registration) are sent.
    await eventually(
        lambda: logs[1].since(start)["EVALSHA acquire"] >= 2,
        what="the waiter's second try (once subscribed)",
        interval=0.001,
    )
    await queued_in_redis(a, name, 1)
    # The waiter's process stalls: by the time it hears of the grant, more than half of the
    # grant's expiry has passed since it registered, so it cannot count on it.
    time.sleep(RESERVATION_MS / 1000 * 0.6)
    mark = logs[1].mark()
    await holder.release()
    lease = await asyncio.wait_for(waiting, 5)
    assert logs[1].since(mark) == Counter({"EVALSHA acquire": 1})
    assert lease.remaining() > 9  # the claim set the lock's own ttl
    assert await a.pttl(LockKeys.build("aiolock", name).lock) > 9000
    await lease.release()


async def test_a_lock_that_does_not_renew_claims_its_grant_with_its_ttl(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    holder = await Lock(clients[0], name, ttl=10).acquire()
    waiting = asyncio.create_task(Lock(clients[1], name, ttl=10, renew=False).acquire())
    await queued_in_redis(clients[0], name, 1)
    await holder.release()
    lease = await asyncio.wait_for(waiting, 5)
    assert lease.remaining() > 9
    assert await clients[0].pttl(LockKeys.build("aiolock", name).lock) > 9000
    await lease.release()


async def test_an_entry_without_a_grant_token_gets_a_reservation(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """Entries as written by processes that do not register a token are still served."""
    keys = LockKeys.build("aiolock", name)
    holder = await Lock(clients[0], name, ttl=10).acquire()
    now_ms = int((await clients[0].time())[0]) * 1000
    await clients[0].zadd(keys.queue, {"0123456789abcdef": 1})
    await clients[0].hset(keys.waiters, "0123456789abcdef", f"{now_ms + 60_000} 1 old-host 42")
    await clients[0].hset(keys.lock, "q", 1)  # as a queued process of this version says
    await holder.release()
    assert await clients[0].hget(keys.lock, "reserved") == b"0123456789abcdef"
    assert 0 < await clients[0].pttl(keys.lock) <= RESERVATION_MS
    assert await Lock(clients[1], name, ttl=10).try_acquire() is None  # no barging in
