"""Backoff and poll_delay: pure arithmetic with an injected random source."""

from __future__ import annotations

import random

import pytest

from aiolock._aio.backoff import Backoff, poll_delay


class LowestRandom(random.Random):
    """Always draws the lower bound."""

    def uniform(self, a: float, b: float) -> float:
        return a


class HighestRandom(random.Random):
    """Always draws the upper bound."""

    def uniform(self, a: float, b: float) -> float:
        return b


def nominal(base: float, cap: float, count: int) -> list[float]:
    """The un-jittered delays: base, doubling, capped."""
    out = []
    d = base
    for _ in range(count):
        out.append(d)
        d = min(d * 2, cap)
    return out


# --------------------------------------------------------------------- Backoff
@pytest.mark.parametrize("seed", [0, 1, 42, 2**31])
def test_backoff_delays_are_in_half_to_full_of_a_doubling_capped_delay(seed: int) -> None:
    backoff = Backoff(base=0.01, cap=1.0, rng=random.Random(seed))
    expected = nominal(0.01, 1.0, 15)
    assert expected[:8] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0]
    for d in expected:
        delay = backoff.next()
        assert d / 2 <= delay <= d


def test_backoff_bounds_are_reached_exactly() -> None:
    low = Backoff(base=0.01, cap=1.0, rng=LowestRandom())
    high = Backoff(base=0.01, cap=1.0, rng=HighestRandom())
    expected = nominal(0.01, 1.0, 10)
    assert [low.next() for _ in expected] == pytest.approx([d / 2 for d in expected])
    assert [high.next() for _ in expected] == pytest.approx(expected)


def test_backoff_cap_below_a_doubling() -> None:
    backoff = Backoff(base=0.3, cap=0.5, rng=HighestRandom())
    assert [backoff.next() for _ in range(4)] == pytest.approx([0.3, 0.5, 0.5, 0.5])


def test_backoff_reset_starts_again_from_base() -> None:
    backoff = Backoff(base=0.01, cap=1.0, rng=HighestRandom())
    for _ in range(10):
        backoff.next()
    assert backoff.next() == pytest.approx(1.0)
    backoff.reset()
    assert [backoff.next() for _ in range(3)] == pytest.approx([0.01, 0.02, 0.04])


def test_backoff_is_reproducible_with_the_same_seed() -> None:
    a = Backoff(base=0.01, cap=1.0, rng=random.Random(7))
    b = Backoff(base=0.01, cap=1.0, rng=random.Random(7))
    assert [a.next() for _ in range(20)] == [b.next() for _ in range(20)]


def test_backoff_jitter_spreads_processes() -> None:
    firsts = {Backoff(base=0.1, cap=1.0, rng=random.Random(seed)).next() for seed in range(20)}
    assert len(firsts) == 20
    assert all(0.05 <= delay <= 0.1 for delay in firsts)


# --------------------------------------------------------------------- poll_delay
@pytest.mark.parametrize("pttl_ms", [0, -1, -2, -1000])
def test_poll_delay_unknown_expiry_returns_the_fallback(pttl_ms: int) -> None:
    rng = random.Random(3)
    state = rng.getstate()
    assert poll_delay(pttl_ms, fallback=0.123, rng=rng) == 0.123
    assert rng.getstate() == state  # no draw wasted


@pytest.mark.parametrize("pttl_ms", [1, 10, 100, 999, 1000, 5000, 30_000, 10**7])
def test_poll_delay_is_slightly_more_than_the_pttl(pttl_ms: int) -> None:
    seconds = pttl_ms / 1000
    for seed in range(50):
        delay = poll_delay(pttl_ms, fallback=99.0, rng=random.Random(seed))
        assert seconds < delay < seconds + 0.051
        assert delay <= seconds + 0.001 + min(0.05, 0.05 * seconds)


def test_poll_delay_bounds_are_reached_exactly() -> None:
    assert poll_delay(2000, fallback=9.0, rng=LowestRandom()) == pytest.approx(2.001)
    assert poll_delay(2000, fallback=9.0, rng=HighestRandom()) == pytest.approx(2.051)
    # the spread is 5 % of a short pttl
    assert poll_delay(100, fallback=9.0, rng=HighestRandom()) == pytest.approx(0.106)
