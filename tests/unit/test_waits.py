"""The tests' bounded waits fail with what they waited for, and pass everything else on."""

from __future__ import annotations

import asyncio

import pytest

from ..support.waits import WaitTimeout, eventually, until_cancelled, within


async def test_eventually_returns_once_the_check_holds() -> None:
    calls: list[int] = []

    async def third_time() -> bool:
        calls.append(1)
        return len(calls) >= 3

    await eventually(third_time, what="a third call")
    await eventually(lambda: True, what="at once")
    assert len(calls) == 3


async def test_a_wait_that_does_not_end_fails_naming_what_it_waited_for() -> None:
    with pytest.raises(WaitTimeout, match=r"after 0\.05s: the thing"):
        await eventually(lambda: False, what="the thing", timeout=0.05)
    with pytest.raises(WaitTimeout, match=r"after 0\.05s: the task"):
        await within(asyncio.Event().wait(), what="the task", timeout=0.05)
    with pytest.raises(WaitTimeout, match=r"no cancellation after 0\.05s: the loss"):
        await until_cancelled(what="the loss", timeout=0.05)


async def test_within_cancels_the_task_it_gave_up_on() -> None:
    task = asyncio.create_task(asyncio.Event().wait())
    with pytest.raises(WaitTimeout):
        await within(task, what="a task", timeout=0.05)
    assert task.cancelled()


async def test_within_passes_the_awaitables_own_timeout_and_cancellation_on() -> None:
    async def own_timeout() -> None:
        raise TimeoutError("its own")

    with pytest.raises(TimeoutError, match="its own") as info:
        await within(own_timeout(), what="a call")
    assert not isinstance(info.value, WaitTimeout)
    task = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await within(task, what="a cancelled task")
