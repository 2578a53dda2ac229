"""The `async with` blocks in progress on one primitive object, by task.

A `Lock` (or `MultiLock`, ...) object may be shared by tasks: each task's block holds a
lease of its own, and its `__aexit__` releases that one, the task's innermost
(`Blocks.exit`, which every primitive's `__aexit__` delegates to).
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

__all__ = ("Blocks",)


class _Guarding(Protocol):
    """What a block holds: a lease (a `Lease`, a `MultiLease`) guarding its body."""

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


T = TypeVar("T", bound=_Guarding)


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

    async def exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        *,
        not_held: str,
    ) -> None:
        """The current task leaves its innermost block: that block's lease's `__aexit__`,
        given the body's exception (what it raises is raised).

        Raises:
            RuntimeError: `not_held`, the current task holds no block of this object (the
                blocks of other tasks are left as they are).

        Cancellation:
            As the lease's `__aexit__` (its release runs to completion, then a cancellation
            propagates); the block is left in any case.
        """
        lease = self.left(asyncio.current_task())
        if lease is None:
            raise RuntimeError(not_held)
        await lease.__aexit__(exc_type, exc, tb)
