"""Lock events recorded while a test runs, for tests that count renewals, failures and
losses of particular leases."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from aiolock import EventKind, LockEvent, add_listener


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
