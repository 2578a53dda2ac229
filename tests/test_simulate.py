"""The deterministic simulation's entry (`python -m tests.simulate`): a bounded run of
today's code holds, one seed replays byte for byte, and a planted bug is found.

Each command runs in a process of its own (the simulation fixes string hashing and patches
fakeredis's clock for its runs). The long runs and the whole set of planted bugs are for
the command line (docs/simulation.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checker import Section, Violation
from tests.simulate import MUTANTS
from tests.simulation.world import within_forgetting_bound

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 120.0
"""Longest any command here may take (seconds; each is given a budget far below it)."""


def _simulate(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "tests.simulate", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
    )


def test_a_bounded_run_of_todays_code_holds() -> None:
    result = _simulate("--seconds", "20", "--runs", "12")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "runs per hour" in result.stdout


def test_one_seed_replays_byte_for_byte_and_another_differs() -> None:
    first = _simulate("--seed", "3", "--trace")
    again = _simulate("--seed", "3", "--trace")
    other = _simulate("--seed", "8", "--trace", "--kind", "multilock")
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout == again.stdout
    assert first.stdout != other.stdout
    assert len(first.stdout.splitlines()) > 1000  # the trace: every step of the run


def test_a_planted_bug_is_found_with_its_seed() -> None:
    result = _simulate("--mutant", "grant-fence-not-incremented", "--seconds", "40")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED at seed" in result.stdout
    assert "replay: python -m tests.simulate --seed" in result.stdout
    assert "mutant grant-fence-not-incremented: found" in result.stdout


def test_a_late_renewal_leaves_no_redlock_node_held_after_the_end() -> None:
    """Seed 176: a renewal that reached a node after its lease's release held the node
    again (`test_redlock.py` has the script-level test of the fix)."""
    result = _simulate("--seed", "176", "--kind", "redlock")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_multilock_whose_process_paused_in_its_releases_fails_no_task() -> None:
    """Seed 175: a process paused 8.8 s while its MultiLease's releases were in flight; on
    resume their common bound had passed, and the block's exit raised a bare TimeoutError
    (`test_multilock.py` has the test of the fix: a `BackendError`, logged at the exit)."""
    result = _simulate("--seed", "175", "--kind", "multilock")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_holder_not_told_within_an_empty_restarts_bound_is_excused() -> None:
    """Seed 1626: the server restarted empty under a semaphore's holder whose renewals and
    release all failed to reach it (delayed replies), and whose body ended within its
    lease; another task got the forgotten permit. Documented (guarantees.md, "Mutual
    exclusion"), so excused with a note, not a failure."""
    result = _simulate("--seed", "1626", "--kind", "semaphore")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "within an empty restart's or failover's bound: overlap" in result.stdout


def _section(enter: float, exit_: float, token: int, *, lost: bool = False) -> Section:
    return Section("n", token, enter, exit_, lost, "p0/0")


@pytest.mark.parametrize(
    ("earlier", "later", "excused"),
    [
        (_section(10.0, 10.8, 1), _section(10.5, 10.6, 2), True),  # ended within the ttl
        (_section(10.0, 12.0, 1, lost=True), _section(10.5, 10.6, 2), True),  # told
        (_section(10.0, 11.4, 1), _section(10.5, 10.6, 2), False),  # ran past F + ttl untold
        (_section(10.0, 10.8, 3), _section(10.5, 10.6, 2), False),  # a lower token after
        (_section(10.3, 10.8, 1), _section(10.5, 10.6, 2), False),  # entered after F
        (_section(10.0, 10.8, 1), _section(10.1, 10.6, 2), False),  # entered before F
    ],
)
def test_the_forgetting_bound_excuses_only_what_the_guarantee_allows(
    earlier: Section, later: Section, excused: bool
) -> None:
    """The server forgot at F = 10.2 with a ttl of 1 s."""
    violation = Violation("overlap", earlier, later)
    assert within_forgetting_bound(violation, [10.2], 1.0) is excused


def test_a_reader_let_in_beside_the_writer_is_found() -> None:
    result = _simulate("--mutant", "rwlock-reader-beside-writer", "--seconds", "40")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "mutant rwlock-reader-beside-writer: found" in result.stdout


@pytest.mark.parametrize("patch", sorted(MUTANTS.glob("*.patch")), ids=lambda p: p.stem)
def test_each_planted_bug_still_applies_to_the_package(patch: Path) -> None:
    """A mutant that no longer applies (the code it changes moved) is refreshed, not lost."""
    result = subprocess.run(
        ["git", "apply", "--check", str(patch)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
