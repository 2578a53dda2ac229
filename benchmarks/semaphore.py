"""A semaphore's cost as its limit grows: `aiolock.Semaphore` against the N-locks workaround,
and the server time each permit costs. Starts its own throwaway Redis (the first server
binary `aiolock.testing.find_binaries()` finds) and writes `benchmarks/results/semaphore.md`.

    python benchmarks/semaphore.py [--rounds 5] [--seconds 3] [--out PATH]

Two measurements:

1. Critical sections per second, one process, `tasks` tasks each taking a permit, doing
   nothing in it but one `asyncio.sleep(0)`, and giving it back, in a loop:
   - `Semaphore(limit=L)`: `async with semaphore:`;
   - the N-locks workaround, what users write without a semaphore: L `aiolock.Lock`s named
     `NAME:0` .. `NAME:L-1` (the objects made once); a task tries each once with
     `try_acquire()` (one round trip each) in a new random order, takes the first it gets,
     and when all L are busy waits on one of them picked at random with `acquire()` (the
     lock's own queue wakes it when that lock is released).
   The two run one after the other in each round (their order alternating), and the ratio
   reported is the median over the rounds of semaphore / workaround in that round.

2. Server time per permit: with L - 1 permits held by others, one task acquires and
   releases a permit `CYCLES` times; the server's own time for the script calls
   (`INFO commandstats`, usec of `evalsha` and `eval`), per cycle, and the commands per
   cycle. Medians over the rounds, and each limit's ratio to limit 4.

Figures depend on the machine: only the ratios, measured in one run, mean something.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiolock import Lock, Semaphore
from aiolock.testing import RedisServer, ServerBinary, find_binaries

THROUGHPUT = ((16, 32), (256, 512))
"""(limit, tasks) of the throughput measurement."""
SERVER_LIMITS = (4, 16, 256)
CYCLES = 400
TTL = 30.0


async def semaphore_sections(
    client: Any, name: str, limit: int, tasks: int, seconds: float
) -> float:
    semaphore = Semaphore(client, name, limit=limit, ttl=TTL)
    done = 0
    held = 0
    most = 0
    stop = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done, held, most
        while time.monotonic() < stop:
            async with semaphore:
                held += 1
                most = max(most, held)
                await asyncio.sleep(0)
                held -= 1
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    elapsed = time.monotonic() - started
    if most > limit:
        raise AssertionError(f"{most} holders of a semaphore of limit {limit}")
    return done / elapsed


async def workaround_sections(
    client: Any, name: str, limit: int, tasks: int, seconds: float
) -> float:
    locks = [Lock(client, f"{name}:{i}", ttl=TTL) for i in range(limit)]
    done = 0
    stop = time.monotonic() + seconds

    async def take() -> Any:
        order = list(range(limit))
        random.shuffle(order)
        for i in order:
            lease = await locks[i].try_acquire()
            if lease is not None:
                return lease
        return await random.choice(locks).acquire()

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < stop:
            lease = await take()
            async with lease:
                await asyncio.sleep(0)
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    return done / (time.monotonic() - started)


def script_stats(info: dict[str, Any]) -> tuple[int, int]:
    """(usec, calls of every command) from INFO commandstats; usec of the script calls."""
    usec = sum(int(info.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in ("evalsha", "eval"))
    calls = sum(int(v["calls"]) for k, v in info.items() if k != "cmdstat_info")
    return usec, calls


async def server_time(client: Any, name: str, limit: int) -> tuple[float, float, float]:
    """(server usec, commands, script calls) per acquire-and-release cycle, with
    limit - 1 permits held by others."""
    semaphore = Semaphore(client, name, limit=limit, ttl=TTL)
    others = [await semaphore.acquire() for _ in range(limit - 1)]
    try:
        for _ in range(20):  # scripts loaded, connections open
            async with semaphore:
                pass
        info = await client.info("commandstats")
        usec0, calls0 = script_stats(info)
        evals0 = sum(int(info.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))
        for _ in range(CYCLES):
            async with semaphore:
                pass
        info = await client.info("commandstats")
        usec1, calls1 = script_stats(info)
        evals1 = sum(int(info.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))
    finally:
        for lease in others:
            await lease.release()
    return (usec1 - usec0) / CYCLES, (calls1 - calls0) / CYCLES, (evals1 - evals0) / CYCLES


async def main(rounds: int, seconds: float, binary: ServerBinary, version: str) -> str:
    with RedisServer(binary) as server:
        client = redis.asyncio.Redis.from_url(server.url, max_connections=1024)
        try:
            ratios: dict[tuple[int, int], list[float]] = {k: [] for k in THROUGHPUT}
            rates: dict[tuple[int, int], list[tuple[float, float]]] = {k: [] for k in THROUGHPUT}
            usec: dict[int, list[float]] = {k: [] for k in SERVER_LIMITS}
            commands: dict[int, list[float]] = {k: [] for k in SERVER_LIMITS}
            for r in range(rounds):
                for limit in SERVER_LIMITS:
                    spent, calls, _ = await server_time(client, f"bench:st:{r}:{limit}", limit)
                    usec[limit].append(spent)
                    commands[limit].append(calls)
                for limit, tasks in THROUGHPUT:
                    runs = [
                        ("sem", semaphore_sections),
                        ("nlocks", workaround_sections),
                    ]
                    if r % 2:
                        runs.reverse()
                    got = {}
                    for label, run in runs:
                        got[label] = await run(
                            client, f"bench:{label}:{r}:{limit}", limit, tasks, seconds
                        )
                    rates[(limit, tasks)].append((got["sem"], got["nlocks"]))
                    ratios[(limit, tasks)].append(got["sem"] / got["nlocks"])
                print(f"round {r + 1}/{rounds} done", file=sys.stderr)
        finally:
            await client.aclose()

    base = statistics.median(usec[4])
    lines = [
        "# Semaphore cost by limit",
        "",
        (
            f"`python benchmarks/semaphore.py --rounds {rounds} --seconds {seconds:g}` on "
            f"Redis {version}, Python {sys.version.split()[0]}; {rounds} interleaved rounds, "
            "medians. The machine was shared: only the ratios of one run compare."
        ),
        "",
        (
            "Server time per permit (acquire and release, limit - 1 permits held by others; "
            "`INFO commandstats` usec of the script calls):"
        ),
        "",
        "| limit | server µs per permit, ratio to limit 4 | commands per cycle |",
        "|---|---|---|",
    ]
    lines += [
        f"| {limit} | {statistics.median(usec[limit]) / base:.2f} | "
        f"{statistics.median(commands[limit]):g} |"
        for limit in SERVER_LIMITS
    ]
    lines += [
        "",
        (
            "Critical sections per second, `Semaphore` / the N-locks workaround (one "
            "process; see the module docstring for the workaround), median of the per-round "
            "ratios (min - max):"
        ),
        "",
        "| limit / tasks | ratio |",
        "|---|---|",
    ]
    for (limit, tasks), values in ratios.items():
        lines.append(
            f"| {limit} / {tasks} | {statistics.median(values):.2f} "
            f"({min(values):.2f} - {max(values):.2f}) |"
        )
    text = "\n".join(lines) + "\n"
    # Absolute figures, for the terminal only (they depend on the machine).
    for limit in SERVER_LIMITS:
        print(f"limit {limit}: {statistics.median(usec[limit]):.1f} server µs per permit")
    for key, pairs in rates.items():
        sem = statistics.median(p[0] for p in pairs)
        nl = statistics.median(p[1] for p in pairs)
        print(f"{key}: semaphore {sem:.0f}/s, workaround {nl:.0f}/s")
    return text


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "semaphore.md"
    )
    arguments = parser.parse_args()
    found = next(b for b in find_binaries() if b.kind == "redis")
    found_version = (
        subprocess.run([found.path, "--version"], capture_output=True, text=True, check=True)
        .stdout.split()[2]
        .removeprefix("v=")
    )
    report = asyncio.run(main(arguments.rounds, arguments.seconds, found, found_version))
    arguments.out.parent.mkdir(parents=True, exist_ok=True)
    arguments.out.write_text(report)
    print(report)
