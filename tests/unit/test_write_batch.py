"""The write batch's own rules, on stream writers that record what they are given.

Each test runs on a loop of its own kind: asyncio's, whose ready callbacks the batch sees,
and uvloop's, whose it does not."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Awaitable, Callable
from typing import cast

import pytest

from aiolock._transport.write_batch import WriteBatch, batch_for


class Recording:
    """A stream writer and its transport in one, recording its writes (refusing them, if
    `refuses`)."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log = log
        self.name = name
        self.closing = False
        self.refuses = False
        self.aborted = False

    @property
    def transport(self) -> Recording:
        return self

    def write(self, data: bytes) -> None:
        if self.refuses:
            raise RuntimeError("refused")
        self.log.append(f"{self.name}:{data.decode()}")

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        self.aborted = True

    def writer(self) -> asyncio.StreamWriter:
        return cast(asyncio.StreamWriter, self)


def on_asyncio(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    """`test` run on a new event loop of asyncio's own (whatever loop the suite runs on)."""

    def run() -> None:
        with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
            runner.run(test())  # type: ignore[arg-type]

    run.__name__, run.__doc__ = test.__name__, test.__doc__
    return run


async def _next_pass() -> None:
    """Until the callbacks queued now have run (the batch's among them)."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


@on_asyncio
async def test_held_commands_are_written_at_the_end_of_the_pass_in_order() -> None:
    """While another callback is ready, commands are held; they are written behind it, in
    the order they came: a writer's in one write (a shared connection's calls), the
    writers in the order of their first."""
    loop = asyncio.get_running_loop()
    log: list[str] = []
    first, second = Recording(log, "a"), Recording(log, "b")
    batch = WriteBatch(loop)
    loop.call_soon(lambda: log.append("another callback"))
    assert batch.hold(first.writer(), b"1")
    assert batch.hold(second.writer(), b"2")
    assert batch.hold(first.writer(), b"3")
    assert log == []
    await _next_pass()
    assert log == ["another callback", "a:13", "b:2"]


@on_asyncio
async def test_with_nothing_else_ready_the_caller_writes_at_once() -> None:
    loop = asyncio.get_running_loop()
    log: list[str] = []
    batch = WriteBatch(loop)
    loop.call_soon(lambda: None).cancel()  # a cancelled callback is not one that runs
    assert not batch.hold(Recording(log, "a").writer(), b"1")
    await _next_pass()
    assert log == []


@on_asyncio
async def test_a_writer_collected_before_the_end_of_the_pass_is_not_kept_alive() -> None:
    """A held command does not keep its writer alive: a connection dropped before the end
    of the pass is collected (and its transport closed) as it would be without the batch,
    and its command dropped."""
    loop = asyncio.get_running_loop()
    log: list[str] = []
    dropped, kept = Recording(log, "dropped"), Recording(log, "kept")
    batch = WriteBatch(loop)
    loop.call_soon(lambda: None)
    assert batch.hold(dropped.writer(), b"x")
    assert batch.hold(kept.writer(), b"y")
    gone = weakref.ref(dropped)
    del dropped
    gc.collect()
    assert gone() is None
    await _next_pass()
    assert log == ["kept:y"]


@on_asyncio
async def test_a_closed_connections_command_is_dropped_and_a_refused_one_aborts() -> None:
    """A command whose connection was closed before the end of the pass (its caller was
    cancelled, and redis-py closed it) is not written; a transport that refuses a write is
    aborted (its reader learns it is lost), and the commands after it are still written."""
    loop = asyncio.get_running_loop()
    log: list[str] = []
    closed, refusing, fine = (Recording(log, name) for name in ("closed", "refusing", "fine"))
    refusing.refuses = True
    batch = WriteBatch(loop)
    loop.call_soon(lambda: None)
    for recording in (closed, refusing, fine):
        assert batch.hold(recording.writer(), b"x")
    closed.closing = True
    await _next_pass()
    assert log == ["fine:x"]
    assert refusing.aborted and not fine.aborted and not closed.aborted


def test_a_loop_that_does_not_show_its_ready_callbacks_holds_while_calls_await() -> None:
    """On uvloop, which does not show its ready callbacks, a lone call's command is
    written at once, and one made while another call awaits its reply is held."""
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_holds_while_calls_await())


async def _holds_while_calls_await() -> None:
    loop = asyncio.get_running_loop()
    log: list[str] = []
    batch = WriteBatch(loop)
    loop.call_soon(lambda: None)
    first, second = Recording(log, "a"), Recording(log, "b")
    batch.awaiting = 1
    assert not batch.hold(first.writer(), b"1")
    batch.awaiting = 2
    assert batch.hold(second.writer(), b"2")
    await _next_pass()
    assert log == ["b:2"]


@on_asyncio
async def test_each_loop_has_a_batch_of_its_own_that_does_not_keep_it_alive() -> None:
    loop = asyncio.get_running_loop()
    assert batch_for(loop) is batch_for(loop)
    other = asyncio.new_event_loop()
    try:
        assert batch_for(other) is not batch_for(loop)
    finally:
        other.close()
    gone = weakref.ref(other)
    del other
    gc.collect()
    assert gone() is None
