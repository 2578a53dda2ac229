"""An eagerly started task: its first step runs before the caller goes on, as that task, and
the task goes on from there like any other (Python 3.12's factory, or 3.11's by hand)."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from aiolock._aio.eager_start import start_eagerly

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="caller")


async def test_the_first_step_runs_before_the_caller_goes_on_as_the_new_task() -> None:
    loop = asyncio.get_running_loop()
    steps: list[str] = []
    seen: list[asyncio.Task[object] | None] = []
    gate = loop.create_future()

    async def body() -> None:
        seen.append(asyncio.current_task())
        steps.append("first")
        await gate
        seen.append(asyncio.current_task())
        steps.append("second")

    caller = asyncio.current_task()
    task = start_eagerly(loop, body())
    assert steps == ["first"]
    assert asyncio.current_task() is caller
    assert seen == [task]
    gate.set_result(None)
    await asyncio.wait_for(task, 5)
    assert steps == ["first", "second"]
    assert seen == [task, task]


async def test_the_first_steps_context_is_the_tasks_own() -> None:
    loop = asyncio.get_running_loop()
    gate = loop.create_future()
    later: list[str] = []

    async def body() -> None:
        VAR.set("task")
        await gate
        later.append(VAR.get())

    task = start_eagerly(loop, body())
    assert VAR.get() == "caller"
    gate.set_result(None)
    await asyncio.wait_for(task, 5)
    assert later == ["task"]


async def test_a_coroutine_that_ends_in_its_first_step_ends_its_task() -> None:
    loop = asyncio.get_running_loop()
    ran: list[bool] = []

    async def body() -> None:
        ran.append(True)

    task = start_eagerly(loop, body())
    assert ran == [True]
    await asyncio.wait_for(task, 5)
    assert task.done() and task.exception() is None


async def test_an_error_in_the_first_step_is_the_tasks() -> None:
    loop = asyncio.get_running_loop()

    async def body() -> None:
        raise LookupError("first step")

    task = start_eagerly(loop, body())
    with pytest.raises(LookupError, match="first step"):
        await asyncio.wait_for(task, 5)


async def test_a_task_cancelled_before_its_next_step_is_cancelled_where_it_waits() -> None:
    loop = asyncio.get_running_loop()
    gate = loop.create_future()
    cleaned: list[bool] = []

    async def body() -> None:
        try:
            await gate
        finally:
            cleaned.append(True)

    task = start_eagerly(loop, body())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert cleaned == [True]
    assert task.cancelled()
