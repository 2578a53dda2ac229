"""Redlock on five servers: aiolock's `Redlock` against pottery's `AIORedlock` and aioredlock.

    bash benchmarks/setup.sh                                  # once: the peers' virtualenv
    benchmarks/.venv/bin/python benchmarks/redlock.py         # about 13 minutes, 3 rounds
    benchmarks/.venv/bin/python benchmarks/redlock.py --quick # about 6 minutes, 3 short rounds

Starts five throwaway `redis-server` processes (`aiolock.testing.RedisServer`: loopback,
free ports, nothing on disk; never a shared server) and runs, for each library:

- `latency`: one task, acquire + release of one name, again and again after a warm-up:
  p50 and p99 of the cycle.
- `contended`: 32 tasks on one name for `--seconds` (a 1 ms critical section, then a 5 ms
  pause, as in bench.py's contended scenario): critical sections/s, Jain's fairness index
  over the tasks' counts, and overlaps (two holders at once; must be 0).
- `latency-frozen`, `contended-frozen`: the same with one of the five servers stopped
  (SIGSTOP) from the end of the warm-up to the end of the scenario, and continued (SIGCONT)
  afterwards, on every path. The latency run stops after `--iterations` cycles or
  `--frozen-budget` seconds; a run in which no cycle finished counts as stalled.
- `leases`: `--leases` locks acquired and held for `--lease-seconds` with a ttl of
  `--lease-ttl`, kept alive by each library's renewal: the client process's CPU as % of
  one core over the hold, and how many leases were lost, by the library's own account
  and by the servers' (a lease whose key is not alive on a majority of the servers at the
  end of the hold is lost).

Each run is a process of its own (this file, `--worker`), so that its CPU time is the
library's alone. Rounds are interleaved: each scenario runs every library once per round,
the starting library rotating, and the figures are medians over the rounds. Writes
`benchmarks/results/redlock.md` and `redlock.json` (every run).

How the libraries are set up (each with its documented defaults but for what is listed):

- The same redis-py clients (`redis.asyncio.Redis`, one per server) for aiolock and
  pottery. In every scenario but `leases`: `socket_timeout` and `socket_connect_timeout`
  equal to aiolock's default per-node bound (ttl / 10; the Redlock algorithm needs a
  per-node timeout well below the ttl, and this gives pottery the one aiolock uses), and
  no retries (`retry=Retry(NoBackoff(), 0)`; redis-py 8 retries a timed-out call 3 times
  with backoff by default, and with one server stopped a pottery cycle on such clients had
  not finished after 30 s). In `leases`, where no server is stopped, redis-py's defaults.
  Always `max_connections=2048` (redis-py 8 raises an error beyond its default of 100).
  aiolock bounds each node's call itself, whatever the client's settings.
- aiolock: `Redlock(clients, name, ttl=ttl)`; renewal by its watchdog.
- pottery: `AIORedlock(key=name, masters=clients, auto_release_time=ttl)`, blocking
  acquisition (its default). pottery has no background renewal: in `leases` one task per
  lock calls `extend()` every ttl / 3 (aiolock's renewal interval; the first one at a
  random point of the first third, so that the renewals spread evenly), with
  `num_extensions` unbounded (its default, 3, would end every lease after 3 renewals);
  the row `pottery-0.6ttl` does the same every 0.6 x ttl (aioredlock's interval).
- aioredlock: `Aioredlock([{host, port}] * 5, retry_count=1_000_000)` (block until
  acquired, as the others do; bench.py does the same) with `internal_lock_timeout=ttl`;
  `lock(name, lock_timeout=ttl)` for the cycles, `lock(name)` in `leases` (its own
  auto-extension: every 0.6 x ttl). Its connections (aioredis 1.3) have no read timeout to
  set: a stopped server stalls its calls until the server continues.
- The frozen scenarios stop the server after the warm-up (connections open and scripts
  loaded on all five servers, as in a running service) and continue it after the
  scenario's result is in.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import math
import os
import platform
import queue
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

from bench import jain, percentile

NODES = 5
CLOSE_TIMEOUT = 30.0  # seconds a worker has to exit once told to close
FROZEN_NODE = NODES - 1  # the server stopped in the frozen scenarios
LIBS = ["aiolock", "pottery", "aioredlock"]
SCENARIOS = ["latency", "contended", "latency-frozen", "contended-frozen", "leases"]
HOLD = 0.001  # the contended critical section
PAUSE = 0.005  # between a task's critical sections

Release = Callable[[], Awaitable[Any]]


# --------------------------------------------------------------------------- adapters
class Adapter:
    """`hold(name)`: an async context manager holding the lock `name`; `take(name)`: the
    lock acquired and kept alive by the library's renewal (or its equivalent)."""

    def __init__(self, ports: list[int], ttl: float, *, node_bound: bool = True) -> None:
        self.ports = ports
        self.ttl = ttl
        self.node_bound = node_bound
        self.loss_reasons: list[str] = []  # why leases were lost, where the library says
        self.loss_times: list[float] = []  # when (time.perf_counter()), where it says

    async def open(self) -> None:
        bound: dict[str, Any] = {}
        if self.node_bound:  # aiolock's default per-node bound, and no retries
            timeout = self.ttl / 10
            bound = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
            bound["retry"] = Retry(NoBackoff(), 0)
        self.clients = [
            redis.asyncio.Redis(host="127.0.0.1", port=port, max_connections=2048, **bound)
            for port in self.ports
        ]

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()

    def hold(self, name: str) -> contextlib.AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    async def take(self, name: str) -> tuple[Callable[[], bool], Release]:
        """(is it lost, by the library's account?, release)."""
        raise NotImplementedError


class AiolockAdapter(Adapter):
    async def open(self) -> None:
        await super().open()
        from aiolock import Redlock

        self.redlock = Redlock

    def hold(self, name: str) -> contextlib.AbstractAsyncContextManager[Any]:
        return self.redlock(self.clients, name, ttl=self.ttl)

    async def take(self, name: str) -> tuple[Callable[[], bool], Release]:
        lease = await self.redlock(self.clients, name, ttl=self.ttl).acquire()
        return (lambda: bool(lease.lost)), lease.release


class PotteryAdapter(Adapter):
    renew_every = 1 / 3  # of the ttl: aiolock's renewal interval

    async def open(self) -> None:
        await super().open()
        from pottery import AIORedlock

        self.redlock = AIORedlock

    def hold(self, name: str) -> contextlib.AbstractAsyncContextManager[Any]:
        return self.redlock(key=name, masters=self.clients, auto_release_time=self.ttl)

    async def take(self, name: str) -> tuple[Callable[[], bool], Release]:
        # No background renewal in pottery: one task per lock calls extend() every
        # `renew_every` x ttl.
        lock = self.redlock(
            key=name, masters=self.clients, auto_release_time=self.ttl, num_extensions=sys.maxsize
        )
        await lock.acquire()
        lost = False

        async def renew() -> None:
            nonlocal lost
            # The first extend at a random point of the first third of the ttl: the locks'
            # renewals spread evenly over time instead of coming in one burst.
            await asyncio.sleep(random.uniform(0, self.ttl * self.renew_every))
            while True:
                try:
                    await lock.extend()
                except Exception as exc:
                    lost = True
                    nodes = getattr(exc, "redis_errors", None) or []
                    detail = ", ".join(sorted(type(error).__name__ for error in nodes))
                    detail = detail or "no server error: not the lock's key on a majority any more"
                    self.loss_reasons.append(f"{type(exc).__name__} ({detail})")
                    self.loss_times.append(time.perf_counter())
                    return
                await asyncio.sleep(self.ttl * self.renew_every)

        renewing = asyncio.create_task(renew())

        async def release() -> None:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
            await lock.release()

        return (lambda: lost), release


class AioredlockAdapter(Adapter):
    async def open(self) -> None:
        await super().open()
        from aioredlock import Aioredlock  # type: ignore[import-untyped]

        self.manager = Aioredlock(
            [{"host": "127.0.0.1", "port": port} for port in self.ports],
            retry_count=1_000_000,  # block until acquired, as the others do
            internal_lock_timeout=self.ttl,
        )

    async def close(self) -> None:
        await self.manager.destroy()
        await super().close()

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        lock = await self.manager.lock(name, lock_timeout=self.ttl)
        try:
            yield
        finally:
            await self.manager.unlock(lock)

    async def take(self, name: str) -> tuple[Callable[[], bool], Release]:
        # Without a lock_timeout, aioredlock extends the lock in the background.
        lock = await self.manager.lock(name, lock_timeout=None)
        return (lambda: not lock.valid), (lambda: self.manager.unlock(lock))


class PotterySlowerAdapter(PotteryAdapter):
    renew_every = 0.6  # aioredlock's interval


ADAPTERS: dict[str, type[Adapter]] = {
    "aiolock": AiolockAdapter,
    "pottery": PotteryAdapter,
    "aioredlock": AioredlockAdapter,
    "pottery-0.6ttl": PotterySlowerAdapter,
}


# --------------------------------------------------------------------------- scenarios
def short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


async def cycle(adapter: Adapter, name: str) -> None:
    async with adapter.hold(name):
        pass


async def warm_up(adapter: Adapter, settings: dict[str, Any]) -> None:
    """Connections open and scripts loaded on every server, before anything is timed."""
    name = f"bench:rl:warm:{uuid.uuid4().hex[:8]}"
    for _ in range(settings["warmup"]):
        await cycle(adapter, name)


async def latency(adapter: Adapter, settings: dict[str, Any]) -> dict[str, Any]:
    """One task, acquire + release of one name, `iterations` times (or until `budget`)."""
    name = f"bench:rl:latency:{uuid.uuid4().hex[:8]}"
    budget = settings["budget"]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget
    samples: list[float] = []
    cut = 0
    errors: list[str] = []
    started = time.perf_counter()
    for _ in range(settings["iterations"]):
        if loop.time() >= deadline:
            break
        start = time.perf_counter()
        try:
            async with asyncio.timeout_at(deadline):
                await cycle(adapter, name)
        except TimeoutError:
            cut = 1  # the budget ended during this cycle
            break
        except Exception as exc:
            errors.append(short(exc))
            continue
        samples.append(time.perf_counter() - start)
    out: dict[str, Any] = {
        "p50_ms": percentile(samples, 50) * 1e3,
        "p99_ms": percentile(samples, 99) * 1e3,
        "cycles": len(samples),
        "cycles_per_s": len(samples) / (time.perf_counter() - started),
        "cut_at_budget": cut,
        "stalled": int(not samples),
        "errors": len(errors),
    }
    if not samples:
        out["note"] = f"stalled: no cycle finished within the {budget:g} s budget"
    if errors:
        out["first_error"] = errors[0]
    return out


async def contended(adapter: Adapter, settings: dict[str, Any]) -> dict[str, Any]:
    """`tasks` tasks on one name for `seconds`: 1 ms critical sections, 5 ms pauses."""
    name = f"bench:rl:contended:{uuid.uuid4().hex[:8]}"
    tasks, seconds = settings["tasks"], settings["seconds"]
    start = time.monotonic()
    stop = start + seconds
    records: list[tuple[float, float, int]] = []
    counts = [0] * tasks
    errors: list[str] = []

    async def task(i: int) -> None:
        while time.monotonic() < stop:
            try:
                async with adapter.hold(name):
                    acquired = time.monotonic()
                    await asyncio.sleep(HOLD)
                    released = time.monotonic()
            except Exception as exc:
                errors.append(short(exc))
            else:
                if released <= stop:
                    records.append((acquired, released, i))
                    counts[i] += 1
            await asyncio.sleep(PAUSE)

    running = [asyncio.create_task(task(i)) for i in range(tasks)]
    # A task still inside the library a little after the end is stopped: what it was doing
    # does not count.
    _done, late = await asyncio.wait(running, timeout=seconds + settings["grace"])
    for late_task in late:
        late_task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    records.sort()
    overlaps = sum(1 for a, b in itertools.pairwise(records) if b[0] < a[1])
    out: dict[str, Any] = {
        "critical_sections_per_s": len(records) / seconds,
        "jain_fairness": jain(counts) if records else float("nan"),
        "per_task_min": min(counts),
        "per_task_max": max(counts),
        "critical_sections": len(records),
        "overlaps": overlaps,
        "tasks_stuck_at_end": len(late),
        "errors": len(errors),
    }
    if errors:
        out["first_error"] = errors[0]
    return out


async def node_stats(clients: list[redis.asyncio.Redis]) -> tuple[int, float]:
    """Commands processed and CPU seconds used, summed over the servers."""
    commands, cpu = 0, 0.0
    for client in clients:
        stats = await client.info("stats")
        usage = await client.info("cpu")
        commands += int(stats["total_commands_processed"])
        cpu += float(usage["used_cpu_user"]) + float(usage["used_cpu_sys"])
    return commands, cpu


async def alive_on_majority(clients: list[redis.asyncio.Redis], tag: str, count: int) -> int:
    """How many of the leases `bench:rl:lease:TAG:I` have a key alive (PTTL > 0) on a
    majority of the servers: whatever each library names its keys, they contain the name."""
    pattern = re.compile(rf"bench:rl:lease:{tag}:(\d+)")
    nodes_alive = [0] * count
    for client in clients:
        keys = [key async for key in client.scan_iter(match=f"*bench:rl:lease:{tag}:*", count=1000)]
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.pttl(key)
        ttls = await pipe.execute()
        alive_here: set[int] = set()
        for key, ttl in zip(keys, ttls, strict=True):
            found = pattern.search(key.decode())
            if found and int(ttl) > 0:
                alive_here.add(int(found.group(1)))
        for index in alive_here:
            nodes_alive[index] += 1
    return sum(1 for alive in nodes_alive if alive > len(clients) // 2)


async def leases(adapter: Adapter, settings: dict[str, Any]) -> dict[str, Any]:
    """`leases` locks held for `seconds` with renewal: client CPU, losses."""
    tag = uuid.uuid4().hex[:8]
    count = settings["leases"]
    observer = [
        redis.asyncio.Redis(host="127.0.0.1", port=port, socket_timeout=10)
        for port in adapter.ports
    ]
    taken: list[tuple[Callable[[], bool], Release]] = []
    lags: list[float] = []  # how late the event loop ran a 50 ms sleep, over the hold
    holding = False

    async def watch_loop() -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.05)
            if holding:
                lags.append(loop.time() - before - 0.05)

    watching = asyncio.create_task(watch_loop())
    try:
        acquiring = time.perf_counter()
        for i in range(count):
            # One by one: those taken so far are released if one fails.
            taken.append(await adapter.take(f"bench:rl:lease:{tag}:{i}"))  # noqa: PERF401
        acquire_s = time.perf_counter() - acquiring
        commands, server_cpu = await node_stats(observer)
        cpu = time.process_time()
        started = time.perf_counter()
        holding = True
        await asyncio.sleep(settings["seconds"])
        holding = False
        elapsed = time.perf_counter() - started
        first_loss = min(adapter.loss_times, default=None)
        cpu_used = time.process_time() - cpu
        commands_after, server_cpu_after = await node_stats(observer)
        lost_own = sum(1 for is_lost, _ in taken if is_lost())
        alive = await alive_on_majority(observer, tag, count)
        release_errors = 0
        for _, release in taken:
            try:
                await release()
            except Exception:
                release_errors += 1
        taken.clear()
        return {
            "leases": count,
            "ttl_s": adapter.ttl,
            "held_s": elapsed,
            "client_cpu_percent": 100 * cpu_used / elapsed,
            "server_cpu_percent": 100 * (server_cpu_after - server_cpu) / elapsed,
            "redis_commands_per_s": (commands_after - commands) / elapsed,
            "lost_own_account": lost_own,
            "lost_by_servers": count - alive,
            "survived": int(lost_own == 0 and alive == count),
            "acquire_all_s": acquire_s,
            "release_errors": release_errors,
            "loss_reasons": dict(collections.Counter(adapter.loss_reasons).most_common(5)),
            "first_loss_s": None if first_loss is None else first_loss - started,
            "loop_lag_p50_ms": percentile(lags, 50) * 1e3,
            "loop_lag_p99_ms": percentile(lags, 99) * 1e3,
            "loop_lag_max_ms": max(lags, default=float("nan")) * 1e3,
        }
    finally:
        watching.cancel()
        for _, release in taken:
            with contextlib.suppress(Exception):
                await release()
        for client in observer:
            await client.aclose()


WORKER_SCENARIOS: dict[str, Callable[[Adapter, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "latency": latency,
    "contended": contended,
    "latency-frozen": latency,
    "contended-frozen": contended,
    "leases": leases,
}


# --------------------------------------------------------------------------- worker
def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def hear() -> str:
    line: str = await asyncio.to_thread(sys.stdin.readline)
    return line.strip()


async def worker(args: argparse.Namespace) -> None:
    """One library, one scenario: warm up, say "ready", wait for "go", run, print the
    result as one JSON line, wait for "close" (the stopped server has been continued by
    then), close within 30 s."""
    settings = json.loads(args.settings)
    ports = [int(port) for port in args.ports.split(",")]
    adapter = ADAPTERS[args.lib](ports, settings["ttl"], node_bound=args.scenario != "leases")
    await adapter.open()
    try:
        await warm_up(adapter, settings)
        say("ready")
        if await hear() != "go":
            return
        try:
            result = await WORKER_SCENARIOS[args.scenario](adapter, settings)
        except Exception as exc:
            result = {"error": short(exc), "traceback": traceback.format_exc()}
        say(json.dumps({"lib": args.lib, "scenario": args.scenario, **result}))
        await hear()
    finally:
        try:
            async with asyncio.timeout(30):
                await adapter.close()
        except BaseException as exc:
            print(f"closing {args.lib}: {short(exc)}", file=sys.stderr)
        # What is still running now is cancelled by asyncio.run as it ends: named here, in
        # case one of them keeps the process from exiting.
        left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        if left:
            print(f"{len(left)} tasks still running after close:", file=sys.stderr)
            for task in left[:6]:
                print(f"- {task!r}"[:400], file=sys.stderr)
                task.print_stack(limit=6, file=sys.stderr)
        sys.stderr.flush()


# --------------------------------------------------------------------------- orchestrator
class Worker:
    """A worker process: its stdout read line by line in a thread, its stderr to a file."""

    def __init__(self, command: list[str]) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def line(self, timeout: float) -> str | None:
        try:
            return self.lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def send(self, word: str) -> None:
        with contextlib.suppress(BrokenPipeError, OSError, ValueError):
            assert self.process.stdin is not None
            self.process.stdin.write(word + "\n")
            self.process.stdin.flush()

    def stderr_tail(self, lines: int = 8) -> str:
        self.log.seek(0)
        return "\n".join(self.log.read().strip().splitlines()[-lines:])

    def close(self, timeout: float) -> str | None:
        """Wait for it to exit, killing it past `timeout`: None, or if it had to be
        killed, the end of its stderr."""
        left = None
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            left = self.stderr_tail(40)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.log.close()
        return left


def run_one(
    lib: str, scenario: str, servers: list[Any], settings: dict[str, Any]
) -> dict[str, Any]:
    """One library, one scenario, in a worker process; a server stopped meanwhile for the
    frozen scenarios (and continued on every path)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--lib", lib]
    command += ["--scenario", scenario, "--ports", ",".join(str(s.port) for s in servers)]
    command += ["--settings", json.dumps(settings)]
    frozen = servers[FROZEN_NODE] if scenario.endswith("-frozen") else None
    limit = settings["limit"]
    worker = Worker(command)
    paused = False
    result: dict[str, Any]
    try:
        ready = worker.line(timeout=120)
        if ready != "ready":
            result = {"error": f"no ready from the worker ({ready!r}): {worker.stderr_tail()}"}
        else:
            if frozen is not None:
                frozen.pause()
                paused = True
            worker.send("go")
            line = worker.line(timeout=limit)
            if line is None:
                result = {"error": f"no result within {limit:g} s: {worker.stderr_tail()}"}
            else:
                result = json.loads(line)
    except (ValueError, OSError) as exc:
        result = {"error": f"{short(exc)}: {worker.stderr_tail()}"}
    finally:
        if paused:
            frozen.resume()  # type: ignore[union-attr]
        worker.send("close")
        left = worker.close(timeout=CLOSE_TIMEOUT)
    if left is not None:
        result["worker_kept_running"] = (
            f"the worker had not exited {CLOSE_TIMEOUT:g} s after it was told to close, and "
            f"was killed; the end of its stderr: {left}"
        )
    return result


def scenario_settings(scenario: str, args: argparse.Namespace) -> dict[str, Any]:
    settings: dict[str, Any] = {"ttl": args.ttl, "warmup": args.warmup}
    if scenario.startswith("latency"):
        budget = args.frozen_budget if scenario.endswith("-frozen") else args.latency_budget
        settings |= {"iterations": args.iterations, "budget": budget, "limit": budget + 120}
    elif scenario.startswith("contended"):
        grace = min(args.ttl, 5.0)
        settings |= {"tasks": args.tasks, "seconds": args.seconds, "grace": grace}
        settings["limit"] = args.seconds + grace + 120
    else:
        settings |= {"ttl": args.lease_ttl, "leases": args.leases, "seconds": args.lease_seconds}
        settings["limit"] = args.lease_seconds + args.leases * 0.05 + 180
    return settings


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the numbers over the runs without an error; the worst of what must be 0."""
    good = [run for run in runs if "error" not in run]
    out: dict[str, Any] = {"runs_ok": len(good), "runs": len(runs)}
    if not good:
        out["error"] = runs[0].get("error") if runs else "no run"
        return out
    worst = {"overlaps", "stalled", "lost_own_account", "lost_by_servers", "errors"}
    for key, value in good[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            values = [run[key] for run in good if isinstance(run.get(key), int | float)]
            clean = [v for v in values if not math.isnan(v)]
            if key in worst:
                out[key] = max(values)
            elif key == "survived":
                out[key] = f"{sum(values)} of {len(good)}"
            else:
                out[key] = statistics.median(clean) if clean else float("nan")
    for key in ("lost_own_account", "lost_by_servers"):
        if key in good[0]:
            out[f"{key}_runs"] = ", ".join(str(run.get(key, "?")) for run in good)
    notes = sorted(
        {run[k] for run in runs for k in ("note", "first_error", "worker_kept_running") if k in run}
    )
    reasons: collections.Counter[str] = collections.Counter()
    for run in good:
        reasons.update(run.get("loss_reasons") or {})
    notes += [f"leases lost: {count} x {reason}" for reason, count in reasons.most_common()]
    if notes:
        out["notes"] = notes
    failed = [run["error"] for run in runs if "error" in run]
    if failed:
        out["failed_runs"] = failed
    return out


def medians_of(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    return {
        scenario: {lib: median_of(lib_runs) for lib, lib_runs in by_lib.items()}
        for scenario, by_lib in runs.items()
    }


def run_all(args: argparse.Namespace, servers: list[Any]) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for scenario in args.scenarios:
        settings = scenario_settings(scenario, args)
        libs = list(args.libs)
        if scenario == "leases" and "pottery" in libs:  # and renewing at aioredlock's pace
            libs.insert(libs.index("pottery") + 1, "pottery-0.6ttl")
        runs[scenario] = {lib: [] for lib in libs}
        for round_index in range(args.rounds):
            shift = round_index % len(libs)
            for lib in libs[shift:] + libs[:shift]:
                started = time.monotonic()
                result = run_one(lib, scenario, servers, settings)
                result["round"] = round_index + 1
                runs[scenario][lib].append(result)
                shown = {k: v for k, v in result.items() if k not in ("traceback", "lib")}
                print(
                    f"{scenario:17s} round {round_index + 1} {lib:11s} "
                    f"({time.monotonic() - started:4.0f} s) {json.dumps(shown)[:260]}",
                    flush=True,
                )
    return runs


# --------------------------------------------------------------------------- report
# (scenario, key, label, lower is better)
COLUMNS: dict[str, list[tuple[str, str, bool]]] = {
    "latency": [
        ("p50_ms", "p50 ms", True),
        ("p99_ms", "p99 ms", True),
        ("cycles", "cycles", False),
    ],
    "contended": [
        ("critical_sections_per_s", "critical sections/s", False),
        ("jain_fairness", "Jain fairness", False),
        ("per_task_min", "min/task", False),
        ("per_task_max", "max/task", False),
        ("overlaps", "overlaps (worst run)", True),
    ],
    "leases": [
        ("client_cpu_percent", "client CPU % of one core", True),
        ("server_cpu_percent", "servers' CPU % (5 servers)", True),
        ("redis_commands_per_s", "Redis commands/s (5 servers)", True),
        ("lost_own_account_runs", "lost in each run, library's account", True),
        ("lost_by_servers_runs", "lost in each run, servers' account", True),
        ("survived", "runs in which every lease survived", False),
        ("acquire_all_s", "s to acquire them all", True),
        ("loop_lag_p99_ms", "event-loop lag p99 ms", True),
        ("loop_lag_max_ms", "event-loop lag max ms", True),
    ],
}
COLUMNS["latency-frozen"] = [
    *COLUMNS["latency"],
    ("stalled", "stalled: no cycle within the budget (worst run)", True),
]
COLUMNS["contended-frozen"] = [
    *COLUMNS["contended"],
    ("tasks_stuck_at_end", "tasks still inside the library at the end + grace", True),
]
RATIOS: dict[str, list[tuple[str, str, bool]]] = {
    "latency": [("p50_ms", "p50", True), ("p99_ms", "p99", True)],
    "contended": [
        ("critical_sections_per_s", "critical sections/s", False),
        ("jain_fairness", "fairness", False),
    ],
    "leases": [("client_cpu_percent", "client CPU", True)],
}
RATIOS["latency-frozen"] = RATIOS["latency"]
RATIOS["contended-frozen"] = RATIOS["contended"]


def titles(args: dict[str, Any]) -> dict[str, str]:
    frozen = f"server {FROZEN_NODE + 1} of {NODES} stopped (SIGSTOP) throughout"
    return {
        "latency": "Uncontended acquire + release, one task",
        "contended": (
            f"{args['tasks']} tasks on one name, {args['seconds']:g} s "
            f"({HOLD * 1e3:g} ms critical section, {PAUSE * 1e3:g} ms pause)"
        ),
        "latency-frozen": f"Uncontended acquire + release, one task, {frozen}",
        "contended-frozen": f"{args['tasks']} tasks on one name, {frozen}",
        "leases": (
            f"{args['leases']:,} leases held {args['lease_seconds']:g} s with renewal, "
            f"ttl {args['lease_ttl']:g} s"
        ),
    }


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def ratio(ours: Any, theirs: Any) -> str:
    if not isinstance(ours, int | float) or not isinstance(theirs, int | float):
        return "n/a"
    if math.isnan(ours) or math.isnan(theirs):
        return "n/a"
    if theirs == 0:
        return "n/a (peer: 0)"
    value = ours / theirs
    return f"{value:.2f}" if 0.1 <= value < 100 else f"{value:.3g}"


def report(data: dict[str, Any]) -> str:
    meta = data["meta"]
    args = meta["args"]
    names = titles(args)
    lines = [
        "# Redlock benchmark: aiolock, pottery, aioredlock on five servers",
        "",
        (
            f"Run {meta['when']} with `{meta['command']}` (aiolock at commit "
            f"{meta.get('commit', 'not recorded')}): medians of {args['rounds']} rounds; "
            "in each round every library runs once, one after another (the first one "
            "rotating from round to round), each run in a process of its own."
        ),
        (
            f"Machine: {meta['machine']}; servers: {NODES} x {meta['server']}, on loopback, "
            f"started for the run. Load average at the start: {meta['loadavg']}. Client "
            "and servers share the cores (and the machine is shared with other work): "
            "compare the ratios, measured in the same run, rather than the absolute figures."
        ),
        "",
        (
            "Ratios are aiolock's median divided by the peer's median: for latencies and "
            "CPU, below 1 means aiolock is lower (better); for critical sections/s and "
            "fairness, above 1 means aiolock is higher (better)."
        ),
        "",
        (
            f"Lock ttl: {args['ttl']:g} s; in the leases scenario {args['lease_ttl']:g} s. "
            f"Warm-up: {args['warmup']} cycles. Latency runs: {args['iterations']} cycles "
            f"(with a server stopped: at most {args['frozen_budget']:g} s of them)."
        ),
        "",
        meta["settings_note"],
        "",
    ]
    medians = data["medians"]
    for scenario in [s for s in SCENARIOS if s in medians]:
        rows = medians[scenario]
        columns = COLUMNS[scenario]
        lines += [f"## {names[scenario]}", ""]
        header = ["library", *[label for _, label, _ in columns]]
        peers = [lib for lib in rows if lib != "aiolock" and "error" not in rows[lib]]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for lib, row in rows.items():
            if "error" in row:
                lines.append(f"| {lib} | every run failed: {row['error']} |")
                continue
            cells = [lib]
            for key, _, _ in columns:
                value = row.get(key, "")
                cells.append(fmt(value))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        base = rows.get("aiolock", {})
        if peers and base and "error" not in base:
            ratio_header = ["aiolock / peer"] + [
                f"{label} ({'below' if lower_better else 'above'} 1: aiolock better)"
                for _, label, lower_better in RATIOS[scenario]
            ]
            lines += ["| " + " | ".join(ratio_header) + " |", "|" + "---|" * len(ratio_header)]
            for peer in peers:
                cells = [peer] + [
                    ratio(base.get(key), rows[peer].get(key)) for key, _, _ in RATIOS[scenario]
                ]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
        notes = [
            f"- {lib}: {note}"
            for lib, row in rows.items()
            for note in [*row.get("notes", []), *row.get("failed_runs", [])]
        ]
        counts = [
            f"{lib} {row['runs_ok']} of {row['runs']}"
            for lib, row in rows.items()
            if row.get("runs_ok") != row.get("runs")
        ]
        if counts:
            lines += [f"Runs that completed: {', '.join(counts)}.", ""]
        if notes:
            lines += ["Notes (from the runs):", "", *sorted(set(notes)), ""]
    if data.get("observations"):
        lines += ["## Observations", "", data["observations"], ""]
    if "leases" in medians:
        lines += [LEASES_NOTE, ""]
    return "\n".join(lines)


LEASES_NOTE = (
    "Leases: client CPU is the worker process's CPU time (`time.process_time()`) over the "
    "hold, as % of one core; servers' CPU and Redis commands (commands run inside scripts "
    "included) are summed over the five servers. A lease is lost by the library's account "
    "when the library says so (aiolock: `lease.lost`; pottery: an `extend()` raised; "
    "aioredlock: `lock.valid` is false) and by the servers' account when its key is not "
    "alive on a majority of the servers at the end of the hold. In a run that lost leases, "
    "their renewals stopped with them: its CPU figure is lower than keeping them all "
    "alive would cost. Event-loop lag: how late the worker's loop woke a task sleeping "
    "50 ms, sampled through the hold; a renewal due while the loop lags by more than what "
    "is left of the lease comes too late. pottery's first loss, in seconds from the start "
    "of the hold (negative: while the leases were being acquired), is in the JSON "
    "(`first_loss_s`)."
)


def settings_note() -> str:
    """The setup of the libraries, as this file's docstring describes it."""
    doc = __doc__ or ""
    return doc[doc.index("How the libraries are set up") :].strip()


def commit() -> str:
    """The commit of the working tree this runs in (aiolock's code), "+ changes" if dirty."""

    def git(*words: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(HERE), *words], capture_output=True, text=True, check=False
        )
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" + changes" if git("status", "--porcelain", "--", "aiolock") else "")


def machine() -> str:
    return (
        f"{os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="shorter runs (3 rounds)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--libs", default=",".join(LIBS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--ttl", type=float, default=10.0)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--iterations", type=int)
    parser.add_argument("--latency-budget", type=float)
    parser.add_argument("--frozen-budget", type=float)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--leases", type=int)
    parser.add_argument("--lease-ttl", type=float, default=2.0)
    parser.add_argument("--lease-seconds", type=float)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--report-only", action="store_true", help="rewrite the markdown")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lib", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return args
    defaults = {  # full, quick
        "warmup": (100, 50),
        "iterations": (2000, 500),
        "latency_budget": (60.0, 20.0),
        "frozen_budget": (20.0, 8.0),
        "seconds": (5.0, 3.0),
        "leases": (1000, 300),
        "lease_seconds": (20.0, 8.0),
    }
    for key, (full, quick) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    args.libs = args.libs.split(",")
    args.scenarios = [s for s in SCENARIOS if s in args.scenarios.split(",")]
    unknown = set(args.libs) - set(LIBS)
    if unknown or not args.scenarios:
        parser.error(f"libraries: {', '.join(LIBS)}; scenarios: {', '.join(SCENARIOS)}")
    return args


@contextlib.contextmanager
def five_servers() -> Iterator[tuple[list[Any], str]]:
    """Five throwaway servers (redis-server on PATH), stopped (and continued first, if
    stopped) on every path, SIGTERM to this process included."""
    from aiolock.testing import RedisServer, find_binaries

    binary = next((b for b in find_binaries() if b.kind == "redis"), None)
    if binary is None:
        sys.exit("no redis-server on PATH")

    def terminated(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated)
    servers: list[Any] = []
    try:
        for _ in range(NODES):
            servers.append(RedisServer(binary).start())  # noqa: PERF401 - stopped if one fails
        yield servers, f"redis {binary.version}"
    finally:
        for server in servers:
            with contextlib.suppress(Exception):
                server.resume()
            server.stop()
        signal.signal(signal.SIGTERM, previous)


def main() -> None:
    args = parse()
    if args.worker:
        asyncio.run(worker(args))
        return
    out = Path(args.out)
    json_path, md_path = out / "redlock.json", out / "redlock.md"
    if args.report_only:  # the medians again from the runs, and the markdown
        data = json.loads(json_path.read_text())
        data["medians"] = medians_of(data["runs"])
        json_path.write_text(json.dumps(data, indent=1, default=str))
        md_path.write_text(report(data))
        return
    command = "python benchmarks/redlock.py" + "".join(f" {a}" for a in sys.argv[1:])
    meta: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": command,
        "machine": machine(),
        "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "commit": commit(),
        "args": {k: v for k, v in vars(args).items() if k not in ("worker", "settings")},
        "settings_note": settings_note(),
    }
    random.seed()
    with five_servers() as (servers, description):
        meta["server"] = description
        runs = run_all(args, servers)
    data = {"meta": meta, "medians": medians_of(runs), "runs": runs}
    out.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(data, indent=1, default=str))
    md_path.write_text(report(data))
    print(report(data))
    print(f"wrote {md_path} and {json_path}")


if __name__ == "__main__":
    main()
