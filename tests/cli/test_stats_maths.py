"""The hold-time maths behind `aiolock stats` and `hold_stats()`: pure functions."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiolock import HoldStats, LockInfo
from aiolock._model.hold_stats import nearest_rank, parse_hold, recommend_ttl_ms, summarize_holds
from aiolock._ops.inspection import RWLOCK, SEMAPHORE, LockState, QueueEntry


def test_nearest_rank() -> None:
    values = list(range(1, 101))
    assert nearest_rank(values, 50) == 50
    assert nearest_rank(values, 90) == 90
    assert nearest_rank(values, 99) == 99
    assert nearest_rank(values, 100) == 100
    assert nearest_rank([7], 50) == nearest_rank([7], 99) == 7
    assert nearest_rank([1, 2, 3], 99) == 3  # fewer than 100 holds: p99 is the longest
    assert nearest_rank([1, 2, 3, 4], 50) == 2
    with pytest.raises(ValueError, match="no values"):
        nearest_rank([], 50)
    with pytest.raises(ValueError, match="percent"):
        nearest_rank([1], 0)
    with pytest.raises(ValueError, match="percent"):
        nearest_rank([1], 101)


@pytest.mark.parametrize(
    ("p99_ms", "expected_ms"),
    [
        (0, 1000),
        (100, 1000),
        (333, 1000),
        (334, 1500),
        (400, 1500),
        (500, 1500),
        (501, 2000),
        (700, 2500),
        (900, 3000),
        (1000, 3000),
        (1100, 4000),
        (2100, 8000),
        (3000, 10000),
        (3400, 15000),
        (10_000, 30_000),
        (11_000, 40_000),
        (40_000, 150_000),
        (600_000, 2_000_000),
    ],
)
def test_recommended_ttl_is_three_p99_rounded_up(p99_ms: int, expected_ms: int) -> None:
    assert recommend_ttl_ms(p99_ms) == expected_ms


@given(st.integers(min_value=0, max_value=10**9))
def test_recommended_ttl_properties(p99_ms: int) -> None:
    wanted = max(3 * p99_ms, 1000)
    got = recommend_ttl_ms(p99_ms)
    assert got >= wanted
    assert got <= 1.5 * wanted  # the steps are at most 1.5 apart
    mantissa = got
    while mantissa > 100 and mantissa % 10 == 0:
        mantissa //= 10
    assert mantissa in {10, 15, 20, 25, 30, 40, 50, 60, 80, 100}


def test_summary_of_no_holds() -> None:
    stats = summarize_holds("n", [], ttl=5.0)
    assert stats == HoldStats(
        name="n",
        count=0,
        p50=None,
        p99=None,
        max=None,
        ttl=5.0,
        recommended_ttl=None,
        near_ttl=False,
    )


def test_summary_percentiles_in_seconds() -> None:
    holds = [900] + [100] * 99  # newest first, as stored: order does not matter
    stats = summarize_holds("n", holds, ttl=1.0, fixed_ms=holds)
    assert (stats.count, stats.p50, stats.p99, stats.max) == (100, 0.1, 0.1, 0.9)
    assert (stats.fixed, stats.fixed_p99) == (100, 0.1)
    assert stats.recommended_ttl == 1.0
    assert not stats.near_ttl
    two_slow = [900, 800] + [100] * 98
    assert summarize_holds("n", two_slow, ttl=1.0).p99 == 0.8


def test_near_ttl_flag_when_p99_of_holds_without_renewal_exceeds_half_the_ttl() -> None:
    holds = [500] * 10
    assert not summarize_holds("n", holds, ttl=1.0, fixed_ms=holds).near_ttl  # exactly half
    assert summarize_holds("n", holds, ttl=0.999, fixed_ms=holds).near_ttl
    assert summarize_holds("n", holds, ttl=0.2, fixed_ms=holds).near_ttl  # outlive the ttl
    unknown = summarize_holds("n", holds, ttl=None, fixed_ms=holds)
    assert not unknown.near_ttl
    assert unknown.recommended_ttl == 1.5


def test_renewed_holds_are_long_by_design() -> None:
    renewed = summarize_holds("n", [500] * 10, ttl=0.2)
    assert not renewed.near_ttl and renewed.recommended_ttl is None
    assert (renewed.fixed, renewed.fixed_p99, renewed.over_ttl) == (0, None, 10)
    assert "crashed holder" in renewed.advice
    # Only the holds without renewal count for the flag and the recommendation.
    mixed = summarize_holds("n", [5000, 90, 80], ttl=1.0, fixed_ms=[90, 80])
    assert (mixed.p99, mixed.fixed, mixed.fixed_p99, mixed.over_ttl) == (5.0, 2, 0.09, 1)
    assert not mixed.near_ttl and mixed.recommended_ttl == 1.0
    assert mixed.advice == "holds without renewal end well within the ttl"
    slow = summarize_holds("n", [5000, 900], ttl=1.0, fixed_ms=[900])
    assert slow.near_ttl and slow.recommended_ttl == 3.0 and "raise it" in slow.advice
    assert summarize_holds("n", [], ttl=1.0).advice == "no holds recorded"


@pytest.mark.parametrize(
    ("stored", "parsed"),
    [("120", (120, True)), ("120f", (120, False)), ("0f", (0, False)), ("junk", (0, True))],
)
def test_a_recorded_hold_says_whether_its_lease_was_renewed(
    stored: str, parsed: tuple[int, bool]
) -> None:
    assert parse_hold(stored) == parsed


def test_hold_stats_is_frozen() -> None:
    stats = summarize_holds("n", [1], ttl=None)
    with pytest.raises(AttributeError):
        stats.count = 2  # type: ignore[misc]


def _state(*, holder_ttl: float | None, queue: tuple[QueueEntry, ...] = ()) -> LockState:
    holder = (
        None
        if holder_ttl is None
        else LockInfo(
            name="n",
            fencing_token=1,
            host="h",
            pid=1,
            task="t",
            acquired_at=0.0,
            ttl=holder_ttl,
            expires_in=1.0,
        )
    )
    return LockState(
        name="n",
        holder=holder,
        age=None,
        reservation=None,
        last_fencing_token=1,
        typical_hold=None,
        queue=queue,
        holds_ms=(400, 400),
        fixed_holds_ms=(400, 400),
        server_time=0.0,
    )


def test_state_judges_holds_against_the_holders_ttl_first() -> None:
    assert _state(holder_ttl=0.5).hold_stats(ttl=60.0).ttl == 0.5
    assert _state(holder_ttl=0.5).hold_stats(ttl=60.0).near_ttl
    assert _state(holder_ttl=None).hold_stats(ttl=60.0).ttl == 60.0
    assert _state(holder_ttl=None).hold_stats().ttl is None


def test_waiters_count_only_live_queue_entries() -> None:
    def entry(position: int, count: int, expires_in: float) -> QueueEntry:
        return QueueEntry(
            queue_id=f"q{position}",
            position=position,
            host="h",
            pid=position,
            count=count,
            expires_in=expires_in,
        )

    state = _state(holder_ttl=1.0, queue=(entry(1, 2, 3.0), entry(2, 5, -0.1), entry(3, 1, 0.5)))
    assert state.waiters == 3
    assert [e.expired for e in state.queue] == [False, True, False]
    assert state.state == "held"
    assert state.known


def test_a_semaphores_holds_are_judged_against_its_permits_ttl() -> None:
    def permit(slot: int, ttl: float) -> LockInfo:
        return LockInfo(
            name="n", fencing_token=slot, host="h", pid=1, task="t", acquired_at=1.0,
            ttl=ttl, expires_in=0.5, slot=slot,
        )  # fmt: skip

    state = dataclasses.replace(
        _state(holder_ttl=None),
        kind="semaphore",
        holders=(permit(0, 0.5), permit(1, 0.6), permit(2, 1.0)),
        reserved_slots={2: "q1"},  # a permit handed over: the reservation's ttl, not a lease's
        limit=2,
    )
    assert state.hold_stats(ttl=60.0).ttl == 0.6
    assert state.hold_stats().near_ttl  # 400 ms of 600
    assert state.free == 0  # three permits held, the limit lowered to 2
    assert dataclasses.replace(state, limit=5).free == 2
    assert dataclasses.replace(state, limit=None).free is None
    idle = dataclasses.replace(state, holders=(), reserved_slots={})
    assert idle.hold_stats(ttl=60.0).ttl == 60.0
    assert idle.hold_stats().ttl is None


def test_permits_handed_over_are_told_apart_from_held_ones() -> None:
    now = 1_000_000
    fields = {
        "limit": "3",
        "p:q" + "7" * 16: f"1 {now + 500} 12 {now} 1000 web 9 (reserved)",
        "p:q" + "8" * 16: f"2 {now - 1} 11 {now - 900} 1000 web 8 (reserved)",  # lapsed
        "p:q" + "a" * 31: f"0 {now + 9000} 10 {now - 10} 9000 web 7 job",  # a token
    }
    found = SEMAPHORE.holders("n", fields, 9000, now)
    assert found.holder is None
    assert [(info.slot, info.task) for info in found.holders] == [(0, "job"), (1, "(reserved)")]
    assert dict(found.reserved_slots) == {1: "7" * 16}


def test_a_rwlocks_writer_and_readers_are_told_apart() -> None:
    now = 1_000_000
    fields = {
        "fence": "14",
        "p:" + "a" * 32: f"0 {now + 500} 13 {now - 20} 1000 web 9 r-late",
        "p:" + "b" * 32: f"0 {now + 900} 11 {now - 90} 1000 web 8 r-early",
        "p:" + "c" * 32: f"1 {now + 700} 14 {now - 5} 2000 web 7 w",
        "p:" + "d" * 32: f"0 {now - 1} 12 {now - 900} 1000 web 6 lapsed",  # expired
    }
    found = RWLOCK.holders("n", fields, 9000, now)
    assert found.holder is not None
    assert (found.holder.task, found.holder.fencing_token, found.holder.slot) == ("w", 14, None)
    assert [(info.task, info.slot) for info in found.readers] == [
        ("r-early", None),  # by fencing token: the order they came in
        ("r-late", None),
    ]
    assert found.holders == (found.holder, *found.readers)
    readers_only = RWLOCK.holders("n", {k: v for k, v in fields.items() if k[2] != "c"}, 9, now)
    assert readers_only.holder is None and readers_only.holders == readers_only.readers


def test_a_rwlocks_writers_and_readers_waiting_are_counted_apart() -> None:
    def entry(position: int, count: int, expires_in: float) -> QueueEntry:
        return QueueEntry(
            queue_id=f"q{position}", position=position, host="h", pid=position, count=count,
            expires_in=expires_in,
        )  # fmt: skip

    state = dataclasses.replace(
        _state(holder_ttl=None),
        kind="rwlock",
        queue=(entry(1, 2, 0.5), entry(2, 7, -0.1)),
        reader_queue=(entry(1, 3, 2.0), entry(2, 4, 1.0)),
    )
    assert (state.writers_waiting, state.readers_waiting, state.waiters) == (2, 7, 9)
    assert state.state == "free"
    idle = dataclasses.replace(state, queue=(), holds_ms=(), last_fencing_token=None)
    assert idle.known  # readers waiting
    assert not dataclasses.replace(idle, reader_queue=()).known
