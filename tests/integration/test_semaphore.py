"""`Semaphore`: at most `limit` holders, the limit in Redis, FIFO permits, leases like a lock's.

Each client stands for a process (its own notifier and wait queue); tests across real
processes are in `tests/faults/test_semaphore_processes.py`.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest
import redis.asyncio

from aiolock import ConfigError, Lease, LeaseLostError, Lock, LossReason, Semaphore
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys, permits_key

from ..conftest import CommandLog, make_client
from ..support.load import scaled
from ..support.servers import server_ms
from ..support.waits import eventually, until_cancelled, within

KEYS = "sem:"


def keys_of(name: str) -> LockKeys:
    return LockKeys.build("aiolock", name, KEYS)


async def queued_in_redis(client: redis.asyncio.Redis, name: str, count: int) -> None:
    async def enough() -> bool:
        return await client.zcard(keys_of(name).queue) >= count

    await eventually(enough, what=f"{count} process(es) in the queue in Redis", interval=0.001)


# ----------------------------------------------------------------------------- the limit
async def every_permit_free(semaphore: Semaphore) -> None:
    """Wait until no permit is held. A permit the last release reserved for this process's
    queue is given back by the queue's withdrawal, sent in the background once its last
    waiter has left (or lapses within RESERVATION_MS): the state may list it for a moment
    after the last waiter is done."""

    async def free() -> bool:
        return (await semaphore.info()).holders == ()

    await eventually(free, what="every permit free", interval=0.01)


async def test_at_most_limit_tasks_hold_permits_at_once(
    client: redis.asyncio.Redis, name: str
) -> None:
    semaphore = Semaphore(client, name, limit=3, ttl=10)
    running: set[int] = set()
    most = 0
    entered: list[tuple[int, int]] = []  # (fencing token, slot), in the order entered

    async def worker() -> None:
        nonlocal most
        for _ in range(3):
            async with semaphore as permit:
                assert permit.slot is not None
                assert permit.slot not in running, "two permits held in one slot"
                running.add(permit.slot)
                most = max(most, len(running))
                entered.append((permit.fencing_token, permit.slot))
                await asyncio.sleep(0.005)
                running.discard(permit.slot)

    await within(asyncio.gather(*(worker() for _ in range(8))), what="24 permits", timeout=30)
    assert most == 3
    assert len(entered) == 24
    assert len({token for token, _ in entered}) == 24
    assert {slot for _, slot in entered} == {0, 1, 2}
    for slot in (0, 1, 2):
        # One slot's holders follow each other: their tokens increase in that order.
        tokens = [token for token, used in entered if used == slot]
        assert tokens == sorted(tokens), f"slot {slot}"
    await every_permit_free(semaphore)
    info = await semaphore.info()
    assert info.holders == () and info.limit == 3 and info.waiting == 0


async def test_processes_configured_with_other_limits_obey_the_stored_one(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    first = [await Semaphore(clients[0], name, limit=2).acquire() for _ in range(2)]
    larger = Semaphore(clients[1], name, limit=5)
    assert await larger.try_acquire() is None
    info = await larger.info()
    assert info.limit == 2 and info.free == 0
    assert [holder.slot for holder in info.holders] == [0, 1]
    await first[0].release()
    permit = await larger.try_acquire()
    assert permit is not None and permit.slot == 0
    assert await larger.try_acquire() is None
    await permit.release()
    await first[1].release()


async def test_a_lowered_limit_keeps_the_permits_held_and_lets_none_in(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    semaphore = Semaphore(clients[0], name, limit=3)
    held = [await semaphore.acquire() for _ in range(3)]
    assert await semaphore.set_limit(1) == 3
    assert all(permit.held for permit in held)
    other = Semaphore(clients[1], name, limit=3)
    await held[0].release()
    assert await other.try_acquire() is None, "2 held, limit 1"
    await held[1].release()
    assert await other.try_acquire() is None, "1 held, limit 1"
    await held[2].release()
    permit = await other.try_acquire()
    assert permit is not None
    assert (await other.info()).limit == 1
    await permit.release()


async def test_a_lowered_limit_holds_for_a_waiter_of_the_releasing_process(
    client: redis.asyncio.Redis, name: str
) -> None:
    """Limit 3, three permits held by one process, a task of that same process waiting;
    the limit is lowered to 2. A release puts the waiting task's queue in line in its own
    call: with 2 permits still held that queue gets nothing (3 holders under a limit of
    2); the next release, leaving 1, hands it a permit."""
    semaphore = Semaphore(client, name, limit=3, ttl=10)
    held = [await semaphore.acquire() for _ in range(3)]
    waiter = asyncio.create_task(semaphore.acquire())
    channel = keys_of(name).channel
    notifier = runtime_for(client).notifier

    def in_line() -> bool:
        queue = notifier.queue_for(channel)
        # Subscribed, its try answered (queued in Redis): a release now carries the queue.
        return (
            queue is not None
            and notifier.is_subscribed(channel)
            and bool(queue.registrations)
            and not queue.attempting
        )

    try:
        await eventually(in_line, what="the waiting task's queue in line in Redis")
        await queued_in_redis(client, name, 1)
        assert await semaphore.set_limit(2) == 3
        await held[0].release()
        info = await semaphore.info()
        assert (info.limit, len(info.holders)) == (2, 2), info
        assert not waiter.done(), "a permit was given under the lowered limit"
        await held[1].release()
        permit = await within(waiter, what="the waiter served once 1 permit was left")
        info = await semaphore.info()
        assert len(info.holders) == 2 and permit.held
        await permit.release()
    finally:
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        for lease in held:
            await lease.release()


async def test_a_raised_limit_hands_the_new_permits_to_the_waiters_at_once(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    semaphore = Semaphore(clients[0], name, limit=1, ttl=10)
    holder = await semaphore.acquire()
    waiters = []
    for index in (1, 2, 3):
        waiters.append(asyncio.create_task(Semaphore(clients[index], name, limit=1).acquire()))
        await queued_in_redis(clients[0], name, index)
    assert await semaphore.set_limit(3) == 1
    done = await within(asyncio.gather(*waiters[:2]), what="two waiters served by set_limit")
    assert not waiters[2].done()
    assert {permit.slot for permit in done} == {1, 2}
    await holder.release()
    last = await within(waiters[2], what="the third waiter served by the release")
    for permit in (*done, last):
        await permit.release()


async def test_set_limit_on_an_idle_semaphore_lasts_for_the_retention(
    client: redis.asyncio.Redis, name: str
) -> None:
    semaphore = Semaphore(client, name, limit=4, retain=5)
    assert await semaphore.set_limit(2) is None
    assert 0 < await client.pttl(keys_of(name).lock) <= 5000
    assert (await semaphore.info()).limit == 2


@pytest.mark.parametrize(
    ("limit", "error"),
    [
        (0, ConfigError),
        (10_001, ConfigError),
        (-1, ConfigError),
        (True, TypeError),
        (2.0, TypeError),
        ("3", TypeError),
    ],
)
async def test_a_bad_limit_is_refused_before_anything_is_sent(
    client: redis.asyncio.Redis, commands: CommandLog, name: str, limit: object, error: type
) -> None:
    mark = commands.mark()
    with pytest.raises(error, match="limit must be an int"):
        Semaphore(client, name, limit=limit)  # type: ignore[arg-type]
    semaphore = Semaphore(client, name, limit=2)
    with pytest.raises(error, match="limit must be an int"):
        await semaphore.set_limit(limit)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limit"):
        Semaphore(client, name)  # type: ignore[call-arg]
    assert commands.since(mark) == Counter()


# ----------------------------------------------------------------------------- FIFO, grants
async def test_waiting_processes_get_permits_in_arrival_order(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    holders = [await Semaphore(clients[0], name, limit=2, ttl=10).acquire() for _ in range(2)]
    granted: list[tuple[int, int]] = []  # (fencing token, process)
    release = asyncio.Event()

    async def waiter(index: int) -> None:
        async with Semaphore(clients[index], name, limit=2, ttl=10) as permit:
            granted.append((permit.fencing_token, index))
            await release.wait()

    tasks = []
    for index in (4, 2, 5, 1, 3):
        tasks.append(asyncio.create_task(waiter(index)))
        await queued_in_redis(clients[0], name, len(tasks))
    await holders[0].release()
    await eventually(lambda: len(granted) == 1, what="the first queued process served")
    await holders[1].release()
    await eventually(lambda: len(granted) == 2, what="the second queued process served")
    release.set()
    await within(asyncio.gather(*tasks), what="every waiter served")
    # Tokens are issued in the order the permits were granted (two may be entered in the
    # other order, by two processes at once).
    assert [index for _, index in sorted(granted)] == [4, 2, 5, 1, 3]


async def test_a_newcomer_cannot_take_a_permit_freed_by_expiry_from_the_queue(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    ttl = scaled(0.5)  # the waiter queues before the permit expires, on a loaded machine
    expiring = await Semaphore(clients[0], name, limit=1, ttl=ttl, renew=False).acquire()
    queued = asyncio.create_task(Semaphore(clients[1], name, limit=1, ttl=10).acquire())
    await queued_in_redis(clients[0], name, 1)
    newcomer = Semaphore(clients[2], name, limit=1, ttl=10)
    expires_ms = await server_ms(clients[0]) + ttl * 1000

    async def expired() -> bool:
        return await server_ms(clients[0]) > expires_ms

    await eventually(expired, what="the permit's expiry", interval=0.01)
    # Whoever notices first (the newcomer's try, or the queued head's check at the expiry),
    # the freed permit goes to the queue's head.
    assert await newcomer.try_acquire() is None
    permit = await within(queued, what="the queued process to get the freed permit")
    assert permit.fencing_token > expiring.fencing_token
    assert expiring.lost
    await permit.release()


async def test_permits_freed_at_once_go_to_the_queued_processes_in_order(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    ttl = scaled(0.5)  # the four waiters queue before the permits expire, on a loaded machine
    expiring = [
        await Semaphore(clients[0], name, limit=3, ttl=ttl, renew=False).acquire() for _ in range(3)
    ]
    tasks = []
    for index in (1, 2, 3, 4):
        tasks.append(asyncio.create_task(Semaphore(clients[index], name, limit=3).acquire()))
        await queued_in_redis(clients[0], name, index)
    served = await within(asyncio.gather(*tasks[:3]), what="the three first processes served")
    assert sorted(permit.slot or 0 for permit in served) == [0, 1, 2]
    assert all(permit.fencing_token > expiring[-1].fencing_token for permit in served)
    assert not tasks[3].done()
    await served[0].release()
    last = await within(tasks[3], what="the fourth process served by a release")
    assert last.slot == served[0].slot
    for permit in (*served[1:], last):
        await permit.release()


async def test_a_cancelled_waiter_leaves_nothing_queued(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    keys = keys_of(name)
    holders = [await Semaphore(clients[0], name, limit=2).acquire() for _ in range(2)]
    waiter = asyncio.create_task(Semaphore(clients[1], name, limit=2).acquire())
    await queued_in_redis(clients[0], name, 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await within(waiter, what="the cancelled waiter to end")
    assert await clients[0].zcard(keys.queue) == 0
    assert await clients[0].hlen(keys.waiters) == 0
    assert len((await Semaphore(clients[0], name, limit=2).info()).holders) == 2
    for permit in holders:
        await permit.release()
    assert (await Semaphore(clients[0], name, limit=2).info()).free == 2


async def test_a_cancelled_waiter_passes_on_a_permit_granted_to_it(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    holder = await Semaphore(clients[0], name, limit=1, ttl=10).acquire()
    first = asyncio.create_task(Semaphore(clients[1], name, limit=1, ttl=10).acquire())
    await queued_in_redis(clients[0], name, 1)
    second = asyncio.create_task(Semaphore(clients[2], name, limit=1, ttl=10).acquire())
    await queued_in_redis(clients[0], name, 2)
    await holder.release()  # granted to the first queue...
    first.cancel()  # ...which gives up before or while taking it
    with pytest.raises(asyncio.CancelledError):
        await within(first, what="the cancelled waiter to end")
    permit: Lease = await within(second, what="the permit passed on to the second waiter")
    assert (await Semaphore(clients[0], name, limit=1).info()).holders[0].fencing_token == (
        permit.fencing_token
    )
    await permit.release()


async def test_many_local_waiters_use_every_permit(client: redis.asyncio.Redis, name: str) -> None:
    """One process, more waiters than permits: grants to its queue and the permits still
    free after an acquire both go to its next waiters, none is left unused."""
    semaphore = Semaphore(client, name, limit=4, ttl=10)
    holders = [await semaphore.acquire() for _ in range(4)]
    inside = 0
    full = asyncio.Event()
    release = asyncio.Event()

    async def waiter() -> None:
        nonlocal inside
        async with semaphore:
            inside += 1
            if inside == 4:
                full.set()
            await release.wait()

    tasks = [asyncio.create_task(waiter()) for _ in range(10)]
    await eventually(
        lambda: runtime_for(client).notifier.queue_length(keys_of(name).channel) == 10,
        what="ten local waiters",
    )
    for permit in holders:
        await permit.release()
    await within(full.wait(), what="four waiters inside at once")
    assert inside == 4
    release.set()
    await within(asyncio.gather(*tasks), what="every waiter served")
    await every_permit_free(semaphore)


# ----------------------------------------------------------------------------- leases
async def test_a_lost_permit_cancels_its_body(client: redis.asyncio.Redis, name: str) -> None:
    semaphore = Semaphore(client, name, limit=2, ttl=scaled(0.6))
    with pytest.raises(LeaseLostError) as caught:
        async with semaphore as permit:
            await client.hdel(keys_of(name).lock, f"p:{permit.token}")
            await until_cancelled(what="the body cancelled by the loss")
    assert caught.value.reason is LossReason.NOT_OWNER


async def test_permits_and_locks_are_renewed_in_the_same_batches(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    ttl = scaled(0.3)  # renewed on time on a loaded machine
    permits = [await Semaphore(client, name, limit=5, ttl=ttl).acquire() for _ in range(5)]
    lock = await Lock(client, name, ttl=ttl).acquire()
    first = max(lease.deadline for lease in (*permits, lock))
    mark = commands.mark()
    await eventually(
        lambda: min(lease.deadline for lease in (*permits, lock)) > first + ttl / 3,
        what="every lease renewed",
        interval=0.01,
    )
    assert all(permit.held for permit in permits) and lock.held
    renewals = commands.since(mark)["EVALSHA renew"]
    if renewals:  # fakeredis's client is not logged
        assert renewals <= 6, f"{renewals} renewal calls for 6 leases renewed at least once"
    for lease in (*permits, lock):
        await lease.release()


async def test_a_permit_can_be_resumed_and_released_by_token(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    semaphore = Semaphore(clients[0], name, limit=2, ttl=10)
    permit = await semaphore.acquire(token="t" * 32)
    again = await semaphore.acquire(token="t" * 32, timeout=0)  # acquire-or-extend
    assert (again.fencing_token, again.slot) == (permit.fencing_token, permit.slot)
    elsewhere = Semaphore(clients[1], name, limit=2, ttl=10)
    resumed = await elsewhere.resume("t" * 32)
    assert (resumed.fencing_token, resumed.slot) == (permit.fencing_token, permit.slot)
    assert await elsewhere.release_token("t" * 32)
    assert not await elsewhere.release_token("u" * 32)
    with pytest.raises(LeaseLostError):
        await elsewhere.resume("t" * 32)
    with pytest.raises(LeaseLostError):
        await semaphore.acquire(token="t" * 32)  # a token is never granted twice
    assert (await semaphore.info()).holders == ()
    for lease in (permit, again, resumed):
        await lease.release()  # released already, by token: not an error


async def test_a_task_may_hold_several_permits(client: redis.asyncio.Redis, name: str) -> None:
    semaphore = Semaphore(client, name, limit=2)
    async with semaphore as first, semaphore as second:
        assert {first.slot, second.slot} == {0, 1}
        assert await semaphore.try_acquire() is None
        assert await semaphore.locked()


async def test_nothing_is_left_but_the_state_after_the_last_release(
    client: redis.asyncio.Redis, name: str
) -> None:
    keys = keys_of(name)
    semaphore = Semaphore(client, name, limit=3, ttl=2, retain=5)
    permits = [await semaphore.acquire() for _ in range(3)]
    for permit in permits:
        await permit.release()
    assert not await client.exists(keys.queue, keys.waiters, keys.holds)
    fields = {
        key.decode() if isinstance(key, bytes) else key for key in await client.hkeys(keys.lock)
    }
    # The index's own fields: the slots used so far (each free now), the count, the fence.
    assert fields <= {"limit", "fence", "r", "ru", "h", "q", "n", "c", "x", "xr", "l"}
    assert await client.hmget(keys.lock, ["n", "c"]) in ([b"3", b"0"], ["3", "0"])
    assert 0 < await client.pttl(keys.lock) <= 5000
    index = permits_key(keys.lock)
    assert await client.zrange(index, 0, -1, withscores=True) in (
        [(b"0", 0.0), (b"1", 1.0), (b"2", 2.0)],
        [("0", 0.0), ("1", 1.0), ("2", 2.0)],
    )
    assert 0 < await client.pttl(index) <= 5000


@pytest.mark.real_only
async def test_a_hand_off_within_one_process_costs_its_release_only(
    server_url: str, name: str
) -> None:
    """`limit=1` and local waiters: each release grants the permit straight to the next
    waiter, which holds it without an acquire of its own (as a lock's hand-off)."""
    log = CommandLog()
    client = make_client(server_url, log)
    try:
        semaphore = Semaphore(client, name, limit=1, ttl=10)
        holder = await semaphore.acquire()
        order: list[int] = []

        async def waiter(index: int) -> None:
            async with semaphore:
                order.append(index)

        tasks = []
        for index in range(4):
            tasks.append(asyncio.create_task(waiter(index)))
            await eventually(
                lambda count=index + 1: (  # type: ignore[misc]
                    runtime_for(client).notifier.queue_length(keys_of(name).channel) == count
                ),
                what=f"{index + 1} local waiter(s)",
            )
        await queued_in_redis(client, name, 1)
        mark = log.mark()
        await holder.release()
        await within(asyncio.gather(*tasks), what="every waiter served")
        assert order == [0, 1, 2, 3]
        spent = log.since(mark)
        # Five releases, each a hand-off but the last; the last waiter's queue, now empty,
        # is withdrawn by that release's own call. No acquire after the first release.
        assert spent["EVALSHA semaphore-acquire"] == 0, spent
        assert spent["EVALSHA semaphore-release"] == 5, spent
    finally:
        await client.aclose()


async def test_a_queued_process_met_again_gets_no_second_grant_in_one_call(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """A raised limit frees four permits while one process with one waiter is queued: it
    is granted one, and the other three stay free for whoever comes next (no reservation
    for a process with nobody left to take it, no permit counted twice)."""
    semaphore = Semaphore(clients[0], name, limit=1, ttl=10)
    holder = await semaphore.acquire()
    channel = keys_of(name).channel
    listener = clients[2].pubsub()
    await listener.subscribe(channel)
    try:
        waiter = asyncio.create_task(Semaphore(clients[1], name, limit=1).acquire())
        await queued_in_redis(clients[0], name, 1)
        assert await semaphore.set_limit(5) == 1
        permit = await within(waiter, what="the queued waiter served by set_limit")
        await clients[2].publish(channel, "end")
        messages: list[str] = []

        async def read() -> None:
            while not messages or messages[-1] != "end":
                message = await listener.get_message(ignore_subscribe_messages=True, timeout=1)
                if message is not None:
                    messages.append(message["data"].decode())

        await within(read(), what="the channel's messages up to the marker")
        grants = [message for message in messages if message.startswith("g")]
        assert len(grants) == 1, messages
        others = [await semaphore.acquire() for _ in range(3)]  # three left free, at once
        assert len({lease.slot for lease in (holder, permit, *others)}) == 5
        for lease in (holder, permit, *others):
            await lease.release()
    finally:
        await listener.aclose()


async def test_one_release_wakes_one_waiting_process(server_url: str, name: str) -> None:
    """Three processes wait (each silent meanwhile); a release grants the permit to the
    first: it holds it without an acquire (its first renewal, and the withdrawal of its
    queue, now empty, are its only commands), and the other two send nothing."""
    logs = [CommandLog() for _ in range(4)]
    clients = [make_client(server_url, log) for log in logs]
    try:
        for client in clients:  # scripts loaded, a connection open: the steady state
            lease = await Semaphore(client, f"{name}:warm-up", limit=1).acquire()
            await lease.extend()
            await lease.release()
        semaphore = Semaphore(clients[0], name, limit=2, ttl=10)
        held = [await semaphore.acquire() for _ in range(2)]
        channel = keys_of(name).channel
        waiters = []
        for index in (1, 2, 3):
            mark = logs[index].mark()
            waiters.append(asyncio.create_task(Semaphore(clients[index], name, limit=2).acquire()))
            await queued_in_redis(clients[0], name, index)
            # try, subscribe, try again (a release may have come in between), then silence
            await eventually(
                lambda log=logs[index], mark=mark: (
                    log.since(mark)  # type: ignore[misc]
                    == Counter({"EVALSHA semaphore-acquire": 2, "SUBSCRIBE": 1})
                ),
                what=f"process {index} subscribed and queued",
            )
            assert runtime_for(clients[index]).notifier.is_subscribed(channel)
        marks = [log.mark() for log in logs]
        await held[0].release()
        permit = await within(waiters[0], what="the first process served")
        await asyncio.sleep(0.2)  # a herd, or a late withdrawal, would show up here
        spent = [log.since(mark) for log, mark in zip(logs, marks, strict=True)]
        assert spent[0] == Counter({"EVALSHA semaphore-release": 1})
        # (Plus, on a loaded machine, the watchdog's own renewal if the first one's answer
        # came later than a third of the grant's 0.9 s: it is scheduled by the grant until
        # that answer postpones it.)
        late = spent[1].pop("EVALSHA renew", 0)
        assert late <= 1, spent[1]
        assert spent[1] == Counter({"EVAL renew": 1, "EVALSHA semaphore-release": 1})
        assert spent[2] == spent[3] == Counter()
        assert not waiters[1].done() and not waiters[2].done()
        await permit.release()
        for waiter in waiters[1:]:
            await (await within(waiter, what="the other processes served")).release()
        await held[1].release()
    finally:
        for client in clients:
            await client.aclose()


async def test_permits_handed_between_processes_are_never_left_idle(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """Two processes, three workers each, passing two permits back and forth: every release
    reaches the next waiter, so the whole run takes a fraction of a second; a grant left
    unheard would idle a permit until the waiters' fallback check (the ttl: 10 s)."""
    loop = asyncio.get_running_loop()
    longest = 0.0

    async def worker(client: redis.asyncio.Redis) -> None:
        nonlocal longest
        semaphore = Semaphore(client, name, limit=2, ttl=10)
        for _ in range(4):
            asked = loop.time()
            async with semaphore:
                longest = max(longest, loop.time() - asked)
                await asyncio.sleep(0.01)

    work = asyncio.gather(*(worker(clients[i % 2]) for i in range(6)))
    await within(work, what="24 permits handed around without idling", timeout=5)
    assert longest < 5, f"a waiter waited {longest:.3f}s"


@pytest.mark.real_only
async def test_a_grant_is_announced_apart_from_the_granted_permits_own_release(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """See the read-write lock's test of the same name."""
    blocker = await Semaphore(clients[0], name, limit=1, ttl=10).acquire()
    waiting = asyncio.create_task(Semaphore(clients[1], name, limit=1, ttl=10).acquire())
    await queued_in_redis(clients[0], name, 1)
    pubsub = clients[2].pubsub()
    await pubsub.subscribe(keys_of(name).channel)
    try:
        await blocker.release()
        permit = await within(waiting, what="the waiter granted")
        message = None
        while message is None or message["type"] != "message":
            message = await within(pubsub.get_message(timeout=1.0), what="the grant's announcement")
        assert message["data"].decode().split(" ")[0] != str(permit.fencing_token)
        await permit.release()
    finally:
        await pubsub.aclose()


@pytest.mark.real_only
async def test_no_permit_is_ever_held_twice_under_contention(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """Two processes, four tasks each, on three permits, for two seconds of short random
    holds and at least 100 of them (a loaded machine runs fewer in two seconds): grants,
    claims, releases that put a queue in line and grants told twice race each other. At
    no moment do more than three tasks hold permits, nor two the same."""
    loop = asyncio.get_running_loop()
    end = loop.time() + 2.0
    holding: dict[int, int] = {}  # task -> fencing token
    problems: list[str] = []
    sections = 0

    async def worker(client: redis.asyncio.Redis, index: int) -> None:
        nonlocal sections
        rng = random.Random(index)
        semaphore = Semaphore(client, name, limit=3, ttl=1, timeout=5)
        while loop.time() < end or sections <= 100:
            async with semaphore as permit:
                if permit.fencing_token in holding.values():
                    problems.append(f"token {permit.fencing_token} held twice")
                holding[index] = permit.fencing_token
                if len(holding) > 3:
                    problems.append(f"{len(holding)} permits held at once")
                await asyncio.sleep(rng.uniform(0, 0.02))
                del holding[index]
                sections += 1

    work = asyncio.gather(*(worker(clients[i % 2], i) for i in range(8)))
    await within(work, what="two seconds and 100 sections of contention", timeout=30)
    assert not problems, problems[:5]
    assert sections > 100
