"""`Blocks`: the `async with` blocks in progress on one primitive object, by task."""

from __future__ import annotations

import asyncio
from types import TracebackType

import pytest

from aiolock._aio.task_blocks import Blocks


class Guard:
    """A lease's stand-in: records the `__aexit__` it was given."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.exits: list[type[BaseException] | None] = []

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.exits.append(exc_type)


async def test_exit_hands_the_current_tasks_innermost_block_its_aexit_and_no_other() -> None:
    blocks: Blocks[Guard] = Blocks()
    task = asyncio.current_task()
    assert task is not None
    outer, inner, others = Guard("outer"), Guard("inner"), Guard("another task's")
    other_task = asyncio.create_task(asyncio.sleep(0))
    blocks.entered(task, outer)
    blocks.entered(other_task, others)
    blocks.entered(task, inner)
    await blocks.exit(ValueError, ValueError("body"), None, not_held="not held here")
    assert (inner.exits, outer.exits, others.exits) == ([ValueError], [], [])
    await blocks.exit(None, None, None, not_held="not held here")
    assert outer.exits == [None]
    with pytest.raises(RuntimeError, match=r"^not held here$"):
        await blocks.exit(None, None, None, not_held="not held here")
    assert (len(blocks), others.exits) == (1, [])
    await other_task
