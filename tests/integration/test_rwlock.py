"""`ReadWriteLock`: readers share, a writer is alone, writers come first; leases like a lock's.

Each client stands for a process (its own notifier and wait queues); the dead-writer test and
the checker's runs use real processes.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
import redis.asyncio

from aiolock import LeaseLostError, LossReason, ReadWriteLock
from aiolock._lua.rwlock import WRITER_MARK_MS
from aiolock._primitives.rwlock import _RWKeys

from ..conftest import CommandLog, make_client
from ..support.load import scaled
from ..support.waits import eventually, until_cancelled, within


async def writers_queued(client: redis.asyncio.Redis, name: str, count: int) -> None:
    queue = _RWKeys.build("aiolock", name).writers[0]

    async def enough() -> bool:
        return await client.zcard(queue) >= count

    await eventually(enough, what=f"{count} writer process(es) queued", interval=0.001)


async def test_readers_share_and_a_writer_is_alone(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    inside: Counter[str] = Counter()
    most_readers = 0
    violations: list[str] = []
    done = 0
    ttl = scaled(10.0)  # (the bound below, under it, must outlast a loaded machine's run)

    async def reader(client: redis.asyncio.Redis) -> None:
        nonlocal most_readers, done
        for _ in range(6):
            async with ReadWriteLock(client, name, ttl=ttl).read():
                if inside["write"]:
                    violations.append("a reader inside with the writer")
                inside["read"] += 1
                most_readers = max(most_readers, inside["read"])
                await asyncio.sleep(0.004)
                inside["read"] -= 1
        done += 1

    async def writer(client: redis.asyncio.Redis) -> None:
        for _ in range(4):
            async with ReadWriteLock(client, name, ttl=ttl).write():
                if inside["write"] or inside["read"]:
                    violations.append(f"a writer inside with {dict(inside)}")
                inside["write"] += 1
                await asyncio.sleep(0.002)
                inside["write"] -= 1

    tasks = [reader(clients[i % 4]) for i in range(8)] + [writer(clients[i]) for i in (0, 2)]
    # Each release reaches the next in line: a grant left unheard would idle the lock
    # until the waiters' fallback check (the ttl).
    await within(
        asyncio.gather(*tasks), what="the readers and writers, never idle", timeout=0.8 * ttl
    )
    assert not violations, violations[:5]
    assert most_readers >= 2, "readers never overlapped"
    info = await ReadWriteLock(clients[0], name).info()
    assert info.readers == () and info.writer is None


async def test_a_waiting_writer_stops_new_readers_and_gets_in_once_the_readers_left(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    first = await ReadWriteLock(clients[0], name, ttl=10).read().acquire()
    second = await ReadWriteLock(clients[1], name, ttl=10).read().acquire()
    writer = asyncio.create_task(ReadWriteLock(clients[2], name, ttl=10).write().acquire())
    await writers_queued(clients[0], name, 1)
    late = ReadWriteLock(clients[3], name, ttl=10)
    assert await late.read().try_acquire() is None, "a new reader passed a waiting writer"
    late_reader = asyncio.create_task(late.read().acquire())
    readers_queue = _RWKeys.build("aiolock", name).readers[0]

    async def reader_queued() -> bool:
        return await clients[0].zcard(readers_queue) == 1

    await eventually(reader_queued, what="the late reader queued", interval=0.001)
    await first.release()
    assert not writer.done()
    await second.release()
    lease = await within(writer, what="the writer, once the readers left")
    assert not late_reader.done()
    info = await late.info()
    assert info.writer is not None and info.writer.fencing_token == lease.fencing_token
    assert info.readers_waiting == 1
    await lease.release()
    reader = await within(late_reader, what="the reader after the writer")
    assert reader.fencing_token > lease.fencing_token > second.fencing_token
    await reader.release()


@pytest.mark.real_only
async def test_a_writer_arriving_during_a_stream_of_readers_gets_in(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """Readers keep coming, each overlapping the next: without writers first, the writer
    would never find the lock free."""
    stop = asyncio.Event()
    entered: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()

    async def stream(client: redis.asyncio.Redis) -> None:
        side = ReadWriteLock(client, name, ttl=10).read()
        while not stop.is_set():
            async with side:
                entered.append(("read", loop.time()))
                await asyncio.sleep(0.03)

    readers = [asyncio.create_task(stream(clients[i % 3])) for i in range(6)]
    await eventually(lambda: len(entered) >= 12, what="the stream of readers flowing")
    arrived = loop.time()
    async with ReadWriteLock(clients[3], name, ttl=10).write():
        got_in = loop.time()
        entered.append(("write", got_in))
        inside = len(entered)
    stop.set()
    await within(asyncio.gather(*readers), what="the readers to stop")
    # The writer waited for the readers inside when it came (each holds 30 ms), no longer.
    assert got_in - arrived < 1.0, f"the writer waited {got_in - arrived:.3f}s"
    assert len(entered) > inside, "readers went on after the writer"


async def test_a_cancelled_waiting_writer_lets_the_readers_in_at_once(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    holder = await ReadWriteLock(clients[0], name, ttl=10).read().acquire()
    writer = asyncio.create_task(ReadWriteLock(clients[1], name, ttl=10).write().acquire())
    await writers_queued(clients[0], name, 1)
    reader = asyncio.create_task(ReadWriteLock(clients[2], name, ttl=10).read().acquire())
    readers_queue = _RWKeys.build("aiolock", name).readers[0]

    async def reader_queued() -> bool:
        return await clients[0].zcard(readers_queue) == 1

    await eventually(reader_queued, what="the reader queued behind the writer", interval=0.001)
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await within(writer, what="the cancelled writer")
    # Well within the writer's mark: its withdrawal served the queued reader.
    lease = await within(reader, what="the reader", timeout=WRITER_MARK_MS / 2000)
    keys = _RWKeys.build("aiolock", name)
    assert await clients[0].zcard(keys.writers[0]) == 0
    await lease.release()
    await holder.release()


async def test_a_lost_reader_and_a_lost_writer_have_their_bodies_cancelled(
    client: redis.asyncio.Redis, name: str
) -> None:
    rw = ReadWriteLock(client, name, ttl=scaled(0.6))
    for side in (rw.read(), rw.write()):
        with pytest.raises(LeaseLostError) as caught:
            async with side as lease:
                await client.hdel(rw.key, f"p:{lease.token}")
                await until_cancelled(what="the body cancelled by the loss")
        assert caught.value.reason is LossReason.NOT_OWNER


async def test_a_task_holding_either_side_cannot_wait_for_either_side(
    client: redis.asyncio.Redis, name: str
) -> None:
    rw = ReadWriteLock(client, name, ttl=10)
    async with rw.read():
        for side in (rw.read(), rw.write()):
            with pytest.raises(RuntimeError, match="already held by this task"):
                await side.acquire(timeout=1)
        assert await rw.write().try_acquire() is None  # a single try is allowed
        other = await rw.read().try_acquire()  # and finds readers welcome
        assert other is not None
        await other.release()
    async with rw.write():
        with pytest.raises(RuntimeError, match="already held by this task"):
            await rw.read().acquire()


@pytest.mark.real_only
async def test_a_waiting_writer_refreshes_its_place_and_waiting_readers_are_silent(
    server_url: str, name: str
) -> None:
    logs = [CommandLog(), CommandLog()]
    holder_client, waiter_client = (make_client(server_url, log) for log in logs)
    try:
        for client in (holder_client, waiter_client):
            lease = await ReadWriteLock(client, f"{name}:warm-up").write().acquire()
            await lease.release()
        writer_lease = await ReadWriteLock(holder_client, name, ttl=10).write().acquire()
        reader = asyncio.create_task(ReadWriteLock(waiter_client, name, ttl=10).read().acquire())
        await eventually(
            lambda: logs[1].commands.count("EVALSHA rw-acquire-read") >= 2,
            what="the reader queued and subscribed",
        )
        mark = logs[1].mark()
        await asyncio.sleep(1.0)  # a stretch of waiting: the reader sends nothing
        assert logs[1].since(mark) == Counter()
        await writer_lease.release()
        lease = await within(reader, what="the reader")
        await lease.release()

        reader_lease = await ReadWriteLock(holder_client, name, ttl=10).read().acquire()
        writer = asyncio.create_task(ReadWriteLock(waiter_client, name, ttl=10).write().acquire())
        await writers_queued(holder_client, name, 1)
        mark = logs[1].mark()
        await asyncio.sleep(1.0)
        refreshes = logs[1].since(mark)["EVALSHA rw-acquire-write"]
        assert 2 <= refreshes <= 4, f"{refreshes} refreshes in 1 s"
        await reader_lease.release()
        await (await within(writer, what="the writer")).release()
    finally:
        await holder_client.aclose()
        await waiter_client.aclose()


@pytest.mark.real_only
async def test_queued_writers_keep_their_places_while_another_writer_holds(
    server_url: str, name: str
) -> None:
    """Told that another process's writer got in, a waiting writer still refreshes its
    place within its mark: the writers' queue keeps its order however long the hold."""
    clients = [make_client(server_url) for _ in range(4)]
    try:
        first = await ReadWriteLock(clients[0], name, ttl=10).write().acquire()
        waiting = []
        for index in (1, 2, 3):
            side = ReadWriteLock(clients[index], name, ttl=10).write()
            waiting.append(asyncio.create_task(side.acquire()))
            await writers_queued(clients[0], name, index)
        await first.release()
        second = await within(waiting[0], what="the first queued writer")
        queue = _RWKeys.build("aiolock", name).writers[0]
        places = await clients[0].zrange(queue, 0, -1, withscores=True)
        assert len(places) == 2
        await asyncio.sleep(2 * WRITER_MARK_MS / 1000)  # held for two marks
        assert await clients[0].zrange(queue, 0, -1, withscores=True) == places
        await second.release()
        third = await within(waiting[1], what="the second queued writer")
        assert not waiting[2].done()
        await third.release()
        await (await within(waiting[2], what="the third queued writer")).release()
    finally:
        for client in clients:
            await client.aclose()


@pytest.mark.parametrize("side", ["read", "write"])
async def test_leases_handed_between_processes_are_never_left_idle(
    clients: list[redis.asyncio.Redis], name: str, side: str
) -> None:
    """Two processes, three tasks each, taking turns (writers; or readers kept waiting by
    a writer every other turn): each release reaches the next in line, so the run takes a
    fraction of a second; a grant left unheard would idle the lock until the fallback check
    (the ttl: 10 s, scaled by the machine's load, as the bound under it)."""
    ttl = scaled(10.0)

    async def worker(client: redis.asyncio.Redis, index: int) -> None:
        rw = ReadWriteLock(client, name, ttl=ttl)
        for turn in range(4):
            writing = side == "write" or (turn + index) % 3 == 0
            async with rw.write() if writing else rw.read():
                await asyncio.sleep(0.01)

    work = asyncio.gather(*(worker(clients[i % 2], i) for i in range(6)))
    await within(work, what="24 turns without idling", timeout=ttl / 2)


@pytest.mark.real_only
@pytest.mark.parametrize("side", [0, 1], ids=["read", "write"])
async def test_a_grant_is_announced_apart_from_the_granted_leases_own_release(
    clients: list[redis.asyncio.Redis], name: str, side: int
) -> None:
    """A process tells its own release of a lease (from the reply) from the channel's echo
    by the released fencing token; the announcement of the grant that gave it that lease
    must not look like such an echo, or the reply's news (a grant to the process's own
    waiters) is dropped as already seen."""
    keys = _RWKeys.build("aiolock", name)
    rw = ReadWriteLock(clients[0], name, ttl=10)
    blocker = await (rw.read() if side else rw.write()).acquire()
    other = ReadWriteLock(clients[1], name, ttl=10)
    waiting = asyncio.create_task((other.write() if side else other.read()).acquire())
    queue = keys.writers[0] if side else keys.readers[0]

    async def queued() -> bool:
        return await clients[0].zcard(queue) == 1

    await eventually(queued, what="the waiter queued", interval=0.001)
    pubsub = clients[2].pubsub()
    await pubsub.subscribe(keys.channels[side])
    try:
        await blocker.release()
        lease = await within(waiting, what="the waiter granted")
        message = None
        while message is None or message["type"] != "message":
            message = await within(pubsub.get_message(timeout=1.0), what="the grant's announcement")
        first = message["data"].decode().split(" ")[0]
        assert first != str(lease.fencing_token)
        await lease.release()
    finally:
        await pubsub.aclose()
