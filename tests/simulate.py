"""Run aiolock's real client under deterministic simulation (`tests.simulation`).

```
python -m tests.simulate --seconds 60                 # seeds 0, 1, 2, ... for 60 s
python -m tests.simulate --seconds 3600 --jobs 2      # a long run on 2 cores: runs per hour
python -m tests.simulate --seed 1234 [--trace]        # one seed again, byte for byte
python -m tests.simulate --mutant quorum-half --seconds 300   # a planted bug, found?
python -m tests.simulate --list-mutants
```

Exit status: 0 when every run held; 1 when one did not, after printing its seed, its
scenario, what was wrong and its trace (`--seed S` replays it); 2 on bad arguments. With
`--mutant NAME` the patch `tests/simulation/mutants/NAME.patch` is applied to a temporary
copy of the package (never to this tree) and the runs use that copy: a mutant found is a
failing run (exit 1, "found at seed S after N runs"), one that survives the budget exits 0.

The same seed gives the same run: string hashing is fixed (`PYTHONHASHSEED=0`: the command
starts itself again with it when it is not set so), and every other source of chance is
drawn from the seed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "tests" / "simulation" / "mutants"
HASH_SEED = "0"
EXPECT = "AIOLOCK_SIMULATE_PACKAGE"
"""Set for a mutant's runs: the copy of the package they must import."""
MUTANT = "AIOLOCK_SIMULATE_MUTANT"
"""Set for a mutant's runs: its name (for the replay command printed)."""


def _say(*parts: object, file: TextIO = sys.stdout) -> None:
    file.write(" ".join(str(p) for p in parts) + "\n")
    file.flush()


def _quiet() -> None:
    for name in ("aiolock", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _one(seed: int, kind: str | None, trace: bool = False) -> tuple[int, bool, str, int]:
    """Run `seed`: (seed, held, report, sections)."""
    _quiet()
    from tests.simulation.world import run, scenario_for  # imported once the hash seed is fixed

    outcome = run(seed, scenario_for(seed, kind), trace=trace)
    return seed, outcome.ok, outcome.report(), outcome.verdict.sections


def mutant_kind(name: str) -> str | None:
    """The primitive a mutant's patch names in its header (`Simulate: kind=K`), if any (none
    for a mutant that does not exist: `mutated` says so)."""
    patch = MUTANTS / f"{name}.patch"
    if not patch.is_file():
        return None
    for line in patch.read_text().splitlines():
        if line.startswith("Simulate: kind="):
            return line.partition("=")[2].strip()
        if line.startswith("diff "):
            break
    return None


def _search(args: argparse.Namespace) -> int:
    """Seeds from `args.first` until one fails or the budget is spent."""
    import aiolock

    expected = os.environ.get(EXPECT)
    if expected and Path(aiolock.__file__).parent != Path(expected):
        _say(f"the runs would use {aiolock.__file__}, not the mutant's copy {expected}")
        return 2
    started = time.monotonic()
    runs = sections = 0
    seeds = iter(range(args.first, args.first + args.runs))
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        running: set[Future[tuple[int, bool, str, int]]] = set()
        failed: tuple[int, str] | None = None
        while True:
            while (
                failed is None
                and len(running) < args.jobs
                and (time.monotonic() - started < args.seconds)
            ):
                seed = next(seeds, None)
                if seed is None:
                    break
                running.add(pool.submit(_one, seed, args.kind))
            if not running:
                break
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                seed, ok, report, count = future.result()
                runs += 1
                sections += count
                if not ok and (failed is None or seed < failed[0]):
                    failed = (seed, report)
    elapsed = time.monotonic() - started
    per_hour = runs / elapsed * 3600 if elapsed else 0.0
    _say(
        f"{runs} runs ({sections} critical sections) in {elapsed:.1f} s on {args.jobs} "
        f"process(es): {per_hour:.0f} runs per hour"
    )
    if failed is not None:
        seed, report = failed
        _say(f"FAILED at seed {seed} (after {runs} runs)")
        _say(report)
        kind = f" --kind {args.kind}" if args.kind else ""
        mutant = os.environ.get(MUTANT)
        planted = f" --mutant {mutant}" if mutant else ""
        _say(f"replay: python -m tests.simulate --seed {seed}{kind}{planted} --trace")
        return 1
    return 0


class MutantError(Exception):
    """A planted bug that does not exist or whose patch does not apply."""


@contextlib.contextmanager
def mutated(name: str) -> Iterator[tuple[Path, dict[str, str]]]:
    """A temporary copy of the package with the planted bug `name` applied (never this
    tree): the copy's directory, and the environment a program run from it needs (the
    copy's aiolock first on the path, this tree's tests after). `tests.explore` runs its
    planted bugs through it too."""
    patch = MUTANTS / f"{name}.patch"
    if not patch.is_file():
        raise MutantError(f"no mutant {name!r} (see python -m tests.simulate --list-mutants)")
    with tempfile.TemporaryDirectory(prefix="aiolock-mutant-") as tmp:
        shutil.copytree(ROOT / "aiolock", Path(tmp) / "aiolock")
        applied = subprocess.run(
            ["git", "apply", "--unsafe-paths", f"--directory={tmp}", str(patch)],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
        )
        if applied.returncode != 0:
            raise MutantError(f"mutant {name}: the patch does not apply:\n{applied.stderr}")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join((tmp, str(ROOT)))}
        env[EXPECT] = str(Path(tmp) / "aiolock")
        env[MUTANT] = name
        yield Path(tmp), env


def _mutant(args: argparse.Namespace) -> int:
    """Apply the mutant to a copy of the package and search with that copy."""
    command = [sys.executable, "-m", "tests.simulate", "--seconds", str(args.seconds)]
    command += ["--jobs", str(args.jobs), "--first", str(args.first)]
    command += ["--runs", str(args.runs)]
    kind = args.kind or mutant_kind(args.mutant)
    if kind:
        command += ["--kind", kind]
    if args.seed is not None:
        command += ["--seed", str(args.seed)] + (["--trace"] if args.trace else [])
    try:
        with mutated(args.mutant) as (copy, env):
            result = subprocess.run(command, cwd=copy, env=env, check=False)
    except MutantError as error:
        _say(str(error), file=sys.stderr)
        return 2
    verdict = "found" if result.returncode == 1 else "not found"
    _say(f"mutant {args.mutant}: {verdict}")
    return result.returncode


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.simulate", description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="wall-clock budget")
    parser.add_argument("--seed", type=int, help="run this seed only")
    parser.add_argument("--first", type=int, default=0, help="the first seed searched")
    parser.add_argument("--runs", type=int, default=10**9, help="at most this many runs")
    parser.add_argument("--jobs", type=int, default=1, help="processes running seeds")
    parser.add_argument(
        "--kind", choices=("lock", "semaphore", "redlock", "multilock", "election", "rwlock")
    )
    parser.add_argument("--mutant", help="a planted bug of tests/simulation/mutants")
    parser.add_argument("--trace", action="store_true", help="with --seed: every step")
    parser.add_argument("--list-mutants", action="store_true")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.jobs < 1 or args.runs < 1:
        parser.error("--seconds must be > 0, --jobs and --runs >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.list_mutants:
        for patch in sorted(MUTANTS.glob("*.patch")):
            _say(patch.stem)
        return 0
    if args.mutant:
        return _mutant(args)
    if args.seed is not None:
        _, ok, report, _ = _one(args.seed, args.kind, args.trace)
        _say(report)
        return 0 if ok else 1
    return _search(args)


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        os.environ["PYTHONHASHSEED"] = HASH_SEED
        os.execv(sys.executable, [sys.executable, "-m", "tests.simulate", *sys.argv[1:]])
    sys.exit(main())
