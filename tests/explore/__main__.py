"""Explore aiolock's protocol exhaustively within bounds (`tests.explore`).

```
python -m tests.explore                         # the lock, depth 8
python -m tests.explore --kind semaphore --depth 7
python -m tests.explore --kind redlock --no-drift-bound   # Kleppmann's trace
python -m tests.explore --kind rwlock           # c0 writes, c1 and c2 read
python -m tests.explore --names 2               # a lock, each acquisition on one of 2 names
python -m tests.explore --kind election         # three candidates, terms announced
python -m tests.explore --mutant release-any-token
```

Exit status: 0 when no invariant is broken within the bounds; 1 with the counterexample
(each step: the move, the call and its reply); 2 on bad arguments. With `--mutant NAME`
the patch `tests/simulation/mutants/NAME.patch` is applied to a temporary copy of the
package by `tests.simulate`'s own function, and the exploration runs on that copy (a
mutant found is exit 1). A crash of the explorer exits 3.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

DEFAULT_DEPTH = {"lock": 8, "semaphore": 8, "redlock": 8, "rwlock": 8, "election": 8}
NAMES_DEPTH = 7
"""The default depth of a lock on two names (each client picks a name per acquisition)."""


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _mutant(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """The exploration again, on a copy of the package with the planted bug applied
    (`tests.simulate.mutated`)."""
    from tests import simulate

    kind = args.kind or simulate.mutant_kind(args.mutant) or "lock"
    rest = [a for a in argv if a not in ("--mutant", args.mutant)]
    rest = [a for a in rest if not a.startswith("--mutant=")]
    if not args.kind:
        rest += ["--kind", kind]
    command = [sys.executable, "-m", "tests.explore", *rest]
    try:
        with simulate.mutated(args.mutant) as (copy, env):
            result = subprocess.run(command, cwd=copy, env=env, check=False)
    except simulate.MutantError as error:
        _say(str(error))
        return 2
    verdict = "found" if result.returncode == 1 else "not found"
    _say(f"mutant {args.mutant}: {verdict}")
    return result.returncode


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.explore",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--kind", choices=("lock", "semaphore", "redlock", "rwlock", "election"))
    parser.add_argument(
        "--names",
        type=int,
        default=1,
        help="a lock's names (1 or 2): each client picks its name at each acquisition",
    )
    parser.add_argument("--depth", type=int, help="moves from the start (default per kind)")
    parser.add_argument("--mutant", help="a planted bug of tests/simulation/mutants")
    parser.add_argument("--clients", type=int, help="clients (default 3; a Redlock's 2)")
    parser.add_argument(
        "--cycles", type=int, help="acquisitions per client (default 2; a Redlock's 1)"
    )
    parser.add_argument("--restarts", type=int, help="node restarts (default 1; a Redlock's 0)")
    parser.add_argument("--losses", type=int, default=1, help="replies lost")
    parser.add_argument(
        "--pauses",
        type=int,
        help="client pauses (default 0 under the clock-drift bound, where a pause is only a "
        "client taking no step, which the interleavings cover; 1 without it)",
    )
    parser.add_argument(
        "--no-drift-bound",
        action="store_true",
        help="a paused client's clock stops (its deadline passes the servers' expiry)",
    )
    parser.add_argument(
        "--exclusion-only",
        action="store_true",
        help="check mutual exclusion alone, not that a believing holder is held by the nodes",
    )
    parser.add_argument(
        "--walks",
        type=int,
        default=0,
        help="after the exhaustive search, this many random walks from the start",
    )
    parser.add_argument("--walk-depth", type=int, help="moves per walk (default 4 x depth)")
    parser.add_argument("--seed", type=int, default=0, help="the walks' seed")
    args = parser.parse_args(argv)
    if args.walks < 0 or (args.walk_depth is not None and args.walk_depth < 1):
        parser.error("--walks must be >= 0 and --walk-depth >= 1")
    if args.depth is not None and args.depth < 1:
        parser.error("--depth must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse(argv)
    if args.mutant:
        return _mutant(args, argv)
    logging.getLogger("aiolock").setLevel(logging.CRITICAL)
    import aiolock

    expected = os.environ.get("AIOLOCK_SIMULATE_PACKAGE")
    if expected and Path(aiolock.__file__).parent != Path(expected):
        _say(f"the exploration would use {aiolock.__file__}, not the mutant's copy {expected}")
        return 2
    from .kinds import make_kind
    from .model import Bounds
    from .search import explore, walk

    name = args.kind or "lock"
    try:
        kind = make_kind(name, names=args.names)
    except ValueError as error:
        _say(str(error))
        return 2
    redlock = name == "redlock"
    bounds = Bounds(
        clients=args.clients or (2 if redlock else 3),
        queued=(3 if name == "election" else 1) if kind.queues else 0,
        cycles=args.cycles or (1 if redlock else 2),
        restarts=args.restarts if args.restarts is not None else (0 if redlock else 1),
        losses=args.losses,
        pauses=args.pauses if args.pauses is not None else (1 if args.no_drift_bound else 0),
        drift_bound=not args.no_drift_bound,
        agreement=not args.exclusion_only,
    )
    if bounds.clients < 1:
        _say("--clients must be >= 1")
        return 2
    bounds = dataclasses.replace(bounds, queued=min(bounds.queued, bounds.clients))
    depth = args.depth or (NAMES_DEPTH if kind.names > 1 else DEFAULT_DEPTH[name])
    outcome = explore(kind, bounds, depth)
    if outcome.held and args.walks:
        walk(
            kind,
            bounds,
            outcome,
            walks=args.walks,
            depth=args.walk_depth or 4 * depth,
            seed=args.seed,
        )
    _say(outcome.report())
    return 0 if outcome.held else 1


if __name__ == "__main__":
    try:
        status = main()
    except Exception:  # noqa: BLE001 - any crash: not a counterexample (exit 1), told apart
        traceback.print_exc()
        status = 3
    sys.exit(status)
