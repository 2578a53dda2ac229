"""Backoff and polling delays: pure arithmetic, with the random source injected."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

__all__ = ("POLL_SPREAD", "Backoff", "poll_delay")


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with "equal jitter": each delay is in [d/2, d], d doubling to cap.

    Half the delay is fixed so that retries keep a floor; the random half spreads processes
    that failed together so they do not retry together.
    """

    base: float
    cap: float
    rng: random.Random
    _next: float = 0.0

    def __post_init__(self) -> None:
        self._next = self.base

    def reset(self) -> None:
        self._next = self.base

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.cap)
        return delay / 2 + self.rng.uniform(0, delay / 2)


POLL_SPREAD: Final = 0.05
"""The most (less a millisecond) that `poll_delay` adds to a known expiry."""


def poll_delay(pttl_ms: int, *, fallback: float, rng: random.Random) -> float:
    """How long a waiter sleeps before checking a lock nobody told it was released.

    A lock that is released sends a notification; only expiry does not. So the waiter at
    the head of a queue sleeps until the holder's key would expire (`pttl_ms`, from the
    failed attempt), plus a small random spread so that waiters in several processes do not
    all retry in the same millisecond. `fallback` is used when the expiry is unknown.
    """
    if pttl_ms <= 0:
        return fallback
    seconds = pttl_ms / 1000
    return seconds + rng.uniform(0.001, 0.001 + min(POLL_SPREAD, 0.05 * seconds))
