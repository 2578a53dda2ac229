"""The election torture's checker (`tests/election_torture.check`) on made-up runs: what
counts as after a paused leader resumed."""

from __future__ import annotations

from typing import Any

import pytest

from ..election_torture import Fault, Report, TortureConfig, check

LEADER, NEXT = 100, 200


def _event(ev: str, pid: int, fencing_token: int, t: float, **fields: Any) -> dict[str, Any]:
    """One line of a candidate's log: `fencing_token` is the term's (0 for none)."""
    line = {"ev": ev, "i": 0 if pid == LEADER else 1, "pid": pid, "t": t}
    return {**line, "fencing_token": fencing_token, **fields}


def _checked(
    config: TortureConfig, events: list[dict[str, Any]], faults: list[Fault] | None = None
) -> Report:
    """The checker's report on a made-up run of the terms of fencing tokens 5 and 6, each
    seen by the observer."""
    seen: list[tuple[float, int | None]] = [(0.0, 5), (2.0, 6)]
    return check(
        config, events=events, faults=faults or [], fenced=[], seen=seen, won_in_log=[5, 6]
    )


def _paused_run(*after_resuming: dict[str, Any]) -> list[str]:
    """The leader (fencing token 5) is paused at 1.0 s, SIGCONT is sent at 3.0 s and the
    nemesis reads its clock at 3.01 s; the next candidate wins the term of token 6 at 2.0 s."""
    events = [
        _event("won", LEADER, 5, 0.0),
        _event("try", LEADER, 5, 0.5, seq=1),
        _event("write", LEADER, 5, 0.51, seq=1, accepted=1, late=0),
        _event("won", NEXT, 6, 2.0),
        *after_resuming,
    ]
    fault = Fault("pause-leader", 0, LEADER, 5, start=1.0, resumed=3.0, end=3.01)
    report = _checked(TortureConfig(seconds=4, ttl=1.0, kill_bound=0.2), events, [fault])
    return report.violations


def test_a_loss_logged_before_the_nemesis_reads_its_clock_counts_as_after_resuming() -> None:
    # The resumed leader may run (and log its loss) before the process that sent SIGCONT
    # does: after resuming means after SIGCONT was sent, not after the sender went on.
    assert _paused_run(_event("lost", LEADER, 5, 3.005, reason="expired")) == []


def test_a_paused_leader_that_logs_no_loss_after_resuming_is_a_violation() -> None:
    assert _paused_run() == ["the paused leader (fencing token 5): no loss after resuming"]


def test_a_paused_leader_writing_twice_after_resuming_is_a_violation() -> None:
    violations = _paused_run(
        _event("try", LEADER, 5, 3.002, seq=2),
        _event("try", LEADER, 5, 3.004, seq=3),
        _event("lost", LEADER, 5, 3.006, reason="expired"),
    )
    assert violations == [
        "the paused leader (fencing token 5) went on writing after resuming (2 writes)"
    ]


def _resigned_run(*more: dict[str, Any]) -> Report:
    """The leader (fencing token 5) resigns at 1.0 s with the next candidate first in line,
    which wins the term of token 6 at 1.9 s."""
    events = [
        _event("won", LEADER, 5, 0.0),
        _event("resign", LEADER, 5, 1.0, next=NEXT),
        _event("acquired", NEXT, 6, 1.89, attempts=3, wait=1.2),
        _event("won", NEXT, 6, 1.9),
        *more,
    ]
    return _checked(TortureConfig(seconds=2, ttl=1.0, resign_bound=0.05), events)


def test_a_slow_takeover_after_a_resignation_is_a_violation_that_names_who_took_part() -> None:
    expected = (
        "takeover after a resignation: p99 900.0 ms (the slowest: fencing token 5 resigned by "
        "pid 100, pid 200 first in line, fencing token 6 won by pid 200 after 900.0 ms, in 3 "
        "attempt(s))"
    )
    assert _resigned_run().violations == [expected]


def test_a_takeover_that_a_stall_of_the_winner_accounts_for_is_timed_apart() -> None:
    report = _resigned_run(_event("stalled", NEXT, 0, 1.88, since=1.01))
    assert report.violations == []
    assert report.takeovers["resign while a candidate stalled"] == [pytest.approx(0.9)]
    assert report.takeovers["resign"] == []


def _killed_while_resigning(won_at: float, kill_at: float = 1.01) -> Report:
    """The leader (fencing token 5) logs its resignation at 1.0 s and is killed at `kill_at`,
    its release perhaps not yet applied: the next candidate wins the term of token 6 at
    `won_at`."""
    events = [
        _event("won", LEADER, 5, 0.0),
        _event("resign", LEADER, 5, 1.0, next=NEXT),
        _event("acquired", NEXT, 6, won_at - 0.01, attempts=5, wait=won_at - 1.0),
        _event("won", NEXT, 6, won_at),
    ]
    fault = Fault("kill-leader", 0, LEADER, 5, start=kill_at, resumed=kill_at, end=kill_at)
    config = TortureConfig(seconds=3, ttl=1.0, kill_bound=0.2, resign_bound=0.05)
    return _checked(config, events, [fault])


def test_a_resignation_cut_short_by_a_kill_is_timed_as_a_takeover_after_a_kill() -> None:
    # Killed between logging its resignation and its release reaching Redis: the term is
    # taken over once the key expires, within a ttl of the kill (plus the kill bound).
    report = _killed_while_resigning(won_at=1.99)
    assert report.violations == []
    assert report.takeovers["resign cut short by a kill or pause"] == [pytest.approx(0.99)]
    assert report.takeovers["resign"] == []


def test_a_resignation_cut_short_by_a_kill_is_still_bounded_by_the_ttl() -> None:
    report = _killed_while_resigning(won_at=2.5)
    assert report.violations == [
        "resignation (fencing token 5) cut short by a kill of its leader: taken over after 1490 ms"
    ]


def test_a_kill_of_the_leader_after_the_takeover_excuses_nothing() -> None:
    report = _killed_while_resigning(won_at=1.99, kill_at=2.2)
    assert len(report.violations) == 1
    assert report.violations[0].startswith("takeover after a resignation: p99 990.0 ms")


def test_a_stall_of_a_candidate_not_involved_excuses_nothing() -> None:
    report = _resigned_run(_event("stalled", 300, 0, 1.88, since=1.01))
    assert len(report.violations) == 1
    assert report.violations[0].startswith("takeover after a resignation: p99 900.0 ms")


def test_a_stall_shorter_than_the_excess_over_the_bound_excuses_nothing() -> None:
    # 900 ms, of which 300 ms stalled: 600 ms is still over the 50 ms bound.
    report = _resigned_run(_event("stalled", LEADER, 0, 1.4, since=1.1))
    assert len(report.violations) == 1


def _two_terms(since_5: float, since_6: float) -> list[str]:
    """The term of fencing token 5 is logged as won after token 6's: its candidate stalled
    between the win and the log line. `since_*`: when each term was announced, on the
    server's clock."""
    events = [
        _event("won", NEXT, 6, 2.0, since=1000.5),
        _event("won", LEADER, 5, 2.1, since=since_5),
        _event("lost", LEADER, 5, 2.11, reason="expired"),
    ]
    events[0]["since"] = since_6
    report = _checked(TortureConfig(seconds=3, ttl=1.0), events)
    return report.violations


def test_terms_are_ordered_by_when_the_server_announced_them_not_by_the_log() -> None:
    assert _two_terms(since_5=1000.0, since_6=1000.5) == []


def test_a_higher_term_announced_before_a_lower_one_is_a_violation() -> None:
    assert _two_terms(since_5=1000.5, since_6=1000.0) == [
        "fencing token 6 was announced (server clock) before fencing token 5"
    ]


def _killed_run(*more: dict[str, Any]) -> list[str]:
    """The leader (fencing token 5) is killed at 1.0 s; the next candidate logs the term of
    token 6 won at 3.0 s, 2 s later (the bound: ttl 1 s + 0.2 s)."""
    events = [
        _event("won", LEADER, 5, 0.0, since=100.0),
        _event("won", NEXT, 6, 3.0, since=102.0),
        *more,
    ]
    fault = Fault("kill-leader", 0, LEADER, 5, start=1.0, resumed=1.3, end=1.3)
    report = _checked(TortureConfig(seconds=4, ttl=1.0, kill_bound=0.2), events, [fault])
    return report.violations


def test_a_slow_takeover_after_a_kill_is_a_violation() -> None:
    assert _killed_run() == ["kill of the leader (fencing token 5): taken over after 2000 ms"]


def test_a_takeover_late_by_the_winners_own_stall_is_not() -> None:
    assert _killed_run(_event("stalled", NEXT, 0, 2.9, since=1.5)) == []
    # A stall of another process excuses nothing; nor does a short one.
    assert len(_killed_run(_event("stalled", 300, 0, 2.9, since=1.5))) == 1
    assert _killed_run(_event("stalled", NEXT, 0, 2.0, since=1.5)) == [
        "kill of the leader (fencing token 5): taken over after 2000 ms (500 ms of it stalled)"
    ]
