"""Lock events for metrics, tracing and logs: one process-wide list of listeners.

```python
import aiolock

def on_event(event: aiolock.LockEvent) -> None:
    if event.kind is aiolock.EventKind.ACQUIRED:
        wait_histogram.observe(event.wait)

remove = aiolock.add_listener(on_event)
```

Listeners are called synchronously, in the event loop, where the event happens: keep them
quick and non-blocking. A listener that raises is logged and otherwise ignored: it never
breaks locking. Nothing is sent to Redis for an event, and when no listener is registered
no event object is even built.

Every event is also logged on the `aiolock` logger at DEBUG level, with the event's fields
in `extra` (`aiolock_event`, `aiolock_lock`, `aiolock_fencing_token`, ...).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import final

from ..errors import LossReason

__all__ = ("EventKind", "Listener", "LockEvent", "add_listener", "emit", "enabled")

logger = logging.getLogger("aiolock")


class EventKind(enum.Enum):
    """What happened to a lock."""

    ACQUIRED = "acquired"
    """A lease was granted; `wait` is the time spent in `acquire`, `attempts` the tries."""

    ACQUIRE_TIMED_OUT = "acquire_timed_out"
    """`acquire` gave up: the lock stayed held for the whole timeout (`wait`)."""

    RELEASED = "released"
    """The holder released its lease; `hold` is how long it was held."""

    RENEWED = "renewed"
    """The watchdog renewed a lease."""

    RENEWAL_FAILED = "renewal_failed"
    """A renewal got no answer; it is retried until the lease's deadline. `error` says why."""

    LOST = "lost"
    """A lease was lost; `reason` says why, `hold` how long it had been held."""

    TERM_WON = "term_won"
    """An election's candidate won a term (`name`: the election's; `fencing_token`: the
    term's number); `wait` is the time spent campaigning for it."""

    TERM_LOST = "term_lost"
    """A term was lost before its leader resigned; `reason` says why, `hold` how long it
    had lasted. Its lease's `LOST` event comes with it."""

    TERM_RESIGNED = "term_resigned"
    """A leader resigned its term (or its `async with term` block ended); `hold` is how long
    it lasted."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LockEvent:
    """One event; fields that do not apply to its kind are None."""

    kind: EventKind
    name: str
    fencing_token: int | None = None
    wait: float | None = None
    hold: float | None = None
    attempts: int | None = None
    reason: LossReason | None = None
    error: BaseException | None = None


Listener = Callable[[LockEvent], None]

_listeners: list[Listener] = []


def add_listener(listener: Listener) -> Callable[[], None]:
    """Call `listener` for every lock event of this process; returns a function removing it."""
    if not callable(listener):
        raise TypeError(f"listener must be callable, got {type(listener).__name__}")
    _listeners.append(listener)

    def remove() -> None:
        if listener in _listeners:
            _listeners.remove(listener)

    return remove


def enabled() -> bool:
    """Whether anything consumes events (a listener, or DEBUG logging): else skip building."""
    return bool(_listeners) or logger.isEnabledFor(logging.DEBUG)


def emit(event: LockEvent) -> None:
    """Deliver `event` to every listener; a failing listener is logged, never raised."""
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "aiolock: %s %r",
            event.kind.value,
            event.name,
            extra={
                "aiolock_event": event.kind.value,
                "aiolock_lock": event.name,
                "aiolock_fencing_token": event.fencing_token,
                "aiolock_wait": event.wait,
                "aiolock_hold": event.hold,
                "aiolock_reason": event.reason.value if event.reason else None,
            },
        )
    for listener in tuple(_listeners):
        try:
            listener(event)
        except Exception:
            logger.exception("aiolock: event listener %r failed", listener)
