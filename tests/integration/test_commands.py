"""Exact commands per operation, counted on the client's connections (real server only)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable
from typing import Any

import pytest
import redis.asyncio

from aiolock import Lock, ReadLock, ReadWriteLock, Semaphore, WriteLock
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys
from aiolock._lua.lease import RENEW
from aiolock._ops.inspection import read_locks

from ..conftest import CommandLog, make_client
from ..support.load import scaled
from ..support.servers import RedisServer
from ..support.waits import eventually, within

pytestmark = pytest.mark.real_only


async def warm_up(client: redis.asyncio.Redis, name: str) -> None:
    """Load the scripts and open a connection, so what follows is the steady state (the
    watchdog's renewal script too: `extend` sends another)."""
    lease = await Lock(client, f"{name}:warm-up").acquire()
    await lease.extend()
    await lease.release()
    await Lock(client, f"{name}:warm-up").info()
    await client.script_load(RENEW.source)


async def test_acquire_release_extend_are_one_round_trip_each(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    await warm_up(client, name)
    lock = Lock(client, name, ttl=5)

    mark = commands.mark()
    lease = await lock.acquire()
    assert commands.since(mark) == Counter({"EVALSHA acquire": 1})

    mark = commands.mark()
    await lease.extend()
    assert commands.since(mark) == Counter({"EVALSHA renew_holder": 1})

    mark = commands.mark()
    await lease.release()
    assert commands.since(mark) == Counter({"EVALSHA release": 1})

    mark = commands.mark()
    assert not await lock.locked()
    assert commands.since(mark) == Counter({"EVALSHA inspect": 1})

    mark = commands.mark()
    assert await lock.info() is None
    assert commands.since(mark) == Counter({"EVALSHA inspect": 1})


def commandstats(info: dict[str, Any]) -> Counter[str]:
    """Calls per command from `INFO commandstats`."""
    return Counter(
        {key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in info.items()}
    )


async def test_an_uncontended_cycle_costs_the_server_eight_commands(
    server: RedisServer, name: str
) -> None:
    """What the server executes, scripts' own calls included (`INFO commandstats`): the
    two script calls and six commands inside them, on a name used before and on a fresh
    one. Each of the six is explained in `_lua.lock`."""
    client = make_client(server.url)
    try:
        await warm_up(client, name)
        for lock_name in (name, f"{name}:2", name):  # fresh, fresh, used before
            before = commandstats(await client.info("commandstats"))
            async with Lock(client, lock_name, ttl=30):
                pass
            after = commandstats(await client.info("commandstats"))
            spent = after - before
            spent.pop("info", None)
            assert spent == Counter(
                {"evalsha": 2, "hmget": 2, "time": 1, "hset": 1, "pexpire": 1, "hdel": 1}
            ), lock_name
    finally:
        await client.aclose()


async def test_the_uncontended_path_stores_the_fencing_token_it_answers(
    server: RedisServer, name: str
) -> None:
    """The uncontended acquire writes the server clock's digits as TIME gave them (not a
    number's conversion) and answers the fencing token as a number: the two must be the
    same token, and the acquisition time its milliseconds. Over 300 cycles the clock's
    microseconds fall below 100000 (digits to pad) many times."""
    client = make_client(server.url)
    lock = Lock(client, name, ttl=30)
    try:
        for _ in range(300):
            async with lock as lease:
                stored = await client.hmget(f"aiolock:{{{name}}}", ["fence", "a"])
                assert [int(v or -1) for v in stored] == [
                    lease.fencing_token,
                    lease.fencing_token // 1000,
                ]
    finally:
        await client.aclose()


async def test_a_refused_single_try_marks_the_hold_once_and_its_release_measures_it(
    server: RedisServer, name: str
) -> None:
    """A try that does not queue and is refused writes one field, once per hold (`b`),
    for the release of that hold to measure it into the typical hold (`h`): three more
    commands in that release (HMGET of the holder's time, TIME, HSET of `h`)."""
    client = make_client(server.url)

    async def spent(step: Awaitable[object]) -> Counter[str]:
        before = commandstats(await client.info("commandstats"))
        await step
        after = commandstats(await client.info("commandstats")) - before
        after.pop("info", None)
        return after

    try:
        await warm_up(client, name)
        lock = Lock(client, name, ttl=30)
        holder = await lock.acquire()
        busy = {"evalsha": 1, "hmget": 2, "pttl": 1}
        assert await spent(lock.try_acquire()) == Counter({**busy, "hset": 1})
        assert await spent(lock.try_acquire()) == Counter(busy)  # marked already
        assert await spent(holder.release()) == Counter(
            {"evalsha": 1, "hmget": 2, "hdel": 1, "time": 1, "hset": 1}
        )
        assert (await read_locks(client, [name]))[0].typical_hold is not None
        async with Lock(client, name, ttl=30):  # not refused: the release is the short one
            pass
    finally:
        await client.aclose()


async def test_async_with_is_two_round_trips(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    await warm_up(client, name)
    mark = commands.mark()
    async with Lock(client, name, ttl=5):
        pass
    assert commands.since(mark) == Counter({"EVALSHA acquire": 1, "EVALSHA release": 1})


async def test_unknown_script_falls_back_to_eval_once(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    await warm_up(client, name)
    await client.script_flush()
    mark = commands.mark()
    lease = await Lock(client, name, ttl=5).acquire()
    assert commands.commands[mark:] == ["EVALSHA acquire", "EVAL acquire"]
    mark = commands.mark()
    await lease.release()
    await (await Lock(client, name, ttl=5).acquire()).release()
    assert commands.commands[mark:] == [
        "EVALSHA release",
        "EVAL release",
        "EVALSHA acquire",
        "EVALSHA release",
    ]


async def test_renewals_of_many_leases_are_batched(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    await warm_up(client, name)
    ttl = scaled(0.3)  # longer than a loaded machine's stalls: no lease may be lost
    leases = [await Lock(client, f"{name}:{i}", ttl=ttl).acquire() for i in range(200)]
    try:
        first_deadlines = [lease.deadline for lease in leases]
        mark = commands.mark()
        scheduler = runtime_for(client).scheduler
        batches_before = scheduler.batches_sent
        # Wait until every lease has been renewed at least twice (ttl/3 apart).
        await eventually(
            lambda: min(lease.deadline for lease in leases) >= max(first_deadlines) + ttl * 2 / 3,
            what="every lease renewed twice",
            interval=0.02,
        )

        def calls() -> int:
            return commands.since(mark)["EVALSHA renew"]

        # One script call per batch (a batch counted but not yet written is in flight).
        await eventually(
            lambda: calls() == scheduler.batches_sent - batches_before,
            what="every batch sent as one script call",
        )
        # At least 400 lease renewals were sent; one call per lease would be >= 400 calls.
        assert 2 <= calls() <= 20, f"{calls()} script calls for >= 400 lease renewals"
        assert all(lease.held for lease in leases)
    finally:
        for lease in leases:
            await lease.release()


async def test_a_waiter_is_silent_while_the_holder_holds(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    await warm_up(client, name)
    holder = await Lock(client, name, ttl=10).acquire()
    mark = commands.mark()
    waiter = asyncio.create_task(Lock(client, name, ttl=10).acquire())
    notifier = runtime_for(client).notifier
    channel = f"aiolock:{{{name}}}:released"
    await eventually(lambda: notifier.queue_length(channel) > 0, what="the waiter queued")
    await asyncio.sleep(0.5)  # a stretch of holding: nothing may be sent meanwhile
    # try, subscribe, try again (closes the race with a release in between), then silence
    assert commands.commands[mark:] == ["EVALSHA acquire", "SUBSCRIBE", "EVALSHA acquire"]
    mark = commands.mark()
    await holder.release()
    lease = await within(waiter, what="the waiter to get the lock")
    # The release grants the lock to the waiter's registered token: no acquire follows.
    assert commands.since(mark) == Counter({"EVALSHA release": 1})
    assert lease.held and lease.fencing_token > holder.fencing_token
    await lease.release()


async def test_a_grant_from_another_client_costs_its_grantee_one_short_renewal(
    server_url: str, commands: CommandLog, name: str
) -> None:
    """The grantee of another process's release writes one command before its body runs:
    its lease's renewal to the full ttl, sent with the script's text (so that it runs even
    on a server that lost its scripts). That text is what the hand-off costs the grantee's
    client to pack and write, and the server to read and hash: a short one, not the
    watchdog's batch script of about 4 KB."""
    other = make_client(server_url)
    client = make_client(server_url, commands)
    try:
        await warm_up(client, name)
        holder = await Lock(other, name, ttl=10).acquire()
        waiter = asyncio.create_task(Lock(client, name, ttl=10).acquire())
        notifier = runtime_for(client).notifier
        keys = LockKeys.build("aiolock", name)
        await eventually(lambda: notifier.queue_length(keys.channel) > 0, what="the waiter queued")
        queue = notifier.queue_for(keys.channel)
        assert queue is not None

        async def in_line() -> bool:
            return not queue.attempting and int(await other.zcard(keys.queue)) == 1

        await eventually(in_line, what="the waiter in line in Redis")
        mark = commands.mark()
        await holder.release()
        lease = await within(waiter, what="the waiter to get the lock")
        await eventually(lambda: lease.remaining() > 9, what="the grant renewed to the ttl")
        sent = commands.since(mark)
        assert sum(sent.values()) == 1 and next(iter(sent)).startswith("EVAL "), sent
        assert commands.bytes_since(mark) < 1024, f"{sent}: {commands.bytes_since(mark)} bytes"
        await lease.release()
    finally:
        await client.aclose()
        await other.aclose()


async def test_one_release_wakes_one_of_many_local_waiters(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    await warm_up(client, name)
    holder = await Lock(client, name, ttl=10).acquire()
    channel = f"aiolock:{{{name}}}:released"
    notifier = runtime_for(client).notifier
    waiters = []
    start = commands.mark()
    for _ in range(20):
        waiters.append(asyncio.create_task(Lock(client, name, ttl=10).acquire()))
        await eventually(
            lambda: notifier.queue_length(channel) >= len(waiters),
            what=f"{len(waiters)} waiters queued",
        )
    # Only the first arrival tries at once; the others queue behind it without a command.
    # Once subscribed, the head tries again (a release may have come in between): 2 tries.
    await eventually(
        lambda: notifier.is_subscribed(channel) and commands.since(start)["EVALSHA acquire"] >= 2,
        what="the head subscribed and tried again",
        interval=0.001,
    )
    assert commands.since(start) == Counter({"EVALSHA acquire": 2, "SUBSCRIBE": 1})
    # Its second try answered too: a release while a try is in flight does not put the
    # queue in line, and its grant goes through the channel with a short expiry (which the
    # waiter then renews: one command more than counted below).
    queue = notifier.queue_for(channel)
    assert queue is not None
    await eventually(lambda: not queue.attempting, what="the head's try answered")
    mark = commands.mark()
    await holder.release()
    done, _ = await asyncio.wait(waiters, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    assert done, "no waiter got the lock within 10 s of the release"
    await asyncio.sleep(0.2)  # any herd would show up here as extra attempts
    assert commands.since(mark) == Counter({"EVALSHA release": 1})
    assert done == {waiters[0]}
    # Hand the lock down the queue: one release each time (it grants the lock to the next
    # waiter directly), in order of arrival.
    lease = done.pop().result()
    for index in range(1, 20):
        mark = commands.mark()
        await lease.release()
        pending = [w for w in waiters if not w.done()]
        done, _ = await asyncio.wait(pending, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert done == {waiters[index]}, f"waiter {index} did not get the lock within 10 s"
        previous, lease = lease, done.pop().result()
        assert lease.fencing_token > previous.fencing_token
        assert commands.since(mark) == Counter({"EVALSHA release": 1})
    await lease.release()


@pytest.mark.parametrize("kind", ["read", "write"])
async def test_an_uncontended_cycle_of_a_read_write_lock_costs_ten_commands(
    server: RedisServer, name: str, kind: str
) -> None:
    """The two script calls, and inside them: HGETALL (the state and every lease in it),
    TIME, HSET (the lease), PEXPIRE (the key outlives it) to acquire; HGETALL, TIME, HDEL
    (the lease), HSET (the released token, for late copies) to release."""
    client = make_client(server.url)
    try:

        def primitive(lock_name: str) -> ReadLock | WriteLock:
            rw = ReadWriteLock(client, lock_name, ttl=30)
            return rw.read() if kind == "read" else rw.write()

        await warm_up(client, name)
        async with primitive(f"{name}:warm-up"):
            pass
        for lock_name in (name, f"{name}:2", name):  # fresh, fresh, used before
            before = commandstats(await client.info("commandstats"))
            async with primitive(lock_name):
                pass
            after = commandstats(await client.info("commandstats"))
            spent = after - before
            spent.pop("info", None)
            assert spent == Counter(
                {"evalsha": 2, "hgetall": 2, "time": 2, "hset": 2, "pexpire": 1, "hdel": 1}
            ), lock_name
    finally:
        await client.aclose()


async def cycle_commands(client: redis.asyncio.Redis, semaphore: Semaphore) -> Counter[str]:
    """What the server executes for one permit taken and given back (`INFO commandstats`)."""
    before = commandstats(await client.info("commandstats"))
    async with semaphore:
        pass
    spent = commandstats(await client.info("commandstats")) - before
    spent.pop("info", None)
    return spent


SEMAPHORE_CYCLE = Counter(
    {
        "evalsha": 2,
        # acquire: the state's own fields and the caller's (a free slot among them), the
        # clock, the permit (and its slot's holder), its slot's expiry in the index, how
        # long the keys live (they are extended, by twice the ttl, only once the next
        # permit would outlive them); release: the same reads, the permit and its slot's
        # holder deleted, the released token (for late copies) and the count, the slot free
        # in the index
        "hmget": 2,
        "time": 2,
        "hset": 2,
        "zadd": 2,
        "pttl": 1,
        "hdel": 1,
    }
)
"""A permit's cycle when the semaphore has a free slot, whatever its limit."""


@pytest.mark.parametrize("limit", [4, 256])
async def test_a_permit_costs_the_same_commands_at_any_limit(
    server: RedisServer, name: str, limit: int
) -> None:
    """With every permit but one held by others, a permit taken and given back costs the
    server the same commands at limit 4 and at limit 256: no script reads every permit
    (no HGETALL), the index gives the free slot."""
    client = make_client(server.url)
    try:
        await warm_up(client, name)
        semaphore = Semaphore(client, name, limit=limit, ttl=60)
        others = [await semaphore.acquire() for _ in range(limit - 1)]
        await cycle_commands(client, semaphore)  # its slot used once: a member of the index
        for _ in range(3):
            assert await cycle_commands(client, semaphore) == SEMAPHORE_CYCLE
        for lease in others:
            await lease.release()
    finally:
        await client.aclose()


async def test_an_uncontended_semaphore_cycle_on_a_new_name_and_on_one_used_before(
    server: RedisServer, name: str
) -> None:
    """On a name used before, `SEMAPHORE_CYCLE`. On a new one, the acquire looks for
    permits an older version may have written (HGETALL of the empty state, DEL of any
    index left behind), takes slot 0, and gives both keys their expiry."""
    client = make_client(server.url)
    try:
        await warm_up(client, name)
        async with Semaphore(client, f"{name}:warm-up", limit=3, ttl=30):
            pass
        new = SEMAPHORE_CYCLE + Counter({"hgetall": 1, "del": 1, "pexpire": 2})
        for lock_name, expected in ((name, new), (f"{name}:2", new), (name, SEMAPHORE_CYCLE)):
            spent = await cycle_commands(client, Semaphore(client, lock_name, limit=3, ttl=30))
            assert spent == expected, lock_name
    finally:
        await client.aclose()


async def test_releases_of_one_process_hand_their_permits_to_its_waiting_tasks(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    """Every permit held and more tasks of the process waiting: the permits released all at
    once (one release putting the queue in line, the others in flight beside it) go to the
    waiting tasks in the releases' own calls, in the order the tasks called; no waiting task
    sends an acquire of its own."""
    await warm_up(client, name)
    async with Semaphore(client, f"{name}:warm-up", limit=1):
        pass
    semaphore = Semaphore(client, name, limit=4, ttl=30)
    held = [await semaphore.acquire() for _ in range(4)]
    notifier = runtime_for(client).notifier
    channel = semaphore._channel
    waiters: list[asyncio.Task[Any]] = []
    for _ in range(8):
        waiters.append(asyncio.create_task(semaphore.acquire()))
        await eventually(
            lambda: notifier.queue_length(channel) >= len(waiters),
            what=f"{len(waiters)} tasks waiting",
        )
    queue = notifier.queue_for(channel)
    assert queue is not None
    await eventually(
        lambda: notifier.is_subscribed(channel) and not queue.attempting and queue.registered,
        what="the head subscribed and queued in Redis",
    )
    mark = commands.mark()
    for turn in range(2):
        await within(
            asyncio.gather(*(lease.release() for lease in held)), what="four releases at once"
        )
        served = waiters[4 * turn : 4 * turn + 4]
        held = await within(asyncio.gather(*served), what=f"the tasks of turn {turn} served")
        assert all(not waiter.done() for waiter in waiters[4 * turn + 4 :])
    await within(asyncio.gather(*(lease.release() for lease in held)), what="the last releases")
    assert commands.since(mark) == Counter({"EVALSHA semaphore-release": 12})
    assert not (await semaphore.info()).holders
