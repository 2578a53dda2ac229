"""What happens while a test runs, recorded: lock events, for tests that count renewals,
failures and losses of particular leases; the pub/sub replies that take redis-py's way;
the tasks the notifier's messages are dispatched in.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis.asyncio.client import PubSub

from aiolock import EventKind, LockEvent, add_listener
from aiolock._engine.notifier import Notifier


@contextlib.contextmanager
def recorded(
    kind: EventKind | None = None, *, where: Callable[[LockEvent], bool] | None = None
) -> Iterator[list[LockEvent]]:
    """Every event emitted inside the block, in order: of `kind` (any without one), and
    for which `where(event)` holds, if given."""
    seen: list[LockEvent] = []

    def listener(event: LockEvent) -> None:
        if (kind is None or event.kind is kind) and (where is None or where(event)):
            seen.append(event)

    remove = add_listener(listener)
    try:
        yield seen
    finally:
        remove()


def of_lease(seen: list[LockEvent], fencing_token: int) -> int:
    """How many of `seen` are about the lease with this fencing token."""
    return sum(1 for event in seen if event.fencing_token == fencing_token)


def handled_by_redis_py(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every pub/sub reply read through redis-py's handler dispatch (`PubSub.handle_message`)
    from now on, for the rest of the test; the notifier's sessions read a plain or shard
    message past it."""
    handled: list[Any] = []
    handle_message = PubSub.handle_message

    async def recorded(self: PubSub, response: Any, *args: Any) -> Any:
        handled.append(response)
        return await handle_message(self, response, *args)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(PubSub, "handle_message", recorded)
    return handled


def dispatched_in(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every pub/sub message the notifiers dispatch from now on, for the rest of the test:
    its kind and the name of the task that dispatched it."""
    seen: list[tuple[str, str]] = []
    dispatch = Notifier._dispatch

    def recorded(self: Notifier, message: dict[str, Any]) -> None:
        task = asyncio.current_task()
        seen.append((str(message["type"]), "" if task is None else task.get_name()))
        dispatch(self, message)

    monkeypatch.setattr(Notifier, "_dispatch", recorded)
    return seen
