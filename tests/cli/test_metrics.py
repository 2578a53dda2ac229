"""Prometheus and OpenTelemetry metrics from lock events: recorded, labelled, free of I/O."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis.asyncio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from prometheus_client import CollectorRegistry

import aiolock.opentelemetry
import aiolock.prometheus
from aiolock import (
    AcquireTimeoutError,
    Election,
    EventKind,
    LeaseLostError,
    Lock,
    LockEvent,
    LossReason,
)
from aiolock._model.events import emit

from ..conftest import CommandLog, make_client


async def lock_cycle(client: redis.asyncio.Redis, name: str) -> None:
    """One of each: acquire, renewal, timeout, release, loss."""
    lock = Lock(client, name, ttl=5)
    async with lock as lease:
        await lease.extend()  # a renewal, as the watchdog does it
        with pytest.raises(AcquireTimeoutError):
            await Lock(client, name).acquire(timeout=0)
    lost = await lock.acquire()
    await client.delete(lock.key)  # behind its back
    with pytest.raises(LeaseLostError):
        await lost.extend()
    with pytest.raises(LeaseLostError):
        await lost.release()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def value(registry: CollectorRegistry, metric: str, **labels: str) -> float:
    found = registry.get_sample_value(metric, labels)
    assert found is not None, (metric, labels)
    return found


async def test_prometheus_metrics_after_a_lock_cycle(
    client: redis.asyncio.Redis, name: str, registry: CollectorRegistry
) -> None:
    uninstall = aiolock.prometheus.instrument(registry)
    try:
        await lock_cycle(client, name)
        assert value(registry, "aiolock_acquisitions_total") == 2
        assert value(registry, "aiolock_acquire_timeouts_total") == 1
        assert value(registry, "aiolock_renewals_total") == 1
        assert value(registry, "aiolock_renewal_failures_total") == 0
        assert value(registry, "aiolock_losses_total", reason="not_owner") == 1
        assert value(registry, "aiolock_acquire_wait_seconds_count") == 2
        assert value(registry, "aiolock_hold_seconds_count") == 1  # released; not the lost one
        assert 0 <= value(registry, "aiolock_hold_seconds_sum") < 5
        assert value(registry, "aiolock_acquire_wait_seconds_bucket", le="+Inf") == 2
    finally:
        uninstall()


async def test_prometheus_labels_by_name_on_request(
    client: redis.asyncio.Redis, name: str, registry: CollectorRegistry
) -> None:
    uninstall = aiolock.prometheus.instrument(registry, namespace="app", by_name=True)
    try:
        await lock_cycle(client, name)
        assert value(registry, "app_acquisitions_total", name=name) == 2
        assert value(registry, "app_losses_total", reason="not_owner", name=name) == 1
        assert value(registry, "app_hold_seconds_count", name=name) == 1
        assert registry.get_sample_value("aiolock_acquisitions_total") is None
    finally:
        uninstall()


def test_prometheus_counts_every_event_kind(registry: CollectorRegistry) -> None:
    uninstall = aiolock.prometheus.instrument(registry)
    try:
        for event in synthetic_events():
            emit(event)
        assert value(registry, "aiolock_acquisitions_total") == 1
        assert value(registry, "aiolock_acquire_wait_seconds_sum") == 0.25
        assert value(registry, "aiolock_acquire_timeouts_total") == 1
        assert value(registry, "aiolock_renewals_total") == 2
        assert value(registry, "aiolock_renewal_failures_total") == 1
        assert value(registry, "aiolock_losses_total", reason="deadline") == 1
        assert value(registry, "aiolock_losses_total", reason="max_hold") == 1
        assert value(registry, "aiolock_hold_seconds_sum") == 1.5
        assert value(registry, "aiolock_terms_won_total") == 2
        assert value(registry, "aiolock_terms_lost_total", reason="deadline") == 1
        assert value(registry, "aiolock_terms_resigned_total") == 1
    finally:
        uninstall()


def test_prometheus_uninstall_unregisters(registry: CollectorRegistry) -> None:
    uninstall = aiolock.prometheus.instrument(registry)
    with pytest.raises(ValueError, match="Duplicated"):
        aiolock.prometheus.instrument(registry)  # twice: refused, and nothing left behind
    uninstall()
    uninstall()  # harmless
    assert list(registry.collect()) == []
    emit(LockEvent(kind=EventKind.RENEWED, name="after"))  # no listener left to fail
    again = aiolock.prometheus.instrument(registry)  # the names are free again
    again()


def synthetic_events() -> Iterator[LockEvent]:
    yield LockEvent(kind=EventKind.ACQUIRED, name="a", wait=0.25, attempts=1)
    yield LockEvent(kind=EventKind.ACQUIRE_TIMED_OUT, name="a", wait=1.0, attempts=3)
    yield LockEvent(kind=EventKind.RENEWED, name="a")
    yield LockEvent(kind=EventKind.RENEWED, name="a")
    yield LockEvent(kind=EventKind.RENEWAL_FAILED, name="a", error=TimeoutError())
    yield LockEvent(kind=EventKind.LOST, name="a", reason=LossReason.DEADLINE, hold=2.0)
    yield LockEvent(kind=EventKind.LOST, name="a", reason=LossReason.MAX_HOLD, hold=9.0)
    yield LockEvent(kind=EventKind.RELEASED, name="a", hold=1.5)
    yield LockEvent(kind=EventKind.TERM_WON, name="a", fencing_token=7, wait=0.5)
    yield LockEvent(kind=EventKind.TERM_LOST, name="a", reason=LossReason.DEADLINE, hold=3.0)
    yield LockEvent(kind=EventKind.TERM_WON, name="a", fencing_token=8, wait=0.1)
    yield LockEvent(kind=EventKind.TERM_RESIGNED, name="a", fencing_token=8, hold=1.0)


@pytest.fixture
def otel() -> Iterator[tuple[MeterProvider, InMemoryMetricReader]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        yield provider, reader
    finally:
        provider.shutdown()


def otel_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: list(metric.data.data_points)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }


async def test_opentelemetry_metrics_after_a_lock_cycle(
    client: redis.asyncio.Redis,
    name: str,
    otel: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    provider, reader = otel
    uninstall = aiolock.opentelemetry.instrument(provider)
    try:
        await lock_cycle(client, name)
    finally:
        uninstall()
    points = otel_points(reader)

    def total(metric: str) -> float:
        return float(sum(point.value for point in points[metric]))

    assert total("aiolock.acquisitions") == 2
    assert total("aiolock.acquire.timeouts") == 1
    assert total("aiolock.renewals") == 1
    (loss,) = points["aiolock.losses"]
    assert (loss.value, dict(loss.attributes)) == (1, {"aiolock.loss.reason": "not_owner"})
    (wait,) = points["aiolock.acquire.wait"]
    (hold,) = points["aiolock.hold.duration"]
    assert isinstance(wait, HistogramDataPoint) and isinstance(hold, HistogramDataPoint)
    assert (wait.count, hold.count) == (2, 1)
    assert tuple(hold.explicit_bounds) == aiolock.opentelemetry.HOLD_BOUNDARIES
    assert "aiolock.renewal.failures" not in points  # never happened: no data point


def test_opentelemetry_by_name_and_every_kind(
    otel: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    provider, reader = otel
    uninstall = aiolock.opentelemetry.instrument(provider, namespace="app", by_name=True)
    try:
        for event in synthetic_events():
            emit(event)
    finally:
        uninstall()
    emit(LockEvent(kind=EventKind.RENEWED, name="a"))  # after uninstall: not recorded
    points = otel_points(reader)
    (renewals,) = points["app.renewals"]
    assert (renewals.value, dict(renewals.attributes)) == (2, {"aiolock.lock.name": "a"})
    losses = {p.attributes["aiolock.loss.reason"]: p.value for p in points["app.losses"]}
    assert losses == {"deadline": 1, "max_hold": 1}
    (failures,) = points["app.renewal.failures"]
    assert failures.value == 1
    (hold,) = points["app.hold.duration"]
    assert hold.sum == 1.5
    (won,) = points["app.terms.won"]
    (lost,) = points["app.terms.lost"]
    (resigned,) = points["app.terms.resigned"]
    assert (won.value, lost.value, resigned.value) == (2, 1, 1)
    assert dict(lost.attributes) == {"aiolock.lock.name": "a", "aiolock.loss.reason": "deadline"}


async def test_prometheus_counts_the_terms_of_an_election(
    client: redis.asyncio.Redis, name: str, registry: CollectorRegistry
) -> None:
    uninstall = aiolock.prometheus.instrument(registry, by_name=True)
    try:
        election = Election(client, name, ttl=5)
        async with contextlib.aclosing(election.campaign()) as terms:
            async for term in terms:
                async with term:
                    pass
                break
        async with contextlib.aclosing(election.campaign()) as terms:
            term = await anext(terms)
            await client.delete(election.key)  # behind its back
            with pytest.raises(LeaseLostError):
                await term.resign()
        assert value(registry, "aiolock_terms_won_total", name=name) == 2
        assert value(registry, "aiolock_terms_resigned_total", name=name) == 1
        assert value(registry, "aiolock_terms_lost_total", reason="not_owner", name=name) == 1
    finally:
        uninstall()


@pytest.mark.real_only
@pytest.mark.parametrize("install", ["prometheus", "opentelemetry"])
async def test_metrics_add_no_round_trip(
    server_url: str, name: str, install: str, otel: tuple[MeterProvider, InMemoryMetricReader]
) -> None:
    def instrumented() -> Callable[[], None]:
        if install == "prometheus":
            return aiolock.prometheus.instrument(CollectorRegistry())
        return aiolock.opentelemetry.instrument(otel[0])

    warm = make_client(server_url)  # the scripts loaded: both runs are the steady state
    try:
        await lock_cycle(warm, f"{name}:warm-up")
    finally:
        await warm.aclose()
    counts = []
    for with_metrics in (False, True):
        log = CommandLog()
        client = make_client(server_url, log)
        uninstall = instrumented() if with_metrics else None
        try:
            await lock_cycle(client, f"{name}:{with_metrics}")
        finally:
            if uninstall is not None:
                uninstall()
            await client.aclose()
        counts.append(log.since(0))
    assert counts[0] == counts[1]
    assert counts[0]["EVALSHA acquire"] >= 2  # the cycle did talk to Redis
