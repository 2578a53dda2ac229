"""What a quorum records of one node's answers (`aiolock._transport.quorum._Node`): which
calls it answered and which failed unanswered since, read in the order the calls were sent.

The send times here are equal on purpose: uvloop's clock ticks in milliseconds, so calls
sent one after the other on a fast network often share one reading of it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiolock._transport.quorum import _Node
from aiolock.errors import BackendError

TICK = 1.0
"""The one reading of the clock every call here is sent at."""
PATIENCE = 0.2


async def answered() -> str:
    return "OK"


async def timed_out() -> Any:
    """A node's call that got no reply within its bound (as `Backend.run` reports it)."""
    error = BackendError("acquire of 'x': no reply within 2s", operation="acquire", name="x")
    raise error from TimeoutError()


async def in_flight(node: _Node, reply: asyncio.Future[str]) -> asyncio.Task[Any]:
    """A call of `node` that waits for `reply`, once it is sent."""
    task = asyncio.create_task(node.run(reply, TICK))
    await asyncio.sleep(0)  # the task's first step: the call is sent and waits
    assert not task.done()
    return task


async def test_a_call_that_times_out_in_the_tick_of_the_last_answer_marks_the_node() -> None:
    """A call sent after an answered one, in the same clock tick, times out: the node is
    not answering, and a call in flight to it is one that probes it (not waited for
    `PATIENCE` first). Read from send times alone, the failure went unrecorded: a split
    vote then waited for the frozen node's whole bound."""
    node = _Node()
    assert await node.run(answered(), TICK) == "OK"
    with pytest.raises(BackendError):
        await node.run(timed_out(), TICK)
    reply: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    probe = await in_flight(node, reply)
    assert node.unanswered_since(TICK, PATIENCE) == TICK
    assert node.failing
    reply.set_result("OK")
    assert await probe == "OK"
    assert not node.failing  # it answered a call sent after the one that failed


async def test_an_answer_to_a_call_sent_before_the_failed_one_does_not_clear_it() -> None:
    node = _Node()
    earlier: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    first = await in_flight(node, earlier)
    with pytest.raises(BackendError):
        await node.run(timed_out(), TICK)
    earlier.set_result("OK")
    await first
    assert node.failing, "the answer was to a call sent before the one that failed"
    assert await node.run(answered(), TICK) == "OK"
    assert not node.failing


async def test_a_call_cancelled_from_outside_says_nothing_of_the_node() -> None:
    """Not a failure of the node (its own bound fails a call as a timeout), nor an answer."""
    node = _Node()
    assert await node.run(answered(), TICK) == "OK"
    call = await in_flight(node, asyncio.get_running_loop().create_future())
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert not node.failing and not node.in_flight
    assert (node.answered, node.last_answered) == (TICK, 1)
