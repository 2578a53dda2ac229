"""The hold statistics: how long recent holds lasted, and the ttl they suggest.

Pure functions of the recorded durations (no connection), tested as units; `_ops.inspection` reads
the durations back and the public `hold_stats()` and `aiolock stats` report what these make
of them.

Hold durations come from the `holds` list of the layout, kept for locks created with
`hold_stats=True`: the release script records each normal release (as the holder measured
it, ms, marked when the lease was not renewed). The ttl advice depends on that mark: a
renewed lease may be held for hours under a short ttl by design (its ttl only bounds how
long a crashed holder blocks the others), while a lease that is not renewed must finish
within its ttl. Holds that ended by expiry or were aborted are not recorded, so a ttl that
is far too short hides the longest holds: a `near_ttl` flag is the signal to look.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, final

from .._lua.layout import HOLD_FIXED

__all__ = (
    "HoldStats",
    "nearest_rank",
    "parse_hold",
    "recommend_ttl_ms",
    "summarize_holds",
)

_NEAR_TTL_SHARE: Final = 0.5
"""A p99 hold above this share of the ttl is flagged."""
_TTL_FACTOR: Final = 3
"""Recommended ttl = this times the p99 hold, rounded up."""
_MIN_RECOMMENDED_MS: Final = 1000
_NICE_STEPS: Final = (10, 15, 20, 25, 30, 40, 50, 60, 80, 100)
"""Mantissas (times 10^k) a recommended ttl is rounded up to: 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 s..."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class HoldStats:
    """How long a lock's recent holds lasted, and the ttl they suggest.

    Computed from the last (up to) 100 holds that ended in a release. Durations are in
    seconds, from the grant to the release as each holder measured them (the server's
    measure for an evicted holder); they are None when no hold was recorded.

    The ttl advice looks only at the holds of leases that were not renewed (`renew=False`):
    their ttl must cover the whole hold. A renewed lease's holds may outlive its ttl by
    design; its ttl bounds how long the others wait for a holder that crashed, and how long
    the event loop may stall before the lease is lost, whatever the holds' lengths.

    Added in 0.1.
    """

    name: str
    count: int
    """Number of recorded holds (at most 100)."""
    p50: float | None
    p99: float | None
    """99th percentile (nearest rank: with fewer than 100 holds, the longest)."""
    max: float | None
    ttl: float | None
    """The ttl the holds were judged against (None: unknown)."""
    fixed: int = 0
    """How many of the holds were of leases that were not renewed (`renew=False`)."""
    fixed_p99: float | None = None
    """The 99th percentile of those (None: there were none)."""
    recommended_ttl: float | None
    """For leases that are not renewed: 3 times `fixed_p99`, rounded up to 1, 1.5, 2, 2.5,
    3, 4, 5, 6 or 8 times a power of ten, at least 1 s (room for a slow hold). None when
    every recorded hold was renewed: their lengths say nothing about the ttl."""
    near_ttl: bool
    """True when `fixed_p99` > 50 % of `ttl`: leases that are not renewed come close to
    expiring before their holder is done. Renewed holds never set it."""
    over_ttl: int = 0
    """Renewed holds that outlived the ttl: kept alive by renewals, as designed."""

    @property
    def advice(self) -> str:
        """One sentence on the ttl, from the holds."""
        if self.count == 0:
            return "no holds recorded"
        if self.fixed == 0:
            return (
                "renewed leases: long holds are by design; the ttl only bounds how long a "
                "crashed holder blocks the others"
            )
        if self.near_ttl:
            return (
                "holds without renewal approach the ttl: raise it (see recommended_ttl) or "
                "let the lease renew"
            )
        return "holds without renewal end well within the ttl"


def nearest_rank(sorted_values: Sequence[int], percent: float) -> int:
    """The nearest-rank percentile of ascending `sorted_values` (not empty).

    The smallest value such that at least `percent` % of the values are at most it.
    """
    if not sorted_values:
        raise ValueError("no values")
    if not 0 < percent <= 100:
        raise ValueError(f"percent must be in (0, 100], got {percent!r}")
    rank = math.ceil(percent / 100 * len(sorted_values))
    return sorted_values[max(rank, 1) - 1]


def recommend_ttl_ms(p99_ms: int) -> int:
    """3 times the p99 hold, rounded up to a readable value, at least 1 s (all in ms)."""
    wanted = max(_TTL_FACTOR * p99_ms, _MIN_RECOMMENDED_MS)
    scale = 1
    while scale * _NICE_STEPS[-1] < wanted:
        scale *= 10
    return next(step * scale for step in _NICE_STEPS if step * scale >= wanted)


def summarize_holds(
    name: str, holds_ms: Iterable[int], *, ttl: float | None, fixed_ms: Iterable[int] = ()
) -> HoldStats:
    """Percentiles, the recommended ttl and the near-ttl flag of recorded holds (ms).

    `holds_ms` are every hold; `fixed_ms` those among them of leases that were not renewed.
    """
    values = sorted(holds_ms)
    fixed = sorted(fixed_ms)
    fixed_p99_ms = nearest_rank(fixed, 99) if fixed else None
    return HoldStats(
        name=name,
        count=len(values),
        p50=nearest_rank(values, 50) / 1000 if values else None,
        p99=nearest_rank(values, 99) / 1000 if values else None,
        max=values[-1] / 1000 if values else None,
        ttl=ttl,
        fixed=len(fixed),
        fixed_p99=None if fixed_p99_ms is None else fixed_p99_ms / 1000,
        recommended_ttl=None if fixed_p99_ms is None else recommend_ttl_ms(fixed_p99_ms) / 1000,
        near_ttl=(
            ttl is not None
            and fixed_p99_ms is not None
            and fixed_p99_ms > _NEAR_TTL_SHARE * ttl * 1000
        ),
        over_ttl=0 if ttl is None else _longer(values, ttl) - _longer(fixed, ttl),
    )


def _longer(sorted_ms: Sequence[int], ttl: float) -> int:
    """How many of `sorted_ms` (ascending) are longer than `ttl` seconds."""
    return len(sorted_ms) - bisect.bisect_right(sorted_ms, ttl * 1000)


def parse_hold(value: str) -> tuple[int, bool]:
    """A recorded hold: (ms, whether its lease was renewed); (0, True) if unreadable."""
    fixed = value.endswith(HOLD_FIXED)
    try:
        return int(value[: -len(HOLD_FIXED)] if fixed else value), not fixed
    except ValueError:
        return 0, True
