"""The watchdog: renewal batches, abandoned leases, re-entrancy."""

from __future__ import annotations

import asyncio
import gc
import sys
import uuid
import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.connection import Connection

from aiolock import Lock, ReadWriteLock, Semaphore
from aiolock._engine.runtime import runtime_for
from aiolock._transport import clients as _clients
from aiolock._transport.base import CommandTransport
from aiolock._transport.direct import DirectTransport

from ..conftest import _commands_in, make_client
from ..support.load import scaled
from ..support.waits import eventually, within


async def test_a_garbage_collected_lease_warns_and_is_released(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=30)
    lease = await lock.acquire()
    assert await lock.locked()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del lease
        gc.collect()
    assert any(
        issubclass(w.category, ResourceWarning) and "garbage-collected" in str(w.message)
        for w in caught
    )
    # The scheduler releases the abandoned key instead of letting it block for 30 s.

    async def released() -> bool:
        return not await lock.locked()

    await eventually(released, what="the abandoned lease's key released", interval=0.01)
    await within(runtime_for(client).scheduler.wait_idle(), what="the scheduler to end")


@pytest.fixture
def no_cycle_collector() -> Iterator[None]:
    """Only reference counting frees objects while the test runs (as with gc.disable() in
    an application): what only the cycle collector would free stays."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@pytest.mark.usefixtures("no_cycle_collector")
async def test_a_dropped_lease_is_freed_at_once_after_the_eval_fallback(
    client: redis.asyncio.Redis, name: str
) -> None:
    """The first acquire on a server without the scripts goes EVALSHA, NOSCRIPT, EVAL. The
    NoScriptError is in a reference cycle (redis-py's frame in its traceback holds it), and
    from Python 3.12 on a finished frame keeps its caller: through the traceback, the
    acquire's frame and the lease it returned. The lease must not wait for the cycle
    collector (which may never run) to be freed, warned about and released."""
    await client.script_flush()  # also on the shared server: this acquire sees NOSCRIPT
    lease = await Lock(client, name, ttl=30).acquire()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del lease  # the last reference of this test: its __del__ warns once it is freed
        # Freed by reference counting, possibly an event-loop turn later (redis-py 5.0 with
        # fakeredis holds it until then), never by the cycle collector, which is off.
        await eventually(
            lambda: any(issubclass(w.category, ResourceWarning) for w in caught),
            what="the dropped lease freed without the cycle collector (its __del__ warns)",
            timeout=2,
        )
        caught.clear()  # a warning's source is the lease itself

    async def released() -> bool:
        return not await Lock(client, name).locked()

    await eventually(released, what="the dropped lease's key released", interval=0.01)
    await within(runtime_for(client).scheduler.wait_idle(), what="the scheduler to end")


@pytest.mark.real_only
@pytest.mark.parametrize("send", ["direct", "execute_command"])
async def test_the_eval_fallback_is_not_sent_under_the_noscript_error(
    server_url: str, name: str, send: str
) -> None:
    """The EVAL sent after a NOSCRIPT is sent once that error is no longer being handled.

    Sent inside the `except`, every layer below it runs with the error as the exception
    being handled, and one that keeps it (fakeredis's Lua bridge does, on Python 3.12+)
    keeps its traceback: the frames of the acquire and, through them, the lease it returned,
    which is then never garbage-collected (the test above, on fakeredis).
    """
    handled: list[BaseException | None] = []

    class Writer:
        """The connection's stream writer, noting what is being handled at each EVAL."""

        def __init__(self, writer: Any) -> None:
            self._writer = writer

        def _note(self, packed: bytes) -> None:
            if any(args[0].upper() == b"EVAL" for args, _ in _commands_in(packed)):
                handled.append(sys.exception())

        def write(self, data: bytes) -> None:
            self._note(bytes(data))
            self._writer.write(data)

        def writelines(self, data: Iterable[bytes]) -> None:
            chunks = list(data)
            self._note(b"".join(chunks))
            self._writer.writelines(chunks)

        def __getattr__(self, attribute: str) -> Any:
            return getattr(self._writer, attribute)

    class Recording(Connection):
        async def _connect(self) -> None:
            await super()._connect()  # type: ignore[no-untyped-call]
            self._writer = Writer(self._writer)  # type: ignore[assignment]

    if send == "direct":
        _clients.DIRECT_CONNECTIONS.add(Recording)
    client = make_client(server_url, connection_class=Recording)
    try:
        assert type(runtime_for(client).backend.transport) is (
            DirectTransport if send == "direct" else CommandTransport
        )
        await client.script_flush()
        lease = await Lock(client, name, ttl=5).acquire()
        await lease.release()
        assert handled, "no EVAL was sent: the scripts were not flushed"
        assert handled == [None] * len(handled), f"EVAL sent while handling {handled}"
    finally:
        _clients.DIRECT_CONNECTIONS.discard(Recording)
        await client.aclose()


async def test_entering_a_held_lock_again_in_the_same_task_raises(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=5)
    async with lock:
        with pytest.raises(RuntimeError, match="not reentrant"):
            async with lock:
                pytest.fail("must not run")
        assert await lock.locked()
    assert not await lock.locked()


async def test_renewal_stops_when_every_lease_is_released(
    client: redis.asyncio.Redis, name: str
) -> None:
    scheduler = runtime_for(client).scheduler
    ttl = scaled(0.2)  # none lost to a loaded machine's stall before it is released
    leases = [await Lock(client, f"{name}:{i}", ttl=ttl).acquire() for i in range(10)]
    assert scheduler.active == 10
    for lease in leases:
        await lease.release()
    assert scheduler.active == 0
    await asyncio.wait_for(scheduler.wait_idle(), 5)
    assert not scheduler.running


def test_a_clients_runtime_goes_with_it_once_its_event_loop_ended(server_url: str) -> None:
    """A program that runs an event loop per job (`asyncio.run` per task of a job queue)
    with a client of its own: once the loop ended and the client was dropped, nothing of
    either stays, the client's runtime included, although leases were renewed and handed
    over in it. (The watchdog kept its records of released leases until each came due;
    the loop's end left them for ever, and with them the lock, the client it holds, and so
    the runtime whose key that client is.)"""

    async def job(name: str) -> weakref.ref[redis.asyncio.Redis]:
        client = redis.asyncio.Redis.from_url(server_url)
        first = await Lock(client, name, ttl=5).acquire()
        second = asyncio.create_task(Lock(client, name, ttl=5).acquire())
        notifier = runtime_for(client).notifier
        channel = f"aiolock:{{{name}}}:released"
        await eventually(lambda: notifier.queue_length(channel) >= 1, what="the second waits")
        await first.release()
        await (await within(second, what="the hand-over")).release()
        async with Semaphore(client, name + ":sem", limit=2, ttl=5):
            pass
        async with ReadWriteLock(client, name + ":rw", ttl=5).read():
            pass
        await client.aclose()
        return weakref.ref(client)

    gone = asyncio.run(job(f"aiolock-test:{uuid.uuid4().hex}"))
    gc.collect()
    assert gone() is None, "the client (and its runtime) outlived its event loop"
