"""The safety checker (tests/checker.py): a short run under faults, and proof that it can fail.

The checker runs worker processes against the test's own server; each records its critical
sections, and the history is verified for overlaps, fencing order and leftover holders.
"""

from __future__ import annotations

import dataclasses
import io
import random
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Self

import pytest
import redis.asyncio

from aiolock import Lock, MultiLease, MultiLock, ReadLock, ReadWriteLock, Semaphore
from aiolock._lua.layout import LockKeys

from ..checker import (
    ROOT,
    SERVE_LAYOUT1,
    CheckerConfig,
    Fault,
    Report,
    Section,
    Verdict,
    _contend,
    _worker_command,
    fault_summary,
    run,
    verify,
)
from ..deployments.cluster import ClusterGroup
from ..deployments.sentinel import SentinelGroup
from ..support.servers import RedisServer, ServerBinary
from ..upgrade import analyse

pytestmark = pytest.mark.real_only


# --------------------------------------------------------------------------- the verification
def section(
    enter: float, exit_: float, token: int, *, lost: bool = False, name: str = "n", slot: int = -1
) -> Section:
    return Section(name, token, enter, exit_, lost, worker=f"w{token}", slot=slot)


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


def test_an_overlap_under_an_empty_restart_of_a_redlock_node_is_counted_apart() -> None:
    """A node restarted empty at once after the earlier holder's acquire wrote it (at most
    `written` before it entered) and before the later one entered: a bare majority may
    have been left short, which the Redlock guarantee does not cover. Any other overlap is
    still a violation."""
    history = [section(10, 12, 10), section(11, 13, 11), section(20, 22, 12), section(21, 23, 13)]
    for restart in ((9.85, 9.9), (10.5, 10.6), (10.9, 11.0)):
        verdict = verify(history, restarts=[restart], written=0.2)
        assert verdict.restart_overlaps == 1, restart
        assert [(v.earlier.token, v.later.token) for v in verdict.violations] == [(12, 13)]
    # Before the earlier holder's acquire could have written the node: its key was written
    # after the restart.
    assert len(verify(history, restarts=[(9.5, 9.7)], written=0.2).overlaps) == 2
    # After the later holder entered.
    assert len(verify(history, restarts=[(11.5, 11.6)], written=0.2).overlaps) == 2
    # Only a lock's sections (a semaphore's have their own limit).
    assert verify(history, restarts=[(10.5, 10.6)], written=0.2, limit=2).restart_overlaps == 0


def test_tokens_out_of_order_or_repeated_are_violations() -> None:
    verdict = verify([section(0, 1, 11), section(2, 3, 10), section(4, 5, 12), section(6, 7, 12)])
    assert sorted(v.kind for v in verdict.violations) == ["duplicate token", "token order"]


def test_names_are_checked_separately() -> None:
    verdict = verify([section(0, 2, 10, name="a"), section(1, 3, 5, name="b")])
    assert not verdict.violations


def test_a_semaphores_sections_may_overlap_up_to_its_limit() -> None:
    history = [section(0, 5, 10, slot=0), section(1, 5, 11, slot=1), section(2, 5, 12, slot=2)]
    assert not verify(history, limit=3).violations
    assert [v.kind for v in verify(history, limit=2).violations] == ["over the limit"]


def test_sections_of_several_permits_count_every_permit_against_the_limit() -> None:
    """`--weights`: sections at once may hold up to the limit in permits, not in number."""

    def weighted(enter: float, token: int, slot: int, permits: int) -> Section:
        return replace(section(enter, 5, token, slot=slot), permits=permits)

    history = [weighted(0, 10, 0, 3), weighted(1, 11, 3, 2)]
    assert not verify(history, limit=5).violations
    assert [v.kind for v in verify(history, limit=4).violations] == ["over the limit"]
    restored = Section.from_json(weighted(0, 10, 0, 3).to_json())
    assert restored.permits == 3


def test_a_semaphores_slot_is_held_once_at_a_time_in_token_order() -> None:
    verdict = verify([section(0, 2, 10, slot=0), section(1, 3, 11, slot=0)], limit=3)
    assert [v.kind for v in verdict.violations] == ["overlap"]
    verdict = verify([section(0, 1, 12, slot=0), section(2, 3, 11, slot=0)], limit=3)
    assert [v.kind for v in verdict.violations] == ["token order"]
    verdict = verify([section(0, 1, 12, slot=0), section(2, 3, 11, slot=1)], limit=3)
    assert not verdict.violations, "tokens of different slots need not be in order"
    verdict = verify([section(0, 1, 12, slot=0), section(2, 3, 12, slot=1)], limit=3)
    assert [v.kind for v in verdict.violations] == ["duplicate token"]


def test_sections_over_a_semaphores_limit_are_excused_by_a_reported_loss() -> None:
    history = [section(0, 5, 10, slot=0, lost=True), section(1, 5, 11, slot=0)]
    verdict = verify(history, limit=1)
    assert not verdict.violations


def test_the_report_counts_faults_by_kind_with_their_first_and_last_time() -> None:
    injected = [
        "pause 0.3s at 2s",
        "restart empty at 7s",
        "pause 0.3s at 12s",
        "failover at 14.5s (slot 866 failed over to :41001)",
        "restart empty at 17s",
        "pause 0.3s at 22s",
    ]
    assert fault_summary(injected) == [
        "failover: 1 (first at 14.5s, last at 14.5s)",
        "pause 0.3s: 3 (first at 2s, last at 22s)",
        "restart empty: 2 (first at 7s, last at 17s)",
    ]
    config = CheckerConfig(faults=())
    report = Report(config, verify([]), 1.0, injected * 100, [], [], Counter(), [])
    summary = report.summary()
    assert "faults injected: 600\n  failover: 100 (first" in summary
    assert "at 2s" not in summary.replace("first at 2s", "")  # no line per fault
    assert len(summary) < 2000, summary


# --------------------------------------------------------------------------- a run under faults
def found_nothing(report: Report, faults: list[str]) -> str:
    """The summary of a run that found no violation, injected `faults` (each as logged, up
    to what it says of where it was done), checked enough sections and left nothing held."""
    summary = report.summary()
    assert report.ok, summary
    assert [fault.split(" (")[0] for fault in report.faults_injected] == faults, summary
    assert report.verdict.sections >= 100, summary
    assert not report.held_at_end, summary
    return summary


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
    found_nothing(report, ["pause 0.3s at 2s", "restart empty at 5s"])


async def test_a_short_run_on_a_cluster_under_failover_and_resharding_finds_no_violation(
    binaries: list[ServerBinary],
) -> None:
    """3 processes x 4 tasks on 2 names for 10 s through `RedisCluster` clients, on a 3+3
    cluster: a primary paused, a coordinated failover and a resharding of a name's slot.
    No overlap, fencing in order, nothing left held."""
    config = CheckerConfig(
        processes=3,
        tasks=4,
        names=2,
        duration=10.0,
        ttl=1.0,
        hold=0.05,
        faults=(Fault(2.0, "pause", 0.3), Fault(4.5, "failover"), Fault(7.0, "reshard")),
        seed=20261123,
        cluster=True,
    )
    with ClusterGroup(binaries[0]) as group:
        await group.create()
        report = await run(config, server=group)
    found_nothing(report, ["pause 0.3s at 2s", "failover at 4.5s", "reshard at 7s"])


async def test_a_short_sentinel_run_under_failovers_and_a_killed_master_finds_no_violation(
    binaries: list[ServerBinary],
) -> None:
    """3 processes x 4 tasks on 2 names for 12 s through Sentinel `master_for` clients, the
    locks confirmed by the replica (`replicas=1`): the master paused, a coordinated
    failover, then the master killed (the Sentinels promote its replica; it comes back
    empty as the new master's replica). No overlap beyond the reported losses, fencing in
    order, nothing left held on the master of the end."""
    config = CheckerConfig(
        processes=3,
        tasks=4,
        names=2,
        duration=12.0,
        ttl=1.0,
        hold=0.05,
        faults=(Fault(1.5, "pause", 0.3), Fault(3.5, "failover"), Fault(7.0, "kill-master")),
        seed=20261127,
        sentinel=True,
    )
    with SentinelGroup(binaries[0]) as group:
        await group.ready()
        report = await run(config, server=group)
    summary = found_nothing(
        report,
        ["pause 0.3s at 1.5s", "failover at 3.5s", "master killed, replica promoted at 7s"],
    )
    assert "lock tests.checker:replicated_lock through Sentinels" in summary


def test_a_sentinel_run_starts_its_own_deployment_of_locks() -> None:
    with pytest.raises(ValueError, match="no url"):
        CheckerConfig(sentinel=True, url="redis://127.0.0.1:1/0")
    with pytest.raises(ValueError, match="limit, rw or multi"):
        CheckerConfig(sentinel=True, limit=2)
    with pytest.raises(ValueError, match="for a Sentinel deployment"):
        CheckerConfig(faults=(Fault(1.0, "kill-master"),))


def most_at_once(sections: list[Section]) -> int:
    """The most sections of one name open at one instant."""
    most = 0
    for entered in sections:
        at_once = sum(
            1 for s in sections if s.name == entered.name and s.enter <= entered.enter < s.exit
        )
        most = max(most, at_once)
    return most


async def test_a_short_semaphore_run_under_faults_finds_no_violation(
    server: RedisServer,
) -> None:
    """3 processes x 4 tasks on one semaphore of limit 3, the server paused and restarted:
    never more than 3 bodies at once beyond the reported losses, each slot in token order;
    and the limit was reached (the check is not vacuous)."""
    config = CheckerConfig(
        processes=3,
        tasks=4,
        names=1,
        duration=6.0,
        ttl=1.0,
        hold=0.02,
        limit=3,
        faults=(Fault(1.5, "pause", 0.3), Fault(4.0, "restart")),
        seed=20261123,
    )
    report = await run(config, server=server)
    summary = report.summary()
    assert report.ok, summary
    assert "semaphore aiolock:Semaphore, limit 3" in summary
    assert report.verdict.sections >= 100, summary
    assert {s.slot for s in report.sections} == {0, 1, 2}, summary
    assert most_at_once([s for s in report.sections if not s.lost]) == 3, summary


def test_readers_may_overlap_but_nothing_overlaps_a_writer() -> None:
    readers = [section(0, 5, 10, slot=0), section(1, 4, 11, slot=0)]
    assert not verify(readers, rw=True).violations
    verdict = verify([*readers, section(3, 6, 12, slot=1)], rw=True)
    assert [v.kind for v in verdict.violations] == ["overlap", "overlap"]
    verdict = verify([section(0, 1, 12, slot=1), section(2, 3, 11, slot=0)], rw=True)
    assert [v.kind for v in verdict.violations] == ["token order"]


async def test_a_short_read_write_run_under_faults_finds_no_violation(
    server: RedisServer,
) -> None:
    """3 processes x 4 tasks on one read-write lock, a quarter of the sections writing, the
    server paused and restarted: no section overlaps a writer's beyond the reported losses,
    writers' tokens in order; readers did overlap."""
    config = CheckerConfig(
        processes=3,
        tasks=4,
        names=1,
        duration=6.0,
        ttl=1.0,
        hold=0.05,
        rw=True,
        faults=(Fault(1.5, "pause", 0.3), Fault(4.0, "restart")),
        seed=20261124,
    )
    report = await run(config, server=server)
    summary = report.summary()
    assert report.ok, summary
    assert "read-write lock aiolock:ReadWriteLock" in summary
    assert {s.slot for s in report.sections} == {0, 1}, summary
    readers = [s for s in report.sections if s.slot == 0 and not s.lost]
    assert most_at_once(readers) >= 2, summary


async def test_a_short_multilock_run_under_faults_finds_no_violation(
    server: RedisServer,
) -> None:
    """3 processes x 4 tasks, each section holding 2 of 3 names (picked at random, listed in
    a random order) with a MultiLock, the server paused and restarted empty: each name's
    history is a lock's (no overlap beyond the reported losses, fencing in order), nothing
    left held; and every pair of names was held together (the check is not vacuous)."""
    config = CheckerConfig(
        processes=3,
        tasks=4,
        names=3,
        duration=6.0,
        ttl=1.0,
        hold=0.02,
        multi=2,
        faults=(Fault(1.5, "pause", 0.3), Fault(4.0, "restart")),
        seed=20261127,
    )
    report = await run(config, server=server)
    summary = found_nothing(report, ["pause 0.3s at 1.5s", "restart empty at 4s"])
    assert "lock aiolock:MultiLock, 2 names at once" in summary
    together: dict[tuple[str, float], set[str]] = {}
    for each in report.sections:
        together.setdefault((each.worker, each.enter), set()).add(each.name)
    assert {len(names) for names in together.values()} == {2}, summary
    assert len({frozenset(names) for names in together.values()}) == 3, summary


def test_a_multilock_run_needs_fewer_names_at_once_than_the_run_has() -> None:
    with pytest.raises(ValueError, match="multi: 1 to 3 names"):
        CheckerConfig(names=3, multi=4)
    with pytest.raises(ValueError, match="no limit, rw"):
        CheckerConfig(names=3, multi=2, limit=2)


# --------------------------------------------------------------------------- it can fail
def found_overlaps(report: Report) -> str:
    """The summary of a run that found overlaps, and says how many."""
    summary = report.summary()
    assert not report.ok, summary
    assert report.verdict.overlaps, summary
    assert "VIOLATIONS FOUND" in summary
    assert f"overlaps found: {len(report.verdict.overlaps)}" in summary
    return summary


class SharedWriteLock:
    """A broken read-write lock for the checker's negative control: its write side is a
    read side (writers share with everyone)."""

    def __init__(
        self, client: redis.asyncio.Redis, name: str, *, ttl: float, timeout: float
    ) -> None:
        self.rw = ReadWriteLock(client, name, ttl=ttl, timeout=timeout)

    def read(self) -> ReadLock:
        return self.rw.read()

    def write(self) -> ReadLock:
        return self.rw.read()


async def test_the_checker_reports_a_writer_that_shares(server: RedisServer) -> None:
    config = CheckerConfig(
        processes=2,
        tasks=4,
        names=1,
        duration=2.0,
        hold=0.02,
        rw=True,
        lock="tests.faults.test_checker:SharedWriteLock",
    )
    found_overlaps(await run(config, server=server))


class LooseSemaphore:
    """A broken semaphore for the checker's negative control: an aiolock Semaphore of twice
    the limit asked for (one more than the limit left a loaded machine too few moments with
    that many holders at once to be sure of one)."""

    def __new__(  # type: ignore[misc]
        cls, client: redis.asyncio.Redis, name: str, *, limit: int, ttl: float, timeout: float
    ) -> Semaphore:
        return Semaphore(client, name, limit=2 * limit, ttl=ttl, timeout=timeout)


async def test_the_checker_reports_a_semaphore_over_its_limit(server: RedisServer) -> None:
    config = CheckerConfig(
        processes=2,
        tasks=4,
        names=1,
        duration=2.0,
        hold=0.05,
        limit=2,
        lock="tests.faults.test_checker:LooseSemaphore",
    )
    report = await run(config, server=server)
    summary = report.summary()
    assert not report.ok, summary
    assert {v.kind for v in report.verdict.violations} == {"over the limit"}, summary


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
    found_overlaps(await run(config, server=server))


class FirstNameOnlyMultiLock:
    """A broken MultiLock for the checker's negative control: it locks the first name it is
    given alone and gives that lock's fencing token for every name."""

    def __init__(
        self, client: redis.asyncio.Redis, names: list[str], *, ttl: float, timeout: float
    ) -> None:
        self.names = names
        self.lock = Lock(client, names[0], ttl=ttl, timeout=timeout)
        self.fencing_tokens: dict[str, int] = {}

    async def __aenter__(self) -> Self:
        lease = await self.lock.__aenter__()
        self.fencing_tokens = dict.fromkeys(self.names, lease.fencing_token)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.lock.__aexit__(exc_type, exc, tb)


async def test_the_checker_reports_a_multilock_that_holds_one_name(server: RedisServer) -> None:
    config = CheckerConfig(
        processes=2,
        tasks=4,
        names=2,
        duration=2.0,
        hold=0.02,
        multi=2,
        lock="tests.faults.test_checker:FirstNameOnlyMultiLock",
    )
    found_overlaps(await run(config, server=server))


# --------------------------------------------------------------------------- mixed versions
def test_old_workers_run_with_their_interpreter_in_their_tree(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An old worker finds the old tree's checker and aiolock first (its working directory,
    nothing of this tree on its path); the new ones serve layout-1 waiters unless told not
    to."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv(SERVE_LAYOUT1, raising=False)
    config = CheckerConfig(
        processes=3, old_processes=1, old_python="/old/venv/bin/python", old_tree="/old/src"
    )
    assert config.sides == ["old", "new", "new"]
    python, cwd, env = _worker_command(config, 0)
    assert (python, cwd) == ("/old/venv/bin/python", Path("/old/src"))
    assert "PYTHONPATH" not in env and SERVE_LAYOUT1 not in env
    python, cwd, env = _worker_command(config, 1)
    assert (python, cwd, env[SERVE_LAYOUT1]) == (sys.executable, ROOT, "1")
    monkeypatch.setenv(SERVE_LAYOUT1, "1")
    without = dataclasses.replace(config, serve_layout1_waiters=False)
    assert SERVE_LAYOUT1 not in _worker_command(without, 2)[2]


def test_old_workers_need_an_interpreter_and_a_tree() -> None:
    with pytest.raises(ValueError, match="old_python and old_tree"):
        CheckerConfig(processes=2, old_processes=1)
    with pytest.raises(ValueError, match="old_processes"):
        CheckerConfig(processes=2, old_processes=3, old_python="python", old_tree=".")


async def test_a_mixed_run_labels_every_section_with_its_side(server: RedisServer) -> None:
    """This tree standing in for the old one: the plumbing, not the versions."""
    config = CheckerConfig(
        processes=2,
        task_mix=(1, 2),
        names=1,
        duration=2.0,
        hold=0.01,
        old_processes=1,
        old_python=sys.executable,
        old_tree=str(ROOT),
    )
    report = await run(config, server=server)
    summary = report.summary()
    assert report.ok, summary
    assert {s.side for s in report.sections} == {"old", "new"}, summary
    for side in ("old", "new"):
        written = sum(s.side == side for s in report.sections)
        assert report.side_counters(side)["sections"] == written, summary
    assert {s.worker.split("/")[1] for s in report.sections if s.side == "new"} == {"0", "1"}
    assert "versions: 1 old processes" in summary


def test_the_upgrade_check_counts_hand_offs_and_waits_from_the_history() -> None:
    sections = [
        Section("n", 1, 1.0, 2.0, False, "old:1/0"),
        Section("n", 2, 2.5, 3.0, False, "new:2/0"),
        Section("n", 3, 3.0, 4.0, False, "new:2/0"),
        Section("n", 4, 4.1, 5.0, False, "old:1/0"),
    ]
    config = CheckerConfig(
        processes=2, tasks=1, duration=6.0, old_processes=1, old_python="p", old_tree="t"
    )
    report = Report(
        config=config,
        verdict=Verdict(),
        elapsed=6.0,
        faults_injected=[],
        held_at_end=[],
        leaked=[],
        counters=Counter(),
        worker_failures=[],
        sections=sections,
        worker_counters=[Counter(sections=2), Counter(sections=2)],
        worker_stderr=["", ""],
        started=0.0,
        ended=6.0,
    )
    analysis = analyse(report)
    assert analysis.handoffs == {
        ("old", "new"): [0.5],
        ("new", "new"): [0.0],
        ("new", "old"): [pytest.approx(0.1)],
    }
    old, new = analysis.sides["old"], analysis.sides["new"]
    assert old.waits == [1.0, pytest.approx(2.1), 1.0]  # start, between, until the end
    assert new.waits == [2.5, 0.0, 2.0]
    assert (old.sections, new.sections, old.tasks_seen, old.tasks) == (2, 2, 1, 1)


def test_a_long_runs_read_write_history_is_checked_in_one_pass() -> None:
    """A long run records hundreds of thousands of sections per name: each is compared with
    the highest token entered before it (among the writers, or among all for a writer),
    not every writer with every other section (a 180 s run's check, comparing every pair,
    had not ended after 10 minutes). 100,000 sections, every other a writer, then one
    reader entered after them with a lower token: one violation, against the last writer.

    Break seen failing: the pairwise check (pytest-timeout's bound, 60 s)."""
    history = [section(2 * i, 2 * i + 1, 10 + i, slot=i % 2) for i in range(100_000)]
    assert not verify(history, rw=True).violations
    history.append(section(2 * 100_000, 2 * 100_000 + 1, 5, slot=0))
    verdict = verify(history, rw=True)
    assert [(v.kind, v.earlier.token, v.later.token) for v in verdict.violations] == [
        ("token order", 10 + 99_999, 5)
    ]


async def test_a_short_run_of_sync_and_async_holders_under_faults_finds_no_violation(
    server: RedisServer,
) -> None:
    """2 processes x 4 threads or tasks on 2 names for 8 s, one locking through
    `aiolock.sync.Lock`, the other through `aiolock.Lock`, the server paused, then restarted
    empty: no overlap beyond the reported losses, one fencing order for both faces, nothing
    left held; both faces entered sections."""
    config = CheckerConfig(
        processes=2,
        sync_processes=1,
        tasks=4,
        names=2,
        duration=8.0,
        ttl=1.0,
        hold=0.05,
        faults=(Fault(2.0, "pause", 0.3), Fault(5.0, "restart")),
        seed=20261143,
    )
    report = await run(config, server=server)
    found_nothing(report, ["pause 0.3s at 2s", "restart empty at 5s"])
    faces = Counter(section.worker.partition(":")[0] for section in report.sections)
    assert faces["sync"] > 0 and faces["async"] > 0, faces


class WipedMultiLock:
    """A MultiLock whose names' keys are all deleted as its body begins (as an empty
    restart of the server does): each of its leases is lost."""

    def __init__(
        self, client: redis.asyncio.Redis, names: list[str], *, ttl: float, timeout: float
    ) -> None:
        self.client = client
        self.multi = MultiLock(client, names, ttl=ttl, timeout=timeout)

    async def __aenter__(self) -> MultiLease:
        held = await self.multi.__aenter__()
        await self.client.delete(*(LockKeys.build("aiolock", n).lock for n in held.names))
        return held

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.multi.__aexit__(exc_type, exc, tb)


async def test_every_name_a_multilock_lost_is_recorded_lost(server: RedisServer) -> None:
    """A MultiLease's LeaseLostError names one lost name (the first in name order); the
    checker records each name's section as lost by what that name's own lease says, so an
    empty restart that wiped several names excuses the overlaps on each of them."""
    client = redis.asyncio.Redis(port=server.port)
    out = io.StringIO()
    counters: Counter[str] = Counter()
    try:
        await _contend(
            client,
            WipedMultiLock,
            ["wiped:a", "wiped:b", "wiped:c"],
            ttl=5.0,
            hold=0.001,
            end_at=time.monotonic() + 0.3,
            rng=random.Random(1),
            worker="w",
            out=out,
            counters=counters,
            multi=2,
        )
    finally:
        await client.aclose()
    sections = [Section.from_json(line) for line in out.getvalue().splitlines()]
    assert sections and counters["lost"] == len(sections) // 2, counters
    assert [s.name for s in sections if not s.lost] == []
