"""Lock events: what listeners see, and that a failing listener never breaks locking."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis.asyncio

import aiolock
from aiolock import EventKind, LockEvent, LossReason

from ..support.load import scaled


@pytest.fixture
def events() -> Iterator[list[LockEvent]]:
    seen: list[LockEvent] = []
    remove = aiolock.add_listener(seen.append)
    try:
        yield seen
    finally:
        remove()


async def test_a_cycle_emits_acquired_renewed_released(
    client: redis.asyncio.Redis, name: str, events: list[LockEvent]
) -> None:
    loop = asyncio.get_running_loop()
    ttl = scaled(0.15)  # renewed within the body, and longer than a loaded machine's stalls
    async with aiolock.Lock(client, name, ttl=ttl) as lease:
        entered = loop.time()
        await asyncio.sleep(ttl * 4 / 3)  # uvloop's timers may wake a fraction of a ms early
        body = loop.time() - entered
    kinds = [event.kind for event in events if event.name == name]
    assert kinds[0] is EventKind.ACQUIRED
    assert EventKind.RENEWED in kinds
    assert kinds[-1] is EventKind.RELEASED
    acquired = next(e for e in events if e.kind is EventKind.ACQUIRED and e.name == name)
    released = next(e for e in events if e.kind is EventKind.RELEASED and e.name == name)
    assert acquired.fencing_token == released.fencing_token == lease.fencing_token
    # One try; two if its answer came after the lease's validity (a loaded machine's stall),
    # which is given back and tried again.
    assert acquired.attempts in (1, 2)
    assert acquired.wait is not None and 0 <= acquired.wait < scaled(1.0)
    assert released.hold is not None and body <= released.hold < body + scaled(1.8)


async def test_timeouts_and_losses_are_events(
    client: redis.asyncio.Redis, name: str, events: list[LockEvent]
) -> None:
    holder = await aiolock.Lock(client, name).acquire()
    with pytest.raises(aiolock.AcquireTimeoutError):
        await aiolock.Lock(client, name).acquire(timeout=0.05)
    await client.delete(aiolock.Lock(client, name).key)
    with pytest.raises(aiolock.LeaseLostError):
        await holder.release()
    timed_out = [e for e in events if e.kind is EventKind.ACQUIRE_TIMED_OUT]
    lost = [e for e in events if e.kind is EventKind.LOST]
    assert len(timed_out) == 1
    # The wait is measured on the loop's clock: at least the timeout, up to a float's rounding
    # of a difference of two large clock readings.
    assert timed_out[0].wait is not None and timed_out[0].wait >= 0.05 - 1e-9
    assert len(lost) == 1
    assert lost[0].reason is LossReason.NOT_OWNER


async def test_a_failing_listener_never_breaks_locking(
    client: redis.asyncio.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: LockEvent) -> None:
        raise RuntimeError("listener bug")

    remove = aiolock.add_listener(broken)
    try:
        async with aiolock.Lock(client, name) as lease:
            assert lease.held
    finally:
        remove()
    assert lease.released
    assert any("event listener" in record.getMessage() for record in caplog.records)


def test_add_listener_checks_its_argument() -> None:
    with pytest.raises(TypeError, match="listener must be callable"):
        aiolock.add_listener("not a function")  # type: ignore[arg-type]
    remove = aiolock.add_listener(lambda event: None)
    remove()
    remove()  # removing twice is harmless
