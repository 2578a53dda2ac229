"""The election torture's checker (`tests/election_torture.check`) on made-up runs: what
counts as after a paused leader resumed."""

from __future__ import annotations

from typing import Any

from ..election_torture import Fault, TortureConfig, check

LEADER, NEXT = 100, 200


def _event(ev: str, pid: int, term: int, t: float, **fields: Any) -> dict[str, Any]:
    return {"ev": ev, "i": 0 if pid == LEADER else 1, "pid": pid, "term": term, "t": t, **fields}


def _paused_run(*after_resuming: dict[str, Any]) -> list[str]:
    """The leader of term 5 is paused at 1.0 s, SIGCONT is sent at 3.0 s and the nemesis
    reads its clock at 3.01 s; the next candidate wins term 6 at 2.0 s."""
    events = [
        _event("won", LEADER, 5, 0.0),
        _event("try", LEADER, 5, 0.5, seq=1),
        _event("write", LEADER, 5, 0.51, seq=1, accepted=1, late=0),
        _event("won", NEXT, 6, 2.0),
        *after_resuming,
    ]
    fault = Fault("pause-leader", 0, LEADER, 5, start=1.0, resumed=3.0, end=3.01)
    report = check(
        TortureConfig(seconds=4, ttl=1.0, kill_bound=0.2),
        events=events,
        faults=[fault],
        fenced=[],
        seen=[(0.0, 5), (2.0, 6)],
        won_in_log=[5, 6],
    )
    return report.violations


def test_a_loss_logged_before_the_nemesis_reads_its_clock_counts_as_after_resuming() -> None:
    # The resumed leader may run (and log its loss) before the process that sent SIGCONT
    # does: after resuming means after SIGCONT was sent, not after the sender went on.
    assert _paused_run(_event("lost", LEADER, 5, 3.005, reason="expired")) == []


def test_a_paused_leader_that_logs_no_loss_after_resuming_is_a_violation() -> None:
    assert _paused_run() == ["the paused leader of term 5: no loss after resuming"]


def test_a_paused_leader_writing_twice_after_resuming_is_a_violation() -> None:
    violations = _paused_run(
        _event("try", LEADER, 5, 3.002, seq=2),
        _event("try", LEADER, 5, 3.004, seq=3),
        _event("lost", LEADER, 5, 3.006, reason="expired"),
    )
    assert violations == ["the paused leader of term 5 went on writing after resuming (2 writes)"]
