"""Lock events recorded while a test runs, for tests that count renewals, failures and
losses of particular leases."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from aiolock import EventKind, LockEvent, add_listener


@contextlib.contextmanager
def recorded(kind: EventKind) -> Iterator[list[LockEvent]]:
    """Every event of `kind` emitted inside the block, in order."""
    seen: list[LockEvent] = []

    def listener(event: LockEvent) -> None:
        if event.kind is kind:
            seen.append(event)

    remove = add_listener(listener)
    try:
        yield seen
    finally:
        remove()


def of_lease(seen: list[LockEvent], fencing_token: int) -> int:
    """How many of `seen` are about the lease with this fencing token."""
    return sum(1 for event in seen if event.fencing_token == fencing_token)
