"""A rolling upgrade under the safety checker: the previous release, built from git in a
virtualenv of its own, and this tree share one lock name.

```
python -m tests.upgrade             # from 6d9b9a6 (the last release writing layout 1), 60 s
python -m tests.upgrade --from 6d9b9a6 --seconds 20 --variant both
python -m tests.upgrade --limit 5 --weights 3   # a semaphore, from a645d7a (layout 2)
```

With `--limit N` the name is a semaphore of that limit (by default from SEMAPHORE_FROM, the
version before leases of several permits), and with `--weights W` as well each section of
this tree's processes takes 1 to W permits at once while the old processes take one each:
the checker sums the permits of the sections at once, never more than N.

What it does: `git archive` extracts the old commit into a temporary directory (no work
tree is left behind), a virtualenv there gets the old package (with its dependencies:
`redis`, `anyio`), a throwaway server is started, and the checker (`tests/checker.py`) runs
2 processes of the old version and 2 of this one on ONE lock name, one of each side with 1
task and the other with 4 (`--tasks`): ttl 1 s, bodies of up to 10 ms, so that the lock is
always wanted and changes hands between the versions many times a second. The new processes run with `AIOLOCK_SERVE_LAYOUT1_WAITERS=1`,
as the README's upgrade procedure says; `--variant without` runs them without it, and
`--variant both` runs both and compares them.

The run fails (exit status 1) unless, in every variant run:

- no two critical sections overlap, fencing tokens strictly increase, nothing is left held
  (the checker's verdict);
- neither side errors: no worker exits with an error or writes to its standard error (a
  traceback, a logged warning), no `BackendError`, no lease reported lost (there are no
  faults, so any loss is unexpected);

and, with the variable (the procedure as documented):

- both sides completed critical sections, and the lock went from old to new and from new
  to old;
- every wait is bounded: no task went `--max-wait` seconds (default 5 s, the workers'
  acquire timeout) without the lock. Acquire timeouts are counted, not errors: each worker
  task waits at most 5 s per attempt, and the tasks still waiting when the run ends time
  out then.

A failing run's history (every section, labelled "old:" or "new:"), the workers' standard
error and the summary are kept in a directory whose path is printed.

"Waits" are measured from the history: for each task, the time from the start to its
first section, between the end of one of its sections and the start of its next, and from
its last section to the end of the run (a wait the end cut short). A hand-off is two
consecutive sections of the name (in the order entered); its latency is the time between
the first one's end and the second one's start.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import json
import math
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .checker import SERVE_LAYOUT1, CheckerConfig, Report, run

__all__ = ("Analysis", "analyse", "build_old", "extract", "main", "problems")

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FROM = "6d9b9a6"
"""The last release that writes data layout 1."""
SEMAPHORE_FROM = "a645d7a"
"""The default with `--limit`: the last version before leases of several permits (layout
2: its semaphore scripts count a permit per field and per slot of the index)."""
ACQUIRE_TIMEOUT = 5.0
"""How long a checker worker's task waits for the lock at most, per attempt (its protocol)."""
TASK_MIX = (1, 4)
"""Tasks of each process in turn (old, old, new, new): a process with one task releases
with no waiter of its own, one with four mostly with its own waiters queued (two paths of
the release script)."""
SIDES = ("old", "new")
VARIANTS = {"with": True, "without": False}
"""Variant name -> whether the new processes run with AIOLOCK_SERVE_LAYOUT1_WAITERS=1."""


class SetupError(Exception):
    """The old version could not be built, or the check could not start."""


# =========================================================================== the history
@dataclass(slots=True)
class SideStats:
    side: str
    processes: int
    tasks: int
    sections: int = 0
    counters: Counter[str] = field(default_factory=Counter)
    waits: list[float] = field(default_factory=list)
    tasks_seen: int = 0
    timeouts_before_end: int = 0
    """Acquire timeouts that the history shows happened before the end: a task without the
    lock for a whole acquire timeout (or more)."""

    @property
    def longest_wait(self) -> float:
        return max(self.waits, default=0.0)

    @property
    def p99_wait(self) -> float:
        return _percentile(self.waits, 0.99)


@dataclass(slots=True)
class Analysis:
    sides: dict[str, SideStats]
    handoffs: dict[tuple[str, str], list[float]]
    """(from side, to side) -> the latency of each hand-off, seconds."""

    def handoff_count(self, source: str, target: str) -> int:
        return len(self.handoffs.get((source, target), []))


def _percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]


def analyse(report: Report) -> Analysis:
    """Sections, waits and timeouts per side, and the hand-offs between sides."""
    config = report.config
    sides = {
        side: SideStats(
            side,
            processes=config.sides.count(side),
            tasks=sum(config.tasks_of(i) for i, other in enumerate(config.sides) if other == side),
            counters=report.side_counters(side),
        )
        for side in SIDES
    }
    by_task: dict[str, list[tuple[float, float]]] = {}
    for section in report.sections:
        by_task.setdefault(section.worker, []).append((section.enter, section.exit))
        sides[section.side].sections += 1
    for task, times in by_task.items():
        stats = sides[task.partition(":")[0]]
        stats.tasks_seen += 1
        times.sort()
        waits = [times[0][0] - report.started]
        waits += [enter - exit_ for (_, exit_), (enter, _) in itertools.pairwise(times)]
        waits.append(max(0.0, report.ended - times[-1][1]))
        stats.waits += waits
        stats.timeouts_before_end += sum(int(wait // ACQUIRE_TIMEOUT) for wait in waits)
    for stats in sides.values():
        # A task that never entered a section waited the whole run.
        never = stats.tasks - stats.tasks_seen
        stats.waits += [report.ended - report.started] * never
        stats.timeouts_before_end += never * int(config.duration // ACQUIRE_TIMEOUT)
    handoffs: dict[tuple[str, str], list[float]] = {}
    for earlier, later in itertools.pairwise(report.sections):
        handoffs.setdefault((earlier.side, later.side), []).append(
            max(0.0, later.enter - earlier.exit)
        )
    return Analysis(sides, handoffs)


def problems(report: Report, analysis: Analysis, *, liveness: bool, max_wait: float) -> list[str]:
    """Why the run fails the upgrade check (empty: it passes)."""
    found: list[str] = []
    verdict = report.verdict
    if verdict.overlaps:
        found.append(f"{len(verdict.overlaps)} overlapping critical sections")
    if verdict.token_violations:
        found.append(f"{len(verdict.token_violations)} fencing tokens out of order or repeated")
    if report.leaked:
        found.append(f"locks left held after their ttl: {', '.join(report.leaked)}")
    found += [f"worker failure: {failure}" for failure in report.worker_failures]
    for index, (side, log) in enumerate(
        zip(report.config.sides, report.worker_stderr, strict=False)
    ):
        if log.strip():
            found.append(f"{side} worker {index} wrote to its standard error:\n{log[-2000:]}")
    for side, stats in analysis.sides.items():
        for outcome in ("backend errors", "lost"):
            if stats.counters[outcome]:
                found.append(f"{side} side: {stats.counters[outcome]} {outcome}")
    if not liveness:
        return found
    for side, stats in analysis.sides.items():
        if not stats.sections:
            found.append(f"the {side} side completed no critical section")
        if stats.longest_wait >= max_wait:
            found.append(
                f"the {side} side waited {stats.longest_wait:.3f}s for the lock "
                f"(bound {max_wait:g}s; acquire timeouts before the end: "
                f"{stats.timeouts_before_end})"
            )
    for source, target in (("old", "new"), ("new", "old")):
        if not analysis.handoff_count(source, target):
            found.append(f"the lock never went from the {source} side to the {target} side")
    return found


def describe(variant: str, report: Report, analysis: Analysis) -> list[str]:
    lines = [f"-- {variant} {SERVE_LAYOUT1}=1: {report.verdict.sections} critical sections"]
    for side in SIDES:
        s = analysis.sides[side]
        timeouts = s.counters["acquire timeouts"]
        lines.append(
            f"   {side}: {s.sections} sections by {s.tasks_seen}/{s.tasks} tasks; "
            f"longest wait {s.longest_wait:.3f}s (99th percentile {s.p99_wait:.3f}s); "
            f"acquire timeouts {timeouts} ({s.timeouts_before_end} before the end of the run, "
            "the others: tasks still waiting when it ended); "
            f"backend errors {s.counters['backend errors']}, lost {s.counters['lost']}"
        )
    config = report.config
    lines.append(
        "   sections per process: "
        + ", ".join(
            f"{side} ({config.tasks_of(i)} task{'s' if config.tasks_of(i) > 1 else ''}) "
            f"{counters['sections']}"
            for i, (side, counters) in enumerate(
                zip(config.sides, report.worker_counters, strict=False)
            )
        )
    )
    for source, target in (("old", "new"), ("new", "old"), ("old", "old"), ("new", "new")):
        latencies = analysis.handoffs.get((source, target), [])
        if latencies:
            lines.append(
                f"   hand-offs {source}->{target}: {len(latencies)}; latency median "
                f"{statistics.median(latencies) * 1000:.1f} ms, 99th percentile "
                f"{_percentile(latencies, 0.99) * 1000:.1f} ms, longest "
                f"{max(latencies) * 1000:.1f} ms"
            )
        else:
            lines.append(f"   hand-offs {source}->{target}: 0")
    v = report.verdict
    lines.append(
        f"   overlaps {len(v.overlaps)}, fencing-token violations {len(v.token_violations)}, "
        f"held at the end {len(report.held_at_end)}, left held {len(report.leaked)}"
    )
    return lines


def compare(results: dict[str, tuple[Report, Analysis]]) -> list[str]:
    """One row per variant: what the variable changes."""
    lines = [
        "-- with and without the variable (waits: longest, 99th percentile)",
        (
            f"   {'variant':<8} {'old sections':>12} {'new sections':>12} {'old waits':>16} "
            f"{'new waits':>16} {'new->old':>9} {'old->new':>9}"
        ),
    ]
    for variant, (_, analysis) in results.items():
        old, new = analysis.sides["old"], analysis.sides["new"]
        lines.append(
            f"   {variant:<8} {old.sections:>12} {new.sections:>12} "
            f"{old.longest_wait:>7.3f}s {old.p99_wait:>7.3f}s "
            f"{new.longest_wait:>7.3f}s {new.p99_wait:>7.3f}s "
            f"{analysis.handoff_count('new', 'old'):>9} {analysis.handoff_count('old', 'new'):>9}"
        )
    return lines


def keep(report: Report, lines: Sequence[str], variant: str) -> Path:
    """Write a run's history, the workers' standard error and the summary to a directory
    that is not removed; returns its path."""
    directory = Path(tempfile.mkdtemp(prefix=f"aiolock-upgrade-{variant}-"))
    with (directory / "history.jsonl").open("w", encoding="utf-8") as out:
        for section in report.sections:
            out.write(section.to_json() + "\n")
    for index, log in enumerate(report.worker_stderr):
        (directory / f"worker-{index}-{report.config.sides[index]}.stderr").write_text(log)
    (directory / "summary.txt").write_text(
        report.summary() + "\n" + "\n".join(lines) + "\n", encoding="utf-8"
    )
    return directory


# =========================================================================== the old version
def _git(*args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        raise SetupError("git is not installed") from None
    if done.returncode:
        raise SetupError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def extract(revision: str, tree: Path) -> Path:
    """The files of `revision` (a commit of this repository), written to the new directory
    `tree` by `git archive`: no work tree or other git state is left behind."""
    try:
        commit = _git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    except SetupError:
        raise SetupError(
            f"commit {revision} is not in this repository (a shallow clone? "
            "`git fetch --unshallow` brings the history)"
        ) from None
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
            tar.extractall(tree, filter="data")
        else:  # pragma: no cover - our own repository's files
            tar.extractall(tree)
    return tree


def build_old(revision: str, directory: Path) -> tuple[Path, Path, str]:
    """The old version's interpreter and source tree, under `directory`; and its commit."""
    tree = extract(revision, directory / "src")
    commit = _git("rev-parse", f"{revision}^{{commit}}")
    if not (tree / "tests" / "checker.py").is_file():
        raise SetupError(f"commit {revision} has no tests/checker.py to run workers with")
    venv = directory / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(tree),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if install.returncode:
        raise SetupError(f"installing the old version failed:\n{install.stderr[-3000:]}")
    return python, tree, commit


def _describe_version(python: Path | str, cwd: Path) -> dict[str, str]:
    """Where `import aiolock` leads for `python` run in `cwd`, its data layout, redis-py's
    version."""
    # The layout module is `aiolock._lua.layout`, and `aiolock._layout` in a tree from before
    # the private modules moved into folders (the previous release's).
    probe = (
        "import importlib, json, aiolock, redis\n"
        "try:\n    layout = importlib.import_module('aiolock._lua.layout')\n"
        "except ImportError:\n    layout = importlib.import_module('aiolock._layout')\n"
        "print(json.dumps({'file': aiolock.__file__, 'version': aiolock.__version__, "
        "'layout': str(getattr(layout, 'FORMAT_VERSION', '?')), 'redis': redis.__version__}))"
    )
    done = subprocess.run(
        [str(python), "-c", probe], cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SetupError(f"{python} cannot import aiolock in {cwd}:\n{done.stderr[-2000:]}")
    found: dict[str, str] = json.loads(done.stdout)
    return found


# =========================================================================== the run
async def _run_variants(
    variants: Sequence[str], args: argparse.Namespace, *, python: Path, tree: Path
) -> dict[str, Report]:
    from aiolock.testing import RedisServer, find_binaries

    server = RedisServer(find_binaries()[0]).start()
    try:
        reports: dict[str, Report] = {}
        for variant in variants:
            config = CheckerConfig(
                processes=4,
                old_processes=2,
                old_python=str(python),
                old_tree=str(tree),
                serve_layout1_waiters=VARIANTS[variant],
                task_mix=args.tasks,
                names=1,
                duration=args.seconds,
                ttl=args.ttl,
                hold=args.hold,
                seed=args.seed,
                limit=args.limit,
                weights=args.weights,
            )
            reports[variant] = await run(config, server=server)
        return reports
    finally:
        server.stop()


def _say(line: str = "") -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.upgrade",
        description="Run the previous release and this tree on one lock name under the "
        "safety checker (a rolling upgrade).",
    )
    parser.add_argument(
        "--from",
        dest="revision",
        default=None,
        help=f"the old version's commit (default {DEFAULT_FROM}, the last layout-1 release; "
        f"with --limit, {SEMAPHORE_FROM})",
    )
    parser.add_argument(
        "--limit", type=int, default=0, help="a semaphore of this limit instead of a lock"
    )
    parser.add_argument(
        "--weights",
        type=int,
        default=0,
        metavar="W",
        help="with --limit: this tree's sections take 1 to W permits at once",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="of contention, per variant")
    parser.add_argument(
        "--variant",
        choices=("with", "without", "both"),
        default="with",
        help=f"the new processes with {SERVE_LAYOUT1}=1 (the upgrade procedure), without it, "
        "or both runs and a comparison",
    )
    parser.add_argument(
        "--max-wait",
        type=float,
        default=ACQUIRE_TIMEOUT,
        help="longest a task may go without the lock, with the variable (seconds)",
    )
    parser.add_argument(
        "--tasks",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=TASK_MIX,
        help="tasks of each process in turn (default 1,4: one old and one new process with "
        "1 task, the others with 4)",
    )
    parser.add_argument("--ttl", type=float, default=1.0, help="of every lease, seconds")
    parser.add_argument("--hold", type=float, default=0.01, help="longest body, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--keep", action="store_true", help="keep every run's history, not only a failing one's"
    )
    args = parser.parse_args(argv)
    if args.revision is None:
        args.revision = SEMAPHORE_FROM if args.limit else DEFAULT_FROM
    if args.weights and not 1 <= args.weights <= args.limit:
        parser.error("--weights: 1 to the --limit")
    return args


def _stop(signum: int, frame: object) -> None:
    """SIGTERM (an outer `timeout`): unwind, so that the workers, the server and the
    temporary directory are cleaned up."""
    raise SystemExit(f"upgrade check: stopped by signal {signum}, nothing verified")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    signal.signal(signal.SIGTERM, _stop)
    variants = ["with", "without"] if args.variant == "both" else [args.variant]
    began = time.monotonic()
    directory = Path(tempfile.mkdtemp(prefix="aiolock-upgrade-"))
    try:
        try:
            python, tree, commit = build_old(args.revision, directory)
            old = _describe_version(python, tree)
            new = _describe_version(sys.executable, ROOT)
        except (SetupError, subprocess.CalledProcessError) as exc:
            _say(f"upgrade check: could not set up the old version: {exc}")
            return 1
        _say(
            f"upgrade check: old {commit[:7]} (aiolock {old['version']}, data layout "
            f"{old['layout']}, redis-py {old['redis']}) from {old['file']}"
        )
        _say(
            f"               new: this tree, at {_git('rev-parse', '--short', 'HEAD')} (data "
            f"layout {new['layout']}, redis-py {new['redis']}) from {new['file']}"
        )
        _say(f"old version built in {time.monotonic() - began:.1f}s")
        if old["layout"] == new["layout"]:
            _say(f"note: both versions write data layout {new['layout']}")
        reports = asyncio.run(_run_variants(variants, args, python=python, tree=tree))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    failed = False
    results: dict[str, tuple[Report, Analysis]] = {}
    for variant in variants:
        report = reports[variant]
        analysis = analyse(report)
        results[variant] = (report, analysis)
        lines = describe(variant, report, analysis)
        _say("\n".join(lines))
        found = problems(report, analysis, liveness=VARIANTS[variant], max_wait=args.max_wait)
        for problem in found:
            _say(f"   FAILED: {problem}")
        if found or args.keep:
            kept = keep(report, [*lines, *(f"FAILED: {p}" for p in found)], variant)
            _say(f"   history, standard error and summary kept in {kept}")
        failed = failed or bool(found)
    if len(results) > 1:
        _say("\n".join(compare(results)))
    _say(f"upgrade check: {'FAILED' if failed else 'OK'} ({time.monotonic() - began:.1f}s in all)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
