"""Leader election on real processes under SIGKILL and SIGSTOP: the short run of
`tests/election_torture.py` (a pause and a kill of the leader, a fenced log, an observer).

The 60 s run is `python -m tests.election_torture --seconds 60`.
"""

from __future__ import annotations

import pytest

from ..election_torture import TortureConfig, run
from ..support.load import scaled

pytestmark = pytest.mark.real_only


async def test_a_paused_leader_is_fenced_off_and_killed_or_paused_leaders_are_replaced(
    binaries: list[object],
) -> None:
    config = TortureConfig(
        seconds=6,
        ttl=1.0,
        fault_every=(0.5, 1.0),
        kinds=("pause-leader", "kill-leader"),
        kill_bound=min(scaled(0.2), 0.4),  # a loaded machine's scheduling, within reason
        resign_bound=scaled(0.05),
    )
    report = await run(config)
    assert report.ok, report.summary()
    counts = report.counts
    assert counts["pause of the leader"] >= 1 and counts["kill of the leader"] >= 1, counts
    assert (
        counts["paused leaders that found their term lost on resuming"]
        == counts["pause of the leader"]
    )
    assert counts["late writes"] == counts["late writes refused"], counts
    assert counts["terms won"] >= 3 and counts["writes accepted"] > 0, counts


async def test_leaders_that_hand_their_term_to_a_named_successor_under_kills_and_pauses(
    binaries: list[object],
) -> None:
    """Every leader transfers its term to the last candidate in line: that candidate leads
    next (unless it or the leader was killed or paused meanwhile), as fast as after a
    resignation, and the fenced log still accepts no late write."""
    config = TortureConfig(
        seconds=6,
        ttl=1.0,
        fault_every=(0.5, 1.0),
        kinds=("pause-other", "kill-leader"),
        kill_bound=min(scaled(0.2), 0.4),
        resign_bound=scaled(0.05),
        transfer=1.0,
    )
    report = await run(config)
    assert report.ok, report.summary()
    counts = report.counts
    assert counts["transfers won by the one named"] >= 1, counts
    assert counts["late writes"] == counts["late writes refused"], counts
