"""Waiting: notified hand-off, expiry fallback, local FIFO, clean shutdown of background tasks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio

from aiolock import Lease, Lock, ReadLock, ReadWriteLock, Semaphore
from aiolock._engine.release import ReleasePath
from aiolock._engine.runtime import Runtime, runtime_for
from aiolock._engine.wait_queue import Waiter
from aiolock._lua.layout import LockKeys
from aiolock._ops.inspection import read_locks
from aiolock._transport.backend import Backend

from ..conftest import make_client
from ..support.load import scaled
from ..support.pools import ClosedByItsUser
from ..support.recorded import handled_by_redis_py
from ..support.servers import RedisServer
from ..support.waits import eventually, within


async def queued(client: redis.asyncio.Redis, lock: Lock, count: int) -> None:
    """Wait until `count` tasks of this process are queued for `lock`."""
    notifier = runtime_for(client).notifier
    channel = f"aiolock:{{{lock.name}}}:released"
    await eventually(
        lambda: notifier.queue_length(channel) >= count, what=f"{count} task(s) queued here"
    )


def running(backend: Runtime) -> tuple[bool, bool]:
    return backend.scheduler.running, backend.notifier.running


async def test_release_in_another_client_wakes_the_waiter_at_once(
    client: redis.asyncio.Redis, backend_kind: str, request: pytest.FixtureRequest, name: str
) -> None:
    """Two clients stand for two processes: the wake-up comes by pub/sub, not by polling."""
    if backend_kind == "real":
        other = make_client(request.getfixturevalue("server_url"))
    else:
        import fakeredis

        other = fakeredis.FakeAsyncRedis(connection_pool=client.connection_pool)
    try:
        holder = await Lock(other, name, ttl=30).acquire()
        waiting = asyncio.create_task(Lock(client, name, ttl=30).acquire())
        await queued(client, Lock(client, name), 1)
        loop = asyncio.get_running_loop()
        released_at = loop.time()
        await holder.release()
        lease = await asyncio.wait_for(waiting, 5)
        # The holder's key had ~30 s left: only a notification explains a fast wake-up.
        assert loop.time() - released_at < 2.0
        await lease.release()
    finally:
        if other is not client:
            await other.aclose()


async def test_expiry_wakes_the_waiter_without_a_notification(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=0.3, renew=False)
    await client.ping()  # a connection open: the acquire must be answered within 0.3 s
    loop = asyncio.get_running_loop()
    # (before the acquire is sent: its key expires at least 0.3 s after this, however late
    # its reply is read)
    started = loop.time()
    stale = await lock.acquire()  # never released: it simply expires
    lease = await Lock(client, name, ttl=5).acquire(timeout=5)
    waited = loop.time() - started
    assert 0.2 < waited < 1.5, "woken by the holder's pttl, not by a long fixed poll"
    assert lease.fencing_token > stale.fencing_token
    assert stale.lost or stale.remaining() == 0.0
    await lease.release()
    await asyncio.wait_for(stale.wait_lost(), 5)


async def test_local_waiters_are_served_first_come_first_served(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=5)
    holder = await lock.acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        async with Lock(client, name, ttl=5):
            order.append(i)

    tasks = []
    for i in range(6):
        tasks.append(asyncio.create_task(waiter(i)))
        await queued(client, lock, i + 1)
    await holder.release()
    await within(asyncio.gather(*tasks), what="six waiters served in turn")
    assert order == list(range(6))


async def test_a_waiter_that_times_out_passes_its_turn_on(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=5)
    holder = await lock.acquire()
    impatient = asyncio.create_task(Lock(client, name).acquire(timeout=0.2))
    await queued(client, lock, 1)
    patient = asyncio.create_task(Lock(client, name).acquire(timeout=10))
    await queued(client, lock, 2)
    with pytest.raises(TimeoutError):
        await within(impatient, what="an acquire with a 0.2 s timeout")
    await holder.release()
    lease = await asyncio.wait_for(patient, 5)
    await lease.release()


async def test_background_tasks_end_when_idle(client: redis.asyncio.Redis, name: str) -> None:
    backend = runtime_for(client)
    lock = Lock(client, name, ttl=scaled(0.3))
    holder = await lock.acquire()
    waiting = asyncio.create_task(Lock(client, name).acquire())
    await queued(client, lock, 1)
    assert running(backend) == (True, True)
    await holder.release()
    lease: Lease = await within(waiting, what="the waiter to get the lock")
    await lease.release()
    await asyncio.wait_for(backend.scheduler.wait_idle(), scaled(5))
    await asyncio.wait_for(backend.notifier.wait_idle(), scaled(5))
    assert running(backend) == (False, False)


@pytest.mark.real_only
async def test_a_broken_subscription_does_not_strand_waiters(
    server: RedisServer, name: str
) -> None:
    """The pub/sub connection is killed while a task waits: it still gets the lock."""
    client = make_client(server.url)
    admin = make_client(server.url)
    try:
        lock = Lock(client, name, ttl=30)
        holder = await Lock(admin, name, ttl=30).acquire()
        waiting = asyncio.create_task(lock.acquire())
        await queued(client, lock, 1)
        await admin.client_kill_filter(_type="pubsub")
        await holder.release()  # the notification may be lost with the connection
        lease = await asyncio.wait_for(waiting, 10)
        await lease.release()
    finally:
        await client.aclose()
        await admin.aclose()


@pytest.mark.real_only
async def test_a_release_notification_is_read_past_redis_pys_message_layers(
    server: RedisServer, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each waiting process reads every release of its names: the notifier's session reads
    a plain message from the connection itself, not through redis-py's retry and
    observability layers and its handler dispatch (`PubSub.handle_message`)."""
    handled = handled_by_redis_py(monkeypatch)
    client = make_client(server.url)
    other = make_client(server.url)
    channel = f"aiolock:{{{name}}}:released"
    try:
        notifier = runtime_for(client).notifier
        for _ in range(3):
            holder = await Lock(other, name, ttl=30).acquire()
            waiting = asyncio.create_task(Lock(client, name, ttl=30).acquire())
            await queued(client, Lock(client, name), 1)
            await eventually(lambda: notifier.is_subscribed(channel), what="subscribed")
            await holder.release()
            lease = await asyncio.wait_for(waiting, 5)  # (a notification: the ttl is 30 s)
            await lease.release()
        assert notifier.messages_received == 3
        kinds = [response[0] for response in handled if isinstance(response, list)]
        assert b"subscribe" in kinds, "subscription answers still take redis-py's path"
        assert b"message" not in kinds
    finally:
        await client.aclose()
        await other.aclose()


KINDS = ("lock", "semaphore", "read")


def _contended(kind: str, client: redis.asyncio.Redis, name: str) -> Lock | Semaphore | ReadLock:
    """A primitive of `kind` whose waiters queue while another process holds it (a reader's
    while a writer holds)."""
    if kind == "lock":
        return Lock(client, name, ttl=30)
    if kind == "semaphore":
        return Semaphore(client, name, limit=1, ttl=30)
    return ReadWriteLock(client, name, ttl=30).read()


async def _holder(kind: str, client: redis.asyncio.Redis, name: str) -> Lease:
    if kind == "read":
        return await ReadWriteLock(client, name, ttl=30).write().acquire()
    return await _contended(kind, client, name).acquire()


async def _waiting_in_redis(kind: str, client: redis.asyncio.Redis, name: str) -> int:
    """Tasks waiting as Redis records them (what `info()` and the command line read)."""
    if kind == "semaphore":
        return (await Semaphore(client, name, limit=1).info()).waiting
    if kind == "read":
        return (await ReadWriteLock(client, name).info()).readers_waiting
    (state,) = await read_locks(client, [name])
    return state.waiters


@pytest.mark.parametrize("kind", KINDS)
async def test_every_waiting_task_of_a_process_is_counted(
    clients: list[redis.asyncio.Redis], name: str, kind: str
) -> None:
    """A second task of a process starts waiting after the first is queued in Redis: the
    process's entry counts both (and one again once one of them left)."""
    holder = await _holder(kind, clients[0], name)
    primitive = _contended(kind, clients[1], name)
    first = asyncio.create_task(primitive.acquire())

    async def counted(expected: int) -> bool:
        return await _waiting_in_redis(kind, clients[0], name) == expected

    await eventually(lambda: counted(1), what="the first waiter queued in Redis")
    second = asyncio.create_task(primitive.acquire(timeout=30))
    await eventually(lambda: counted(2), what="both waiters counted", timeout=5)
    third = asyncio.create_task(primitive.acquire(timeout=30))
    await eventually(lambda: counted(3), what="three waiters counted", timeout=5)
    third.cancel()
    await asyncio.gather(third, return_exceptions=True)
    await eventually(lambda: counted(2), what="two waiters counted again", timeout=5)
    await holder.release()
    lease = await within(first, what="the first waiter served")
    await lease.release()
    await (await within(second, what="the second waiter served")).release()


@pytest.mark.parametrize(
    "kind", ["lock-held", "lock-free", "semaphore-held", "semaphore-free", "read-held"]
)
async def test_tasks_of_a_process_are_served_in_call_order_whatever_order_redis_answers_in(
    clients: list[redis.asyncio.Redis],
    name: str,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five tasks call acquire() in one loop iteration; Redis answers the first one's try
    last (the others' tries all answered before it is sent). As with asyncio's own lock,
    they are served in call order, whether the name was held (every try refused) or free
    (another task's try took it first)."""
    primitive_kind, state = kind.split("-")
    holder = await _holder(primitive_kind, clients[0], name) if state == "held" else None
    backend = runtime_for(clients[1]).backend
    run = Backend.run
    others_answered = asyncio.Event()
    all_sent = asyncio.Event()  # every task's first try (no answer before: a fast server's
    # answer would let a later caller see the queue and wait without trying)
    answered = 0
    tries = 0

    async def first_try_answered_last(self: Backend, *args: Any) -> Any:
        nonlocal answered, tries
        if self is not backend or args[3].operation != "acquire":
            return await run(self, *args)
        tries += 1
        if tries == 5:
            all_sent.set()
        if tries == 1:
            await within(others_answered.wait(), what="the other tasks' first tries answered")
            return await run(self, *args)
        await within(all_sent.wait(), what="every task's first try sent")
        try:
            return await run(self, *args)
        finally:
            answered += 1
            if answered == 4:
                others_answered.set()

    monkeypatch.setattr(Backend, "run", first_try_answered_last)
    order: list[int] = []

    async def task(index: int) -> None:
        async with _contended(primitive_kind, clients[1], name):
            order.append(index)
            await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(task(index)) for index in range(5)]
    await within(others_answered.wait(), what="the other tasks' first tries answered")
    if holder is not None:
        await holder.release()
    await within(asyncio.gather(*tasks), what="every task served")
    assert order == list(range(5))


async def test_a_lease_handed_to_an_earlier_caller_that_is_cancelled_goes_to_the_next(
    clients: list[redis.asyncio.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first caller's try is answered last (refused); the second caller's took the
    free lock and hands it to the first, which is cancelled before it takes it: the lease
    goes to the next waiter, and nothing stays held."""
    backend = runtime_for(clients[1]).backend
    run = Backend.run
    others_answered = asyncio.Event()
    all_sent = asyncio.Event()  # every task's first try, before any answer
    tries = 0

    async def first_try_answered_last(self: Backend, *args: Any) -> Any:
        nonlocal tries
        if self is not backend or args[3].operation != "acquire":
            return await run(self, *args)
        tries += 1
        if tries == 3:
            all_sent.set()
        if tries == 1:
            await within(others_answered.wait(), what="the other tasks' first tries answered")
            return await run(self, *args)
        await within(all_sent.wait(), what="every task's first try sent")
        try:
            return await run(self, *args)
        finally:
            if tries >= 3:
                others_answered.set()

    hand = Waiter.hand
    cancelled: list[int] = []

    def hand_and_cancel(waiter: Waiter, lease: object) -> None:
        hand(waiter, lease)
        if not cancelled and waiter.task is not None:
            cancelled.append(waiter.ticket)
            waiter.task.cancel()

    monkeypatch.setattr(Backend, "run", first_try_answered_last)
    monkeypatch.setattr(Waiter, "hand", hand_and_cancel)
    order: list[int] = []

    async def task(index: int) -> None:
        async with Lock(clients[1], name, ttl=10):
            order.append(index)

    tasks = [asyncio.create_task(task(index)) for index in range(3)]
    results = await within(
        asyncio.gather(*tasks, return_exceptions=True), what="every task served or cancelled"
    )
    assert cancelled, "a lease was handed to the first caller"
    assert isinstance(results[0], asyncio.CancelledError)
    assert order == [1, 2]
    assert not await Lock(clients[0], name).locked()


async def test_a_head_woken_as_an_earlier_caller_queues_ahead_waits_its_turn(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """The head has a wake-up pending when a task that called earlier queues ahead of it
    (its first try refused): the former head keeps the wake-up for its next turn and
    waits, without spinning the event loop."""
    holder = await Lock(clients[0], name, ttl=10).acquire()
    lock = Lock(clients[1], name, ttl=10)
    waiting = asyncio.create_task(lock.acquire(timeout=10))
    await queued(clients[1], lock, 1)
    notifier = runtime_for(clients[1]).notifier
    channel = f"aiolock:{{{name}}}:released"
    queue = notifier.queue_for(channel)
    assert queue is not None
    await eventually(lambda: queue.registered, what="the head's entry in Redis")
    loop = asyncio.get_running_loop()
    queue.waiters[0].wake()  # a wake-up, pending...
    earlier = notifier.join(channel, ticket=-1)  # ...as an earlier caller queues ahead
    try:
        before = loop.time()
        await asyncio.sleep(0.1)
        assert loop.time() - before < 1.0, "the event loop was held"
        assert not waiting.done()
    finally:
        leaving = notifier.leave(earlier, acquired=False)
        assert leaving is None
    await holder.release()
    lease = await within(waiting, what="the waiter served by the release")
    await lease.release()


async def test_a_withdrawal_left_running_opens_nothing_in_a_pool_closed_under_it(
    server_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two tasks of a process wait for one of two permits held elsewhere, and each is
    granted one in turn by a release elsewhere (the queue's entry put back in line for the
    second). When the second acquire returns, two of its calls are still reading their
    answers: its renewal (the grantee's, sent before the body starts) and the withdrawal of
    its process's entry (it was the last waiter). Its user closes the client as that
    withdrawal takes its connection (at shutdown, say): both go again on connections of
    their own, closed when they end, and the entry is taken out all the same. The pool the
    user closed opens nothing.

    Breaks seen failing: the withdrawal, and the grantee's renewal, each sent again on the
    user's pool, which connects (aiolock's own tasks not `detached`, or either call made
    as any other)."""
    pool = ClosedByItsUser.from_url(server_url)
    client = redis.asyncio.Redis(connection_pool=pool)
    other = make_client(server_url)
    withdrawing = ReleasePath.withdraw_in_background

    async def closed_under_it(self: ReleasePath, *args: Any, **kwargs: Any) -> None:
        pool.close_at = "checkout"
        await withdrawing(self, *args, **kwargs)

    monkeypatch.setattr(ReleasePath, "withdraw_in_background", closed_under_it)
    keys = LockKeys.build("aiolock", name, "sem:")
    notifier = runtime_for(client).notifier
    held: list[Lease] = []
    try:
        held += [await Semaphore(other, name, limit=2, ttl=10).acquire() for _ in range(2)]
        waiting = [
            asyncio.create_task(Semaphore(client, name, limit=2, ttl=10).acquire())
            for _ in range(2)
        ]
        await eventually(lambda: notifier.queue_length(keys.channel) == 2, what="two waiting")
        await held.pop(0).release()
        held.append(await within(waiting[0], what="the first waiter granted a permit"))
        await held.pop(0).release()
        held.append(await within(waiting[1], what="the second granted the next permit"))
        await eventually(lambda: pool.closes == 1, what="the withdrawal taking a connection")

        async def withdrawn() -> bool:
            return not await other.zcard(keys.queue)

        await eventually(withdrawn, what="the queue's entry taken out of Redis")
        await eventually(
            lambda: pool.open_connections() == 0, what="nothing open in the pool closed"
        )
    finally:
        for lease in held:
            await lease.release()
        await pool.disconnect()
        await other.aclose()
