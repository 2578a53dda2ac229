"""Seeded cancellation fuzzing: acquire, extend, release and `async with`, cancelled at their
N-th await point, for every N from 0 to 40, in a seeded random order.

`CancelAtStep` drives the operation's coroutine and, the N-th time it suspends, calls
`Task.cancel()` on the task running it: the cancellation lands exactly at that await point,
the way `asyncio.timeout` or a `TaskGroup` would deliver it (N = 0 cancels the task before
it starts). On a warm connection an operation has few await points, so each N is also run
on a cold pool (connect and handshake first) and with the scripts flushed from the server
(NOSCRIPT, then the EVAL fallback). After every run:

- a cancellation requested while the operation was pending is never lost (the task ends
  in `CancelledError`);
- no lock key is left held by a task that finished (checked without any cleanup where the
  contract promises it: a cancelled acquire, release, `async with`), and no waiter queued;
- a cancelled extend leaves the lease held (its expiry is reset or not, nothing else);
- the client still answers correctly: SET/GET round trips, and every connection in its
  pool answers its own ECHO (no reply left unread on a connection).

The order of the runs is shuffled with `SEED`, so each run starts from whatever the
previous ones left; a failure message names the seed and the runs before it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, Literal, TypeVar

import pytest
import redis.asyncio

from aiolock import Lease, Lock
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys

from ..support.waits import eventually, within

T = TypeVar("T")

SEED = 20261122
STEPS = range(41)
Operation = Literal["acquire", "acquire-waiting", "extend", "release", "async-with"]
Condition = Literal["warm", "cold", "noscript"]
CONDITIONS: tuple[Condition, ...] = ("warm", "cold", "noscript")


class CancelAtStep(Generic[T]):
    """Await `coro`, cancelling the running task when `coro` suspends for the `n`-th time."""

    def __init__(self, coro: Coroutine[Any, Any, T], n: int) -> None:
        self._coro = coro
        self.n = n
        self.steps = 0
        self.fired = False

    def __await__(self) -> Generator[Any, Any, T]:
        coro = self._coro
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                result: T = stop.value
                return result
            self.steps += 1
            if self.steps == self.n:
                task = asyncio.current_task()
                assert task is not None
                task.cancel()  # delivered at this very await point
                self.fired = True
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # noqa: BLE001 - thrown into the coroutine, as a Task does
                value, error = None, exc


async def run_cancelled_at(
    factory: Callable[[], Coroutine[Any, Any, T]], n: int
) -> tuple[str, T | None, CancelAtStep[T] | None]:
    """Run `factory()` in a task cancelled at its `n`-th await point (n = 0: before it runs).

    Returns the outcome ("done" or "cancelled"), the result, and the driver (None for 0).
    """
    driver: CancelAtStep[T] | None = None

    async def runner() -> T:
        nonlocal driver
        driver = CancelAtStep(factory(), n)
        return await driver

    task = asyncio.create_task(runner())
    if n == 0:
        task.cancel()
    try:
        return "done", await within(task, what=f"the operation cancelled at step {n}"), driver
    except asyncio.CancelledError:
        if not task.cancelled():
            raise  # the test itself was cancelled
        return "cancelled", None, driver


async def assert_client_answers(client: redis.asyncio.Redis, tag: str) -> None:
    """Every reply matches its own command, on every connection the pool holds."""
    for i in range(5):
        await client.set(f"{tag}:probe:{i}", f"value-{i}", ex=60)
    for i in range(5):
        assert await client.get(f"{tag}:probe:{i}") == f"value-{i}".encode()
    echoes = await asyncio.gather(*(client.echo(f"{tag}:{i}") for i in range(8)))
    assert echoes == [f"{tag}:{i}".encode() for i in range(8)]
    pool = client.connection_pool
    assert not pool._in_use_connections, "a connection was never given back to the pool"
    for i, connection in enumerate(list(pool._available_connections)):
        if not connection.is_connected:
            continue
        await connection.send_command("ECHO", f"{tag}:conn:{i}")
        reply = await connection.read_response()
        assert reply == f"{tag}:conn:{i}".encode(), f"connection {i} answered {reply!r}"


class Fuzzer:
    """Runs one operation cancelled at each step, in a seeded order, and checks after each."""

    def __init__(self, client: redis.asyncio.Redis, name: str, operation: Operation) -> None:
        self.client = client
        self.name = name
        self.operation = operation
        self.lock = Lock(client, name, ttl=30)
        self.channel = LockKeys.build("aiolock", name).channel
        self.history: list[str] = []
        self.condition: Condition = "warm"

    def context(self) -> str:
        return f"seed {SEED}, {self.operation}, runs so far: {self.history}"

    async def run(self, condition: Condition, n: int) -> None:
        self.condition = condition
        method = getattr(self, "run_" + self.operation.replace("-", "_"))
        await method(n)
        self.history.append(f"{condition}:{n}:{self.outcome}")
        assert runtime_for(self.client).notifier.queue_length(self.channel) == 0, self.context()
        await assert_client_answers(self.client, f"{self.name}:{n}")

    outcome = ""

    async def prepare(self) -> None:
        """Just before the operation: make it connect, or find its script missing."""
        if self.condition == "cold":
            await self.client.connection_pool.disconnect()
        elif self.condition == "noscript":
            await self.client.script_flush()

    def record(self, outcome: str, driver: CancelAtStep[Any] | None) -> None:
        self.outcome = outcome
        if driver is not None and driver.fired:
            assert outcome == "cancelled", f"cancelled at step {driver.n}, lost: {self.context()}"

    async def free(self, n: int, what: str) -> None:
        assert not await self.lock.locked(), (
            f"{what} at step {n} left the key held: {self.context()}"
        )

    async def run_acquire(self, n: int) -> None:
        await self.prepare()
        outcome, lease, driver = await run_cancelled_at(lambda: self.lock.acquire(timeout=5), n)
        self.record(outcome, driver)
        if lease is not None:
            assert lease.held, self.context()
            await lease.release()
        await self.free(n, "acquire")

    async def run_acquire_waiting(self, n: int) -> None:
        """The lock is held: the acquire queues, subscribes, waits, is woken and tries."""
        holder = await Lock(self.client, self.name, ttl=30).acquire()
        notifier = runtime_for(self.client).notifier
        try:
            await self.prepare()
            task = asyncio.create_task(run_cancelled_at(lambda: self.lock.acquire(timeout=10), n))
            await eventually(
                lambda: task.done() or notifier.is_subscribed(self.channel),
                what=f"the waiting acquire subscribed or ended: {self.context()}",
            )
        finally:
            await holder.release()
        outcome, lease, driver = await within(task, what=f"the waiting acquire at step {n}")
        self.record(outcome, driver)
        if lease is not None:
            assert lease.fencing_token > holder.fencing_token
            await lease.release()
        await self.free(n, "waiting acquire")

    async def run_extend(self, n: int) -> None:
        lease = await self.lock.acquire()
        before = lease.deadline
        await self.prepare()
        outcome, _, driver = await run_cancelled_at(lease.extend, n)
        self.record(outcome, driver)
        assert lease.held and not lease.lost, f"extend at step {n}: {self.context()}"
        assert lease.deadline >= before
        info = await self.lock.info()
        assert info is not None and info.fencing_token == lease.fencing_token, self.context()
        await lease.release()
        await self.free(n, "extend")

    async def run_release(self, n: int) -> None:
        lease = await self.lock.acquire()
        await self.prepare()
        outcome, _, driver = await run_cancelled_at(lease.release, n)
        self.record(outcome, driver)
        if n == 0:  # never started: the lease is still held, and released here
            assert lease.held
            await lease.release()
        assert lease.released and not lease.lost, f"release at step {n}: {self.context()}"
        await self.free(n, "release")

    async def run_async_with(self, n: int) -> None:
        leases: list[Lease] = []

        async def block() -> None:
            async with self.lock as lease:
                leases.append(lease)
                await asyncio.sleep(0)

        await self.prepare()
        outcome, _, driver = await run_cancelled_at(block, n)
        self.record(outcome, driver)
        for lease in leases:
            assert lease.released and not lease.lost, f"async with at {n}: {self.context()}"
        await self.free(n, "async with")


@pytest.mark.parametrize(
    "operation", ["acquire", "acquire-waiting", "extend", "release", "async-with"]
)
async def test_cancelled_at_every_await_point(
    client: redis.asyncio.Redis, name: str, operation: Operation
) -> None:
    fuzzer = Fuzzer(client, name, operation)
    order = [(condition, n) for condition in CONDITIONS for n in STEPS]
    random.Random(f"{SEED}:{operation}").shuffle(order)
    for condition, n in order:
        await fuzzer.run(condition, n)
    outcomes = {entry.rsplit(":", 1)[1] for entry in fuzzer.history}
    assert "cancelled" in outcomes, fuzzer.context()
    assert "done" in outcomes, f"40 steps never let the operation finish: {fuzzer.context()}"
    assert not await fuzzer.lock.locked()


async def test_the_driver_cancels_at_the_requested_await_point() -> None:
    """`CancelAtStep` itself: the cancellation lands at the n-th suspension, not later."""
    reached: list[int] = []

    async def three_steps() -> str:
        for i in range(1, 4):
            reached.append(i)
            await asyncio.sleep(0)
        return "finished"

    outcome, _, driver = await run_cancelled_at(three_steps, 2)
    assert outcome == "cancelled" and driver is not None and driver.fired
    assert reached == [1, 2]
    reached.clear()
    outcome, result, driver = await run_cancelled_at(three_steps, 4)
    assert (outcome, result, reached) == ("done", "finished", [1, 2, 3])
    assert driver is not None and not driver.fired and driver.steps == 3
    outcome, _, driver = await run_cancelled_at(three_steps, 0)
    assert outcome == "cancelled" and driver is None
