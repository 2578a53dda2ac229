"""The safety checker (tests/checker.py): a short run under faults, and proof that it can fail.

The checker runs worker processes against the test's own server; each records its critical
sections, and the history is verified for overlaps, fencing order and leftover holders.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

import pytest
import redis.asyncio

from ..checker import CheckerConfig, Fault, Section, run, verify
from ..servers import RedisServer

pytestmark = pytest.mark.real_only


# --------------------------------------------------------------------------- the verification
def section(
    enter: float, exit_: float, token: int, *, lost: bool = False, name: str = "n"
) -> Section:
    return Section(name, token, enter, exit_, lost, worker=f"w{token}")


def test_disjoint_sections_in_token_order_pass() -> None:
    verdict = verify([section(0, 1, 10), section(1.5, 2, 11), section(2, 3, 12)])
    assert verdict.sections == 3
    assert not verdict.violations


def test_an_overlap_is_a_violation() -> None:
    verdict = verify([section(0, 2, 10), section(1, 3, 11)])
    assert [v.kind for v in verdict.violations] == ["overlap"]
    assert "overlap of 1.000000s" in str(verdict.violations[0])


def test_an_overlap_with_a_section_entered_long_before_is_found() -> None:
    """Not only neighbours: a long section overlaps every one entered before it ended."""
    verdict = verify([section(0, 10, 1), section(1, 2, 2), section(3, 4, 3)])
    assert len(verdict.overlaps) == 2


def test_an_overlap_after_a_reported_loss_is_excused() -> None:
    verdict = verify([section(0, 2, 10, lost=True), section(1, 3, 11)])
    assert not verdict.violations
    assert verdict.excused_overlaps == 1 and verdict.lost == 1


def test_a_stale_grant_that_was_reported_lost_is_excused() -> None:
    """Entered later, with the lower token, and told it was lost: granted before a restart."""
    verdict = verify([section(0, 2, 11), section(1, 3, 10, lost=True)])
    assert not verdict.violations
    assert verdict.excused_overlaps == 1


def test_tokens_out_of_order_or_repeated_are_violations() -> None:
    verdict = verify([section(0, 1, 11), section(2, 3, 10), section(4, 5, 12), section(6, 7, 12)])
    assert sorted(v.kind for v in verdict.violations) == ["duplicate token", "token order"]


def test_names_are_checked_separately() -> None:
    verdict = verify([section(0, 2, 10, name="a"), section(1, 3, 5, name="b")])
    assert not verdict.violations


# --------------------------------------------------------------------------- a run under faults
async def test_a_short_run_under_faults_finds_no_violation(server: RedisServer) -> None:
    """3 processes x 4 tasks on 2 names for 8 s, the server paused for less than the ttl,
    then restarted empty: no overlap beyond the reported losses, fencing in order, and no
    lock left held."""
    config = CheckerConfig(
        processes=3,
        tasks=4,
        names=2,
        duration=8.0,
        ttl=1.0,
        hold=0.05,
        faults=(Fault(2.0, "pause", 0.3), Fault(5.0, "restart")),
        seed=20261122,
    )
    report = await run(config, server=server)
    summary = report.summary()
    assert report.ok, summary
    assert report.faults_injected == ["pause 0.3s at 2s", "restart empty at 5s"], summary
    assert report.verdict.sections >= 100, summary
    assert not report.held_at_end, summary


# --------------------------------------------------------------------------- it can fail
class SetWithoutNxLock:
    """A broken lock for the checker's negative control: SET without NX, so it "acquires"
    whoever holds it, with a fencing token from INCR. Loaded by the worker processes as
    `tests.faults.test_checker:SetWithoutNxLock`."""

    def __init__(
        self, client: redis.asyncio.Redis, name: str, *, ttl: float, timeout: float
    ) -> None:
        self.client = client
        self.key = f"broken:{{{name}}}"
        self.ttl_ms = int(ttl * 1000)
        self.fencing_token = 0

    async def __aenter__(self) -> Self:
        self.fencing_token = int(await self.client.incr(f"{self.key}:fence"))
        await self.client.set(self.key, str(self.fencing_token), px=self.ttl_ms)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.client.delete(self.key)


async def test_the_checker_reports_overlaps_of_a_broken_lock(server: RedisServer) -> None:
    config = CheckerConfig(
        processes=2,
        tasks=3,
        names=1,
        duration=2.0,
        hold=0.01,
        lock="tests.faults.test_checker:SetWithoutNxLock",
    )
    report = await run(config, server=server)
    summary = report.summary()
    assert not report.ok, summary
    assert report.verdict.overlaps, summary
    assert "VIOLATIONS FOUND" in summary
    assert f"overlaps found: {len(report.verdict.overlaps)}" in summary
