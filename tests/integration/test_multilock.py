"""MultiLock: several names held as one, all or none; taken in one order (no deadlock), given
back at once when one cannot be had, lost as one, released together; cancellation at every
await point leaves nothing held or queued.

Each client stands for a process (its own notifier and wait queue id).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import redis.asyncio

from aiolock import (
    AcquireTimeoutError,
    BackendError,
    ConfigError,
    EventKind,
    Lease,
    LeaseLostError,
    Lock,
    LossReason,
    MultiLease,
    MultiLock,
)
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys

from ..conftest import CommandLog
from ..support.load import scaled
from ..support.recorded import recorded
from ..support.waits import eventually, until_cancelled, within
from .test_cancel_fuzz import assert_client_answers, run_cancelled_at


async def nothing_left(client: redis.asyncio.Redis, names: list[str], what: str) -> None:
    """No name held, nobody queued for any, in Redis or in this process."""
    notifier = runtime_for(client).notifier
    for lock_name in names:
        keys = LockKeys.build("aiolock", lock_name)
        assert not await Lock(client, lock_name).locked(), f"{what}: {lock_name!r} held"
        assert await client.zcard(keys.queue) == 0, f"{what}: {lock_name!r} queued in Redis"
        assert notifier.queue_length(keys.channel) == 0, f"{what}: {lock_name!r} waited for"


def named(name: str, *suffixes: str) -> list[str]:
    return [f"{name}:{suffix}" for suffix in suffixes]


# --------------------------------------------------------------------------- basics
async def test_every_name_is_held_as_one_and_released_together(
    client: redis.asyncio.Redis, name: str
) -> None:
    a, b, c = named(name, "a", "b", "c")
    multi = MultiLock(client, [c, a, b, a], ttl=10)
    assert multi.names == (a, b, c)  # sorted, the duplicate merged
    async with multi as held:
        assert isinstance(held, MultiLease) and held.names == (a, b, c)
        for lock_name in (a, b, c):
            assert await Lock(client, lock_name).locked()
        tokens = held.fencing_tokens
        assert set(tokens) == {a, b, c}
        assert tokens == {n: lease.fencing_token for n, lease in held.leases.items()}
        assert held.held and not held.lost and held.remaining() > 0
        await held.extend()
    assert all(lease.released for lease in held.leases.values())
    await nothing_left(client, [a, b, c], "after the block")


async def test_acquire_and_release_outside_a_block(client: redis.asyncio.Redis, name: str) -> None:
    names = named(name, "x", "y")
    held = await MultiLock(client, names, ttl=10).acquire()
    assert await MultiLock(client, names, ttl=10).try_acquire() is None
    await nothing_left_but(client, names)
    await held.release()
    await held.release()  # again: nothing
    assert await held.wait_lost() is None
    await nothing_left(client, names, "after release()")


async def test_wait_lost_returns_when_a_name_is_lost_or_all_are_released(
    client: redis.asyncio.Redis, name: str
) -> None:
    names = named(name, "x", "y")
    held = await MultiLock(client, names, ttl=scaled(1.0)).acquire()
    waiting = asyncio.create_task(held.wait_lost())
    await client.delete(LockKeys.build("aiolock", names[1]).lock)
    lost = await within(waiting, what="wait_lost() told of the loss")
    assert isinstance(lost, LeaseLostError) and lost.name == names[1]
    with pytest.raises(LeaseLostError):
        await held.release()
    held = await MultiLock(client, names, ttl=10).acquire()
    waiting = asyncio.create_task(held.wait_lost())
    await asyncio.sleep(0)
    await held.release()
    assert await within(waiting, what="wait_lost() told of the release") is None


async def nothing_left_but(client: redis.asyncio.Redis, names: list[str]) -> None:
    """The names are held, and a try that failed left nobody queued."""
    for lock_name in names:
        assert await Lock(client, lock_name).locked()
        assert await client.zcard(LockKeys.build("aiolock", lock_name).queue) == 0


# --------------------------------------------------------------------------- order
async def rounds_in_opposite_orders(
    clients: tuple[redis.asyncio.Redis, redis.asyncio.Redis], names: list[str], rounds: int
) -> None:
    """Two holders (tasks on the clients given) take {A, B} and {B, A} `rounds` times each;
    never two inside at once, and never stuck (bounded)."""
    inside = 0
    most = 0
    done = Counter[str]()

    async def holder(client: redis.asyncio.Redis, order: list[str], tag: str) -> None:
        nonlocal inside, most
        multi = MultiLock(client, order, ttl=10)
        for _ in range(rounds):
            async with multi:
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0)
                inside -= 1
            done[tag] += 1

    await within(
        asyncio.gather(holder(clients[0], names, "ab"), holder(clients[1], names[::-1], "ba")),
        what=f"{rounds} rounds each of {{A, B}} and {{B, A}} (so far {done})",
        timeout=scaled(60),
    )
    assert done == Counter(ab=rounds, ba=rounds) and most == 1
    await nothing_left(clients[0], names, "after the rounds")


@pytest.mark.real_only
@pytest.mark.timeout(300)  # the rounds' own bound, scaled(60), is at most 240 s
async def test_two_tasks_taking_the_names_in_opposite_orders_1000_times_never_deadlock(
    client: redis.asyncio.Redis, name: str
) -> None:
    await rounds_in_opposite_orders((client, client), named(name, "a", "b"), 1000)


async def test_two_processes_taking_the_names_in_opposite_orders_never_deadlock(
    clients: list[redis.asyncio.Redis], name: str, backend_kind: str
) -> None:
    rounds = 100 if backend_kind == "real" else 20  # fakeredis runs Lua slowly
    await rounds_in_opposite_orders((clients[0], clients[1]), named(name, "a", "b"), rounds)


# --------------------------------------------------------------------------- failures
async def test_a_name_that_cannot_be_had_gives_back_the_ones_taken_at_once(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    a, b, c = named(name, "a", "b", "c")
    other = await Lock(clients[1], b, ttl=10).acquire()
    with pytest.raises(AcquireTimeoutError) as caught:
        await MultiLock(clients[0], [a, b, c], ttl=10, timeout=0.05).acquire()
    error = caught.value
    assert error.name == b and error.timeout == 0.05 and error.holder is not None
    # Right after the error, with no wait: the first name is free, nobody is queued.
    assert not await Lock(clients[0], a).locked()
    for lock_name in (a, b, c):
        assert await clients[0].zcard(LockKeys.build("aiolock", lock_name).queue) == 0
    assert not await Lock(clients[0], c).locked()
    await other.release()
    await nothing_left(clients[0], [a, b, c], "after the failed acquire")


@pytest.mark.real_only
async def test_the_timeout_covers_the_whole_acquisition(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """The first name is free only near the end of the timeout, the second never: the
    acquire gives up at the timeout, not a timeout later, and says how long it waited (at
    least the timeout, at most what the caller saw: a loaded machine may hold the process
    between the two clocks' readings, so no closer bound is asserted)."""
    a, b = named(name, "a", "b")
    timeout = scaled(1.0)
    first = await Lock(clients[1], a, ttl=30).acquire()
    second = await Lock(clients[2], b, ttl=30).acquire()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        loop.call_later(0.8 * timeout, lambda: asyncio.ensure_future(first.release()))
        with pytest.raises(AcquireTimeoutError) as caught:
            await MultiLock(clients[0], [a, b], ttl=10, timeout=timeout).acquire()
        elapsed = loop.time() - started
        assert caught.value.name == b and caught.value.timeout == timeout
        assert timeout <= elapsed < 1.5 * timeout, elapsed
        assert timeout - 0.01 <= caught.value.waited <= elapsed, (caught.value.waited, elapsed)
    finally:
        await second.release()
    await nothing_left(clients[0], [a, b], "after the timeout")


async def test_losing_one_name_cancels_the_body_and_releases_the_others(
    client: redis.asyncio.Redis, name: str
) -> None:
    a, b, c = named(name, "a", "b", "c")
    with (
        recorded(EventKind.LOST) as lost,
        pytest.raises(LeaseLostError) as caught,
    ):
        async with MultiLock(client, [a, b, c], ttl=scaled(1.0)) as held:
            await client.delete(LockKeys.build("aiolock", b).lock)  # b is gone
            await until_cancelled(what="the body, after b was lost")
    error = caught.value
    assert error.name == b and error.reason is LossReason.NOT_OWNER
    assert error.body_completed is False
    assert [event.name for event in lost] == [b]
    assert held.lost and held.loss_reason is LossReason.NOT_OWNER
    assert held.leases[a].released and held.leases[c].released
    assert isinstance(await held.wait_lost(), LeaseLostError)
    await nothing_left(client, [a, b, c], "after the loss")


async def test_a_name_lost_while_waiting_for_the_next_releases_all(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    a, b = named(name, "a", "b")
    other = await Lock(clients[1], b, ttl=30).acquire()
    acquire = asyncio.create_task(MultiLock(clients[0], [a, b], ttl=scaled(1.0)).acquire())
    await eventually(
        lambda: (
            runtime_for(clients[0]).notifier.queue_length(LockKeys.build("aiolock", b).channel) == 1
        ),
        what="the acquire waiting for b",
    )
    with recorded(EventKind.LOST, where=lambda event: event.name == a) as lost:
        await clients[1].delete(LockKeys.build("aiolock", a).lock)  # a, taken first, is gone
        await eventually(lambda: bool(lost), what="a's loss found by its renewal")
    await other.release()  # b is handed over to the acquire, which finds a lost
    with pytest.raises(LeaseLostError) as caught:
        await within(acquire, what="the acquire, once b is free")
    assert caught.value.name == a
    await nothing_left(clients[0], [a, b], "after the loss while waiting")


async def test_a_task_holding_one_of_the_names_is_refused(
    client: redis.asyncio.Redis, name: str
) -> None:
    a, b = named(name, "a", "b")
    async with Lock(client, b, ttl=10):
        with pytest.raises(RuntimeError, match="already held by this task"):
            await MultiLock(client, [a, b], ttl=10).acquire()
    await nothing_left(client, [a, b], "after the refusal")
    async with MultiLock(client, [a, b], ttl=10):
        with pytest.raises(RuntimeError, match="already held by this task"):
            await Lock(client, a, ttl=10).acquire()


async def test_bad_arguments_are_refused_before_anything_is_sent(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    mark = commands.mark()
    with pytest.raises(TypeError, match="names must be a collection of lock names"):
        MultiLock(client, name, ttl=10)
    with pytest.raises(TypeError, match="name must be a str"):
        MultiLock(client, [name, b"x"], ttl=10)  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="names must hold 1 to 1000 distinct names") as error:
        MultiLock(client, [], ttl=10)
    assert error.value.argument == "names"
    with pytest.raises(ConfigError, match="names must hold 1 to 1000"):
        MultiLock(client, (f"{name}:{i}" for i in range(1001)), ttl=10)
    with pytest.raises(ConfigError, match="ttl"):
        MultiLock(client, [name], ttl=-1)
    with pytest.raises(ConfigError, match="timeout"):
        MultiLock(client, [name], timeout=-1)
    multi = MultiLock(client, [name])
    with pytest.raises(ConfigError, match="timeout"):
        await multi.acquire(timeout=float("nan"))
    assert commands.since(mark) == Counter()


# --------------------------------------------------------------------------- renewals
async def test_the_leases_are_renewed_in_one_batch(client: redis.asyncio.Redis, name: str) -> None:
    names = named(name, "a", "b", "c")
    scheduler = runtime_for(client).scheduler
    with recorded(EventKind.RENEWED, where=lambda event: event.name in names) as renewed:
        async with MultiLock(client, names, ttl=scaled(1.0)) as held:
            before = scheduler.batches_sent
            await eventually(lambda: len(renewed) >= 3, what="a renewal of each lease")
            batches = scheduler.batches_sent - before
            assert held.held
    assert batches == 1, (batches, renewed)


# --------------------------------------------------------------------------- cancellation
STEPS = range(61)
SEED = 20261124


@pytest.mark.parametrize("operation", ["acquire", "acquire-waiting", "async-with", "release"])
async def test_cancelled_at_every_await_point_nothing_is_left(
    clients: list[redis.asyncio.Redis], name: str, operation: str
) -> None:
    client, other = clients[0], clients[1]
    names = named(name, "a", "b", "c")
    multi = MultiLock(client, names, ttl=30)
    history: list[str] = []
    order = list(STEPS)
    random.Random(f"{SEED}:{operation}").shuffle(order)
    for n in order:
        factory: Callable[[], Coroutine[Any, Any, Any]]
        blocker = None
        release_after: MultiLease | None = None
        if operation == "acquire":
            factory = lambda: multi.acquire(timeout=5)
        elif operation == "acquire-waiting":
            blocker = await Lock(other, names[1], ttl=30).acquire()
            factory = lambda: multi.acquire(timeout=10)
        elif operation == "async-with":

            async def block() -> None:
                async with multi:
                    await asyncio.sleep(0)

            factory = block
        else:
            release_after = await multi.acquire()
            factory = release_after.release
        if blocker is not None:
            channel = LockKeys.build("aiolock", names[1]).channel
            notifier = runtime_for(client).notifier
            task = asyncio.create_task(run_cancelled_at(factory, n))
            try:
                await eventually(
                    lambda: task.done() or notifier.is_subscribed(channel),  # noqa: B023
                    what=f"the waiting acquire at step {n} subscribed or ended",
                )
            finally:
                await blocker.release()
            outcome, result, driver = await within(task, what=f"step {n}")
        else:
            outcome, result, driver = await run_cancelled_at(factory, n)
        history.append(f"{n}:{outcome}")
        context = f"seed {SEED}, {operation}, runs: {history}"
        if driver is not None and driver.fired:
            assert outcome == "cancelled", f"a cancellation was lost: {context}"
        if isinstance(result, MultiLease):
            assert result.held, context
            await result.release()
        if release_after is not None:
            if n == 0:
                await release_after.release()
            assert all(lease.released for lease in release_after.leases.values()), context
        await nothing_left(client, names, f"step {n}: {context}")
    outcomes = {entry.split(":")[1] for entry in history}
    assert outcomes == {"cancelled", "done"}, history
    await assert_client_answers(client, name)


async def test_a_give_back_past_its_bound_is_a_backend_error_and_the_leases_stay_releasable(
    client: redis.asyncio.Redis,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The releases of a MultiLease outlast their common bound (a process paused in the
    middle of them, seen in the simulation): `release()` raises the documented
    `BackendError`, not a bare `TimeoutError`; the block's exit logs it; the leases not
    released can still be released."""
    from aiolock._primitives import multilock

    names = [f"{name}:a", f"{name}:b", f"{name}:c"]
    called = await MultiLock(client, names[:2], ttl=5).acquire()
    guarded = await MultiLock(client, names[2:], ttl=5).acquire()
    real = multilock._release_quietly

    async def stalled(lease: Lease) -> BaseException | None:
        await asyncio.sleep(0.5)  # past the bound below: the releases never start
        return await real(lease)

    monkeypatch.setattr(multilock, "GIVE_BACK_TIMEOUT", 0.05)
    monkeypatch.setattr(multilock, "_release_quietly", stalled)
    with pytest.raises(BackendError, match=r"did not finish within 0\.05s") as raised:
        await called.release()
    assert raised.value.operation == "release"
    with caplog.at_level("WARNING", logger="aiolock"):
        async with guarded:
            pass
    assert "did not finish within 0.05s" in caplog.text
    monkeypatch.undo()
    for held in (called, guarded):
        assert all(lease.held for lease in held.leases.values())
        await held.release()
    assert not any([await Lock(client, n).locked() for n in names])
