"""Synchronous locks: aiolock.sync beside redis-py's `Lock` and python-redis-lock.

    bash benchmarks/setup.sh                      # once: python-redis-lock in benchmarks/.venv
    benchmarks/.venv/bin/python benchmarks/sync.py            # about 2 minutes, 3 rounds
    benchmarks/.venv/bin/python benchmarks/sync.py --quick    # about 30 s

Starts a throwaway `redis-server` (`aiolock.testing.RedisServer`: loopback, a free port;
never a shared server) and runs, for each library, in one process, one after another:

- `uncontended`: one thread, acquire + release of one name, again and again for
  `--seconds` after a warm-up: cycles per second, and p50 / p99 of the cycle.
- `contended`: 8 threads on one name for `--seconds`, each acquiring, holding it for no
  time, releasing, again: critical sections per second, and overlaps (two holders at once
  by the threads' own clock; must be 0).

Rounds are interleaved (each round runs every library once, the first library rotating)
and the figures are medians over the rounds; the ratios (aiolock.sync / each other) come
from the same run. Writes `benchmarks/results/sync.md`.

The libraries, each with its documented defaults but for the ttl (10 s):

- `aiolock.sync`: `with Lock(client, name, ttl=10)`, one `Lock` object shared by the
  threads; a background event loop renews the lease (none is renewed here: the cycles
  are short) and runs the scripts.
- `redispy`: `client.lock(name, timeout=10)`, redis-py's sync `Lock`: SET NX with a retry
  every `sleep` (0.1 s by default) when busy; `redispy-fast`: `sleep=0.001`.
- `python-redis-lock`: `redis_lock.Lock(client, name, expire=10)`: SET NX, a BLPOP on a
  signal key when busy, woken by the release.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
THREADS = 8
TTL = 10


def _aiolock(
    client: redis.Redis, name: str
) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    import aiolock.sync

    lock = aiolock.sync.Lock(client, name, ttl=TTL)
    return lambda: lock


def _redispy(sleep: float) -> Callable[..., Callable[[], contextlib.AbstractContextManager[Any]]]:
    def make(
        client: redis.Redis, name: str
    ) -> Callable[[], contextlib.AbstractContextManager[Any]]:
        return lambda: client.lock(name, timeout=TTL, sleep=sleep, thread_local=False)

    return make


def _python_redis_lock(
    client: redis.Redis, name: str
) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    import redis_lock

    @contextlib.contextmanager
    def hold() -> Iterator[None]:
        lock = redis_lock.Lock(client, name, expire=TTL)
        lock.acquire()
        try:
            yield
        finally:
            lock.release()

    return hold


LIBS: dict[str, Callable[..., Callable[[], contextlib.AbstractContextManager[Any]]]] = {
    "aiolock.sync": _aiolock,
    "redispy": _redispy(0.1),
    "redispy-fast": _redispy(0.001),
    "python-redis-lock": _python_redis_lock,
}


def uncontended(make: Any, client: redis.Redis, seconds: float) -> dict[str, float]:
    hold = make(client, f"bench:sync:{uuid.uuid4().hex[:8]}")
    for _ in range(200):  # warm-up: connections open, scripts loaded
        with hold():
            pass
    cycles: list[float] = []
    end = time.perf_counter() + seconds
    while (start := time.perf_counter()) < end:
        with hold():
            pass
        cycles.append(time.perf_counter() - start)
    cycles.sort()
    return {
        "cycles_per_s": len(cycles) / seconds,
        "p50_us": cycles[len(cycles) // 2] * 1e6,
        "p99_us": cycles[int(len(cycles) * 0.99)] * 1e6,
    }


def contended(make: Any, client: redis.Redis, seconds: float) -> dict[str, float]:
    hold = make(client, f"bench:sync:{uuid.uuid4().hex[:8]}")
    with hold():
        pass
    records: list[tuple[float, float]] = []
    start = threading.Barrier(THREADS)
    end_at = [0.0]

    def worker() -> None:
        mine: list[tuple[float, float]] = []
        start.wait()
        while time.monotonic() < end_at[0]:
            with hold():
                entered = time.monotonic()
                mine.append((entered, time.monotonic()))
        records.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(THREADS)]
    end_at[0] = time.monotonic() + seconds + 0.05
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 120)
    records.sort()
    overlaps = sum(1 for a, b in itertools.pairwise(records) if b[0] < a[1])
    return {"sections_per_s": len(records) / seconds, "overlaps": overlaps}


def available(lib: str) -> bool:
    if lib == "python-redis-lock":
        try:
            import redis_lock  # noqa: F401
        except ImportError:
            return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--out", default=str(RESULTS / "sync.md"))
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 3)
    seconds = args.seconds or (2.0 if args.quick else 5.0)
    libs = [lib for lib in LIBS if available(lib)]
    import aiolock.sync
    from aiolock.testing import RedisServer, find_binaries

    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    server = RedisServer(find_binaries()[0]).start()
    results: dict[str, dict[str, list[float]]] = {lib: {} for lib in libs}
    try:
        client = redis.Redis.from_url(server.url, max_connections=64)
        for round_ in range(rounds):
            order = libs[round_ % len(libs) :] + libs[: round_ % len(libs)]
            for lib in order:
                for scenario in (uncontended, contended):
                    figures = scenario(LIBS[lib], client, seconds)
                    for key, value in figures.items():
                        results[lib].setdefault(f"{scenario.__name__}.{key}", []).append(value)
                aiolock.sync.shutdown()
            sys.stderr.write(f"round {round_ + 1}/{rounds} done\n")
        client.close()
    finally:
        server.stop()
    report = _report(results, rounds, seconds)
    report += (
        f"\nMachine: {os.cpu_count()} cores, load average {load_before} before and "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} after; Python "
        f"{platform.python_version()}, redis-py {redis.__version__}.\n"
    )
    Path(args.out).write_text(report, encoding="utf-8")
    print(report)
    return 1 if any(max(r.get("contended.overlaps", [0])) for r in results.values()) else 0


def _report(results: dict[str, dict[str, list[float]]], rounds: int, seconds: float) -> str:
    median = {lib: {k: statistics.median(v) for k, v in r.items()} for lib, r in results.items()}
    mine = median["aiolock.sync"]
    lines = [
        "# Synchronous locks",
        "",
        (
            f"`benchmarks/sync.py`: {rounds} rounds of {seconds:g} s per scenario, medians; "
            "one local server, one process. Ratios: aiolock.sync / the library (above 1: "
            "aiolock.sync does more)."
        ),
        "",
        (
            "| library | uncontended cycles/s | p50 µs | p99 µs | 8 threads, sections/s | overlaps "
            "| ratio uncontended | ratio 8 threads |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lib, m in median.items():
        lines.append(
            f"| {lib} | {m['uncontended.cycles_per_s']:.0f} | {m['uncontended.p50_us']:.0f} | "
            f"{m['uncontended.p99_us']:.0f} | {m['contended.sections_per_s']:.0f} | "
            f"{max(results[lib]['contended.overlaps']):.0f} | "
            f"{mine['uncontended.cycles_per_s'] / m['uncontended.cycles_per_s']:.2f} | "
            f"{mine['contended.sections_per_s'] / m['contended.sections_per_s']:.2f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
