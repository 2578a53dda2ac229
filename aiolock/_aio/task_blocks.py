"""The `async with` blocks in progress on one primitive object, by task.

A `Lock` (or `MultiLock`, ...) object may be shared by tasks: each task's block holds a
lease of its own, and its `__aexit__` releases that one, the task's innermost.
"""

from __future__ import annotations

import asyncio
from typing import Any, Generic, TypeVar

__all__ = ("Blocks",)

T = TypeVar("T")


class Blocks(Generic[T]):
    """The leases of the blocks in progress, each with the task that entered it."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[tuple[asyncio.Task[Any], T]] = []

    def __len__(self) -> int:
        return len(self._entries)

    def entered(self, task: asyncio.Task[Any], lease: T) -> None:
        """`task` entered a block holding `lease`."""
        self._entries.append((task, lease))

    def left(self, task: asyncio.Task[Any] | None) -> T | None:
        """The lease of `task`'s innermost block, which it is leaving (None: it holds
        none)."""
        for index in range(len(self._entries) - 1, -1, -1):
            if self._entries[index][0] is task:
                return self._entries.pop(index)[1]
        return None
