"""The client's instructions per uncontended lock cycle, counted by valgrind (callgrind): 64
tasks on names of their own, each making a `Lock` per cycle (as a request handler does),
for this tree and, beside it, any other checkout of the package: a figure the machine's
noise does not move (two runs of one tree agree within 0.3 %), for telling what a change
costs the client. With `--lib`, the same cycles through bench.py's other adapters: redis-py's
lock, and aiolock's scripts sent bare (the floor of aiolock's client work on redis-py).

    python benchmarks/cycle_instructions.py                       # this tree; about 15 s
    python benchmarks/cycle_instructions.py --tree ../old-checkout --tree .
    python benchmarks/cycle_instructions.py --lib aiolock --lib aiolock-scripts --lib redispy

For each tree a child process runs under `valgrind --tool=callgrind --instr-atstart=no`
with that tree first on its import path: it warms up (scripts loaded, a connection per
task), then counts its own instructions while the tasks make `--cycles` cycles each
(`callgrind_control -i on`, then off). The server is started once, outside valgrind. The
figures are per cycle, and each tree's ratio to the first.

Needs `valgrind` (with `callgrind_control`) on the PATH.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


async def child(url: str, lib: str, tasks: int, cycles: int) -> None:
    """In the child: warm up, then count the cycles' instructions."""
    from bench import ADAPTERS
    from callgrind import toggle

    adapter = ADAPTERS[lib]()
    await adapter.open(url)

    async def task(index: int, count: int) -> None:
        name = f"bench:cycle-instructions:{os.getpid()}:{index}"
        for _ in range(count):
            async with adapter.hold(name):
                pass

    try:
        await asyncio.gather(*(task(i, 10) for i in range(tasks)))
        toggle("on")
        await asyncio.gather(*(task(i, cycles) for i in range(tasks)))
        toggle("off")
    finally:
        await adapter.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        help="a checkout whose package is counted (repeatable; default: this one)",
    )
    parser.add_argument(
        "--lib",
        action="append",
        default=[],
        help="a bench.py adapter, counted for each tree (repeatable; default: aiolock)",
    )
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--cycles", type=int, default=20, help="cycles per task")
    parser.add_argument("--child", nargs=3, metavar=("TREE", "LIB", "URL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    if args.child:
        tree, lib, url = args.child
        sys.path.insert(0, str(Path(tree).resolve()))
        asyncio.run(child(url, lib, args.tasks, args.cycles))
        return
    sys.path.insert(0, str(HERE.parent))
    from callgrind import available, counted

    from aiolock.testing import RedisServer, find_binaries

    if not available():
        sys.exit("needs valgrind and callgrind_control on the PATH")
    trees = [str(Path(tree).resolve()) for tree in args.tree or [str(HERE.parent)]]
    libs = args.lib or ["aiolock"]
    binary = next(iter(find_binaries()))
    rows = []
    with RedisServer(binary) as server:
        for tree in trees:
            for lib in libs:
                instructions, _ = counted(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        tree,
                        lib,
                        server.url,
                        "--tasks",
                        str(args.tasks),
                        "--cycles",
                        str(args.cycles),
                    ]
                )
                rows.append((tree, lib, instructions / (args.tasks * args.cycles)))
    print(f"| tree | lib | instructions per cycle ({args.tasks} tasks) | ÷ the first |")
    print("|---|---|---:|---:|")
    for tree, lib, per_cycle in rows:
        print(f"| {tree} | {lib} | {per_cycle:,.0f} | {per_cycle / rows[0][2]:.3f} |")


if __name__ == "__main__":
    main()
