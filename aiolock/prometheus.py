"""Prometheus metrics from aiolock's lock events, for `prometheus_client`.

```python
import aiolock.prometheus

uninstall = aiolock.prometheus.instrument()   # into prometheus_client.REGISTRY
```

| metric                            | type      | labels                           |
|-----------------------------------|-----------|----------------------------------|
| `aiolock_acquire_wait_seconds`    | histogram | time spent in a successful acquire |
| `aiolock_hold_seconds`            | histogram | acquire to release               |
| `aiolock_acquisitions_total`      | counter   |                                  |
| `aiolock_acquire_timeouts_total`  | counter   |                                  |
| `aiolock_renewals_total`          | counter   |                                  |
| `aiolock_renewal_failures_total`  | counter   | (retried until the deadline)     |
| `aiolock_losses_total`            | counter   | `reason`: not_owner, deadline, max_hold |
| `aiolock_terms_won_total`         | counter   | an election's terms won          |
| `aiolock_terms_lost_total`        | counter   | `reason`, as for `aiolock_losses_total` |
| `aiolock_terms_resigned_total`    | counter   |                                  |

With `by_name=True` every metric also has a `name` label (the lock's name). Leave it off
when lock names are per request (`orders:42`, `orders:43`, ...): one series per name would
grow without bound.

The metrics are updated by an event listener (`aiolock.add_listener`), synchronously and
in memory: they add no round trip to Redis. Needs the `prometheus` extra
(`pip install "aiolock-redis[prometheus]"`). Added in 0.1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Final, TypeVar

from ._model.events import EventKind, LockEvent, add_listener

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
    from prometheus_client.metrics import MetricWrapperBase
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'aiolock.prometheus needs the "prometheus" extra: pip install "aiolock-redis[prometheus]"'
    ) from exc

__all__ = ("HOLD_BUCKETS", "WAIT_BUCKETS", "instrument")

_M = TypeVar("_M", bound=MetricWrapperBase)

WAIT_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Histogram buckets of the acquire wait, seconds."""
HOLD_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
"""Histogram buckets of the hold duration, seconds."""


def instrument(
    registry: CollectorRegistry | None = None,
    *,
    namespace: str = "aiolock",
    by_name: bool = False,
) -> Callable[[], None]:
    """Record aiolock's lock events as Prometheus metrics; returns the uninstaller.

    Args:
        registry: where to register the metrics; default `prometheus_client.REGISTRY`.
        namespace: the metric name prefix.
        by_name: add a `name` label (the lock's name) to every metric. Only for a bounded
            set of lock names.

    Returns:
        A function that stops recording and unregisters the metrics; calling it again does
        nothing.

    Raises:
        ValueError: the registry already has these metrics (instrumented twice).
    """
    target = REGISTRY if registry is None else registry
    name_label: tuple[str, ...] = ("name",) if by_name else ()
    created: list[MetricWrapperBase] = []

    def made(metric: _M) -> _M:
        created.append(metric)
        return metric

    try:
        wait = made(
            Histogram(
                "acquire_wait_seconds",
                "Time spent in a successful acquire, seconds.",
                name_label,
                namespace=namespace,
                registry=target,
                buckets=WAIT_BUCKETS,
            )
        )
        hold = made(
            Histogram(
                "hold_seconds",
                "How long a lock was held, acquire to release, seconds.",
                name_label,
                namespace=namespace,
                registry=target,
                buckets=HOLD_BUCKETS,
            )
        )
        acquisitions = made(
            Counter(
                "acquisitions", "Leases granted.", name_label, namespace=namespace, registry=target
            )
        )
        timeouts = made(
            Counter(
                "acquire_timeouts",
                "Acquires that gave up: the lock stayed held for the whole timeout.",
                name_label,
                namespace=namespace,
                registry=target,
            )
        )
        renewals = made(
            Counter("renewals", "Leases renewed.", name_label, namespace=namespace, registry=target)
        )
        renewal_failures = made(
            Counter(
                "renewal_failures",
                "Renewals that got no answer (retried until the lease's deadline).",
                name_label,
                namespace=namespace,
                registry=target,
            )
        )
        losses = made(
            Counter(
                "losses",
                "Leases lost, by reason.",
                ("reason", *name_label),
                namespace=namespace,
                registry=target,
            )
        )
        terms_won = made(
            Counter(
                "terms_won",
                "Election terms won.",
                name_label,
                namespace=namespace,
                registry=target,
            )
        )
        terms_lost = made(
            Counter(
                "terms_lost",
                "Election terms lost before their leader resigned, by reason.",
                ("reason", *name_label),
                namespace=namespace,
                registry=target,
            )
        )
        terms_resigned = made(
            Counter(
                "terms_resigned",
                "Election terms resigned.",
                name_label,
                namespace=namespace,
                registry=target,
            )
        )
    except BaseException:
        for metric in created:
            with contextlib.suppress(KeyError):
                target.unregister(metric)
        raise

    def child(metric: _M, event: LockEvent) -> _M:
        return metric.labels(event.name) if by_name else metric

    def on_event(event: LockEvent) -> None:
        kind = event.kind
        if kind is EventKind.ACQUIRED:
            child(acquisitions, event).inc()
            if event.wait is not None:
                child(wait, event).observe(event.wait)
        elif kind is EventKind.RELEASED:
            if event.hold is not None:
                child(hold, event).observe(event.hold)
        elif kind is EventKind.ACQUIRE_TIMED_OUT:
            child(timeouts, event).inc()
        elif kind is EventKind.RENEWED:
            child(renewals, event).inc()
        elif kind is EventKind.RENEWAL_FAILED:
            child(renewal_failures, event).inc()
        elif kind is EventKind.LOST or kind is EventKind.TERM_LOST:
            reason = event.reason.value if event.reason is not None else "unknown"
            labels = (reason, event.name) if by_name else (reason,)
            (losses if kind is EventKind.LOST else terms_lost).labels(*labels).inc()
        elif kind is EventKind.TERM_WON:
            child(terms_won, event).inc()
        elif kind is EventKind.TERM_RESIGNED:
            child(terms_resigned, event).inc()

    remove = add_listener(on_event)

    def uninstall() -> None:
        remove()
        for metric in created:
            with contextlib.suppress(KeyError):
                target.unregister(metric)

    return uninstall
