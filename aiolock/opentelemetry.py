"""OpenTelemetry metrics from aiolock's lock events, on an OTel `Meter`.

```python
import aiolock.opentelemetry

uninstall = aiolock.opentelemetry.instrument()   # the global MeterProvider
```

| instrument                 | kind      | unit | attributes                     |
|----------------------------|-----------|------|--------------------------------|
| `aiolock.acquire.wait`     | histogram | s    | time spent in a successful acquire |
| `aiolock.hold.duration`    | histogram | s    | acquire to release             |
| `aiolock.acquisitions`     | counter   |      |                                |
| `aiolock.acquire.timeouts` | counter   |      |                                |
| `aiolock.renewals`         | counter   |      |                                |
| `aiolock.renewal.failures` | counter   |      | (retried until the deadline)   |
| `aiolock.losses`           | counter   |      | `aiolock.loss.reason`: not_owner, deadline, max_hold |
| `aiolock.terms.won`        | counter   |      | an election's terms won        |
| `aiolock.terms.lost`       | counter   |      | `aiolock.loss.reason`, as for `aiolock.losses` |
| `aiolock.terms.resigned`   | counter   |      |                                |

With `by_name=True` every measurement also carries `aiolock.lock.name`. Leave it off when
lock names are per request: one series per name would grow without bound.

The measurements are recorded by an event listener (`aiolock.add_listener`), synchronously
and in memory: they add no round trip to Redis. Needs the `otel` extra
(`pip install "aiolock-redis[otel]"`, the API only; the SDK and exporters are yours to choose).
Added in 0.1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from ._model.events import EventKind, LockEvent, add_listener
from ._version import __version__

try:
    from opentelemetry import metrics
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'aiolock.opentelemetry needs the "otel" extra: pip install "aiolock-redis[otel]"'
    ) from exc

__all__ = ("HOLD_BOUNDARIES", "WAIT_BOUNDARIES", "instrument")

WAIT_BOUNDARIES: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Advised histogram boundaries of the acquire wait, seconds."""
HOLD_BOUNDARIES: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
"""Advised histogram boundaries of the hold duration, seconds."""

LOCK_NAME: Final = "aiolock.lock.name"
LOSS_REASON: Final = "aiolock.loss.reason"


def instrument(
    meter_provider: metrics.MeterProvider | None = None,
    *,
    namespace: str = "aiolock",
    by_name: bool = False,
) -> Callable[[], None]:
    """Record aiolock's lock events on an OpenTelemetry meter; returns the uninstaller.

    Args:
        meter_provider: the provider of the meter ("aiolock", this version); default the
            global one (`opentelemetry.metrics.set_meter_provider`).
        namespace: the instrument name prefix.
        by_name: add the `aiolock.lock.name` attribute to every measurement. Only for a
            bounded set of lock names.

    Returns:
        A function that stops recording; calling it again does nothing. (OpenTelemetry has
        no way to remove instruments: they stay, and receive nothing more.)
    """
    meter = metrics.get_meter("aiolock", __version__, meter_provider=meter_provider)
    wait = meter.create_histogram(
        f"{namespace}.acquire.wait",
        unit="s",
        description="Time spent in a successful acquire.",
        explicit_bucket_boundaries_advisory=list(WAIT_BOUNDARIES),
    )
    hold = meter.create_histogram(
        f"{namespace}.hold.duration",
        unit="s",
        description="How long a lock was held, acquire to release.",
        explicit_bucket_boundaries_advisory=list(HOLD_BOUNDARIES),
    )
    acquisitions = meter.create_counter(
        f"{namespace}.acquisitions", unit="{lease}", description="Leases granted."
    )
    timeouts = meter.create_counter(
        f"{namespace}.acquire.timeouts",
        unit="{acquire}",
        description="Acquires that gave up: the lock stayed held for the whole timeout.",
    )
    renewals = meter.create_counter(
        f"{namespace}.renewals", unit="{renewal}", description="Leases renewed."
    )
    renewal_failures = meter.create_counter(
        f"{namespace}.renewal.failures",
        unit="{renewal}",
        description="Renewals that got no answer (retried until the lease's deadline).",
    )
    losses = meter.create_counter(
        f"{namespace}.losses", unit="{lease}", description="Leases lost, by reason."
    )
    terms_won = meter.create_counter(
        f"{namespace}.terms.won", unit="{term}", description="Election terms won."
    )
    terms_lost = meter.create_counter(
        f"{namespace}.terms.lost",
        unit="{term}",
        description="Election terms lost before their leader resigned, by reason.",
    )
    terms_resigned = meter.create_counter(
        f"{namespace}.terms.resigned", unit="{term}", description="Election terms resigned."
    )

    def on_event(event: LockEvent) -> None:
        attributes = {LOCK_NAME: event.name} if by_name else {}
        kind = event.kind
        if kind is EventKind.ACQUIRED:
            acquisitions.add(1, attributes)
            if event.wait is not None:
                wait.record(event.wait, attributes)
        elif kind is EventKind.RELEASED:
            if event.hold is not None:
                hold.record(event.hold, attributes)
        elif kind is EventKind.ACQUIRE_TIMED_OUT:
            timeouts.add(1, attributes)
        elif kind is EventKind.RENEWED:
            renewals.add(1, attributes)
        elif kind is EventKind.RENEWAL_FAILED:
            renewal_failures.add(1, attributes)
        elif kind is EventKind.LOST or kind is EventKind.TERM_LOST:
            reason = event.reason.value if event.reason is not None else "unknown"
            counter = losses if kind is EventKind.LOST else terms_lost
            counter.add(1, {**attributes, LOSS_REASON: reason})
        elif kind is EventKind.TERM_WON:
            terms_won.add(1, attributes)
        elif kind is EventKind.TERM_RESIGNED:
            terms_resigned.add(1, attributes)

    return add_listener(on_event)
