"""The protocol explored (`python -m tests.explore`): a bounded exploration of today's lock
(on one name and on two), read-write lock and election holds, a planted bug is found with its
counterexample, and a Redlock whose clients' clocks may stop during a pause breaks
(Kleppmann's trace) where one within the clock-drift bound does not.

The deeper explorations and the whole set of planted bugs are for the command line, their
figures in docs/exploration.md.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from tests.explore.kinds import make_kind
from tests.explore.model import Bounds, Explorer, Step
from tests.explore.nodes import Nodes
from tests.explore.search import explore
from tests.simulation.server import virtual_time

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 120.0
"""Longest the command here may take (seconds; it is given a budget far below it)."""


def _explore(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m tests.explore` with `args`, in a process of its own, within LIMIT."""
    return subprocess.run(
        [sys.executable, "-m", "tests.explore", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
    )


def test_a_bounded_exploration_of_the_lock_holds() -> None:
    outcome = explore(make_kind("lock"), Bounds(clients=3, queued=1, pauses=0), depth=7)
    assert outcome.held, outcome.report()
    assert outcome.reached == 7
    assert outcome.distinct > 10_000  # every interleaving within 7 moves, not a sample


def test_random_walks_beyond_the_depth_find_a_bug_the_search_does_not_reach() -> None:
    """A fencing token not raised on a grant takes 8 moves to show; at depth 5 the walks
    beyond it find it (seeded: the same walks each time)."""
    command = ["--mutant", "grant-fence-not-incremented", "--depth", "5", "--walks", "3000"]
    result = _explore(*command)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "random walks of up to 20 moves" in result.stdout
    assert "violated: fencing token" in result.stdout


def test_a_planted_bug_is_found_with_its_counterexample() -> None:
    result = _explore("--mutant", "acquire-token-inverted")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "COUNTEREXAMPLE in 4 steps" in result.stdout
    assert "violated: fencing token" in result.stdout
    assert "mutant acquire-token-inverted: found" in result.stdout


def _redlock(*, drift_bound: bool) -> Bounds:
    # Within the bound a pause is only a client taking no step (the interleavings have it).
    pauses = 0 if drift_bound else 1
    return Bounds(2, 0, 1, restarts=0, losses=0, pauses=pauses, drift_bound=drift_bound)


def test_a_redlock_within_the_clock_drift_bound_holds() -> None:
    outcome = explore(make_kind("redlock"), _redlock(drift_bound=True), depth=6)
    assert outcome.held, outcome.report()


def test_kleppmanns_trace_is_found_when_a_paused_clock_stops() -> None:
    outcome = explore(make_kind("redlock"), _redlock(drift_bound=False), depth=8)
    assert outcome.trace is not None, outcome.report()
    moves = [step.text.split(" ", 1)[1] for step in outcome.trace]
    assert len(moves) == 6
    assert moves[3:] == ["c0 pauses", "time advances to t=1001ms", "c0 resumes"]
    assert outcome.trace[-1].violation == (
        "c0 believes it holds (until t=1989ms) but only 0 node(s) hold its lease"
    )


def test_a_bounded_exploration_of_the_read_write_lock_holds() -> None:
    # c0 writes (and waits in the queue in Redis when refused), c1 and c2 read.
    outcome = explore(make_kind("rwlock"), Bounds(clients=3, queued=1, pauses=0), depth=6)
    assert outcome.held, outcome.report()
    assert outcome.reached == 6
    assert outcome.distinct > 10_000


def test_a_reader_let_in_beside_the_writer_is_found() -> None:
    result = _explore("--mutant", "rwlock-reader-beside-writer")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "COUNTEREXAMPLE in 4 steps" in result.stdout
    assert "violated: c0 believes it writes while others believe they hold" in result.stdout
    assert "mutant rwlock-reader-beside-writer: found" in result.stdout


def test_a_bounded_exploration_of_a_lock_on_two_names_holds() -> None:
    # Each client picks one of the two names at each acquisition.
    outcome = explore(make_kind("lock", names=2), Bounds(clients=3, queued=1, pauses=0), depth=5)
    assert outcome.held, outcome.report()
    assert outcome.reached == 5
    assert outcome.distinct > 10_000
    assert "lock on 2 names" in outcome.report()


def _follow(explorer: Explorer, *moves: str) -> Step:
    """From the start, the first move whose text has each of `moves` in turn."""
    step = Step("start", explorer.initial())
    for said in moves:
        step = next(s for s in explorer.moves(step.state) if said in s.text)
    return step


def test_two_holders_on_two_names_are_no_overlap_but_on_one_name_are() -> None:
    nodes = Nodes(1)
    with virtual_time(nodes):  # type: ignore[arg-type]  # a clock with .time(), as a loop
        explorer = Explorer(make_kind("lock", names=2), Bounds(pauses=0), nodes)
        both = _follow(
            explorer,
            "c0 sends an acquire (name 'n')",
            "c0 acquire delivered",
            "c0 reads the acquire reply",
            "c1 sends an acquire (name 'm')",
            "c1 acquire delivered",
            "c1 reads the acquire reply",
        )
        assert both.violation is None, both.text
        assert [c.believes(both.state.now) for c in both.state.clients] == [True, True, False]
        clients = both.state.clients
        same = (clients[0], dataclasses.replace(clients[1], name=0), clients[2])
        said = explorer.violation(dataclasses.replace(both.state, clients=same))
    assert said is not None and said.startswith("2 clients believe they hold lock 'n'")


def test_a_bounded_exploration_of_an_election_holds() -> None:
    # Three candidates, each waiting in the queue in Redis; a term won is announced.
    outcome = explore(make_kind("election"), Bounds(clients=3, queued=3, pauses=0), depth=5)
    assert outcome.held, outcome.report()
    assert outcome.reached == 5


def test_a_term_won_is_announced_under_its_fencing_token() -> None:
    nodes = Nodes(1)
    with virtual_time(nodes):  # type: ignore[arg-type]  # a clock with .time(), as a loop
        explorer = Explorer(make_kind("election"), Bounds(queued=3, pauses=0), nodes)
        led = _follow(
            explorer,
            "c0 sends an acquire",
            "c0 acquire delivered",
            "c0 reads the acquire reply",
            "c0 announces its term",
            "c0 announce delivered",
            "c0 reads the announce reply",
        )
    assert led.violation is None, led.text
    leader = led.state.clients[0]
    assert leader.announced
    assert led.text.endswith(f": leads term {leader.fence}")
