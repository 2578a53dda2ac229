"""A safety checker: processes x tasks contend for a few locks, every critical section is
recorded and the history verified (the three checks below).

```
python -m tests.checker --processes 4 --tasks 8 --names 3 --minutes 1 [--url redis://...]
python -m tests.checker --seconds 10 --faults      # its own server, paused and restarted
python -m tests.checker --old-python OLD/venv/bin/python --old-tree OLD --old-processes 2
python -m tests.checker --seconds 60 --cluster --faults   # a 3+3 Redis Cluster of its own
python -m tests.checker --redlock 5 --faults --minutes 10 --fault-every 5   # a Redlock
python -m tests.checker --names 4 --multi 2 --seconds 60 --faults   # MultiLocks of 2 names
python -m tests.checker --sentinel --seconds 60 --faults   # a master, a replica, 3 Sentinels
python -m tests.checker --processes 2 --sync-processes 1 --minutes 10 --faults  # sync + asyncio
```

With `--sync-processes N` the first N workers lock through `aiolock.sync.Lock` (one thread
per task, a synchronous client, the body a `time.sleep`), the others through `aiolock.Lock`:
holders of both faces on the same names. A sync body cannot be cancelled: a loss is told at
its block's exit, which marks the section lost. Sections are labelled with their face
("sync:<pid>/<thread>", "async:<pid>/<task>").

With `--cluster` the workers use a `RedisCluster` client on a cluster the checker builds
(three primaries, three replicas: `tests/deployments/cluster.py`), and the faults are a pause
of the primary serving one of the names (shorter than the node timeout), a coordinated
failover of one (`CLUSTER FAILOVER` on its replica), a resharding of a name's slot to
another primary, and one held open for 3 s with half the slot's keys moved (every script
naming several keys of the name is answered TRYAGAIN meanwhile), in turn.

With `--redlock N` the workers contend with `aiolock.Redlock` over N servers the checker
starts (`tests/deployments/quorum.py`), each worker with a client of every node, two of the nodes
reached through a fault proxy. The faults stay within the algorithm's assumptions, one at a
time, each undone before the next, so that at most a minority of the nodes (two of five) is
affected at any moment: a node paused (SIGSTOP) for twice the ttl; a node killed and started
again, empty, 1.5 ttl later (the delayed restart; the node's fencing counter is lost, its
clock floor covers it); a node restarted empty at once (a held lease is still on the other
nodes and gets its key back there at its next renewal; but a lease held on a bare majority
is then on fewer than a majority until that renewal, which the Redlock guarantee does not
cover: an overlap that such a restart explains is counted apart, not as a violation); the
replies of the two proxied nodes
delayed by 30 % of the ttl (longer than the default per-node bound of a tenth of it) for
twice the ttl. The nodes are picked at random (`--seed`). The sweep of check 3 reads every
node.

With `--sentinel` the workers reach a master and its replica through three Sentinels of
the checker's own (`tests/deployments/sentinel.py`), with `Sentinel.master_for` clients, and lock
with `replicas=1` (an acquire is confirmed once the replica has it), so that a failover
keeps every lease granted. The faults, in turn: a pause of the master shorter than the
Sentinels' down-after time, a coordinated failover (`SENTINEL FAILOVER`), and a kill of the
master, whose replica the Sentinels promote, the killed server then started again, empty,
to become the new master's replica. The sweep of check 3 reads the master of the end.

With `--multi K` each section holds K of the names at once, picked at random and listed in
a random order, through `aiolock.MultiLock` (the names are taken in one canonical order, so
no two tasks wait for each other in a circle): it is recorded as one section per name, with
that name's fencing token, and a loss marks only the name whose lease was lost. Each name's
history is then checked as a lock's.

Without `--url` the checker starts a throwaway server of its own (`aiolock.testing`), and
only then may it inject faults (`--faults`): SIGSTOP the server briefly, restart it empty.
From tests: `await run(CheckerConfig(...), server=server)`, then `report.ok`.

What each worker process records, per critical section: the lock name, the fencing token,
`time.monotonic()` on entering the body and on leaving it (one clock for every process of
the machine, so the times are comparable), and whether `async with` reported the lease
lost. What is verified, per name:

1. **No overlap**: no two critical sections overlap in time, unless the earlier one was
   reported lost (a restart that lost the key let the next holder in; the earlier holder
   was told), or the later one was reported lost and carries the lower token (a stale
   grant: its acquire ran before a restart wiped it, and its reply was read late). With
   `--limit N` (a `Semaphore` of that limit instead of a `Lock`): no more than N sections
   at once, and no two at once in one permit slot, with the same exceptions; with
   `--weights W` as well, each section holds 1 to W permits (`Semaphore.acquire(permits=)`,
   W at most the limit) and the permits of the sections at once are summed: never more
   than N (old workers of a mixed run take one permit each). With `--rw`
   (a `ReadWriteLock`, a quarter of the sections writing): no section overlaps a writer's.
2. **Fencing order**: fencing tokens strictly increase in the order the sections were
   entered (of a semaphore: per permit slot; of a read-write lock: every section entered
   before a writer's has a lower token, every one entered after it a higher one), with the
   same stale-grant exception; no token is ever granted twice.
3. **Nothing left held**: once every worker has exited, no lock key of the run still has a
   holder (found with `SCAN ... TYPE hash`, never `KEYS`) after its ttl has run out; keys
   still held right at the end are reported.

Mixed versions (a rolling upgrade; `tests/upgrade.py` builds the older version): the first
`old_processes` workers run an older aiolock, with its virtualenv's interpreter and its
source tree as working directory, so that `-m tests.checker` and `import aiolock` are that
version's (its checker must speak this one's worker protocol: the arguments below, the
"ready", "go" and "done" lines, a JSON line per section). The other workers run this tree,
with `AIOLOCK_SERVE_LAYOUT1_WAITERS=1` unless `serve_layout1_waiters` is False. Sections are
labelled with their side ("old:<pid>/<task>", "new:<pid>/<task>").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel

from aiolock import AcquireTimeoutError, BackendError, LeaseLostError, Lock
from tests.deployments.cluster import ClusterGroup
from tests.deployments.quorum import ServerGroup
from tests.deployments.sentinel import SERVICE, SentinelGroup

__all__ = (
    "CheckerConfig",
    "Fault",
    "Report",
    "Section",
    "Verdict",
    "Violation",
    "main",
    "periodic_faults",
    "run",
    "verify",
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOCK = "aiolock:Lock"
DEFAULT_SEMAPHORE = "aiolock:Semaphore"
DEFAULT_RWLOCK = "aiolock:ReadWriteLock"
DEFAULT_REDLOCK = "aiolock:Redlock"
DEFAULT_MULTILOCK = "aiolock:MultiLock"
DEFAULT_SENTINEL_LOCK = "tests.checker:replicated_lock"
REDLOCK_PROXIED = (0, 1)
"""The nodes of a `--redlock` run reached through a fault proxy (whose replies are delayed)."""
WRITE_SHARE = 0.25
"""With `--rw`, the share of sections that write."""
SERVE_LAYOUT1 = "AIOLOCK_SERVE_LAYOUT1_WAITERS"

LockFactory = Callable[..., AbstractAsyncContextManager[Any]]
"""`factory(client, name, *, ttl=, timeout=)` (and `limit=` for a semaphore): an async
context manager whose value has a `fencing_token` (and a `slot`). `aiolock.Lock` is one;
the tests pass deliberately broken ones. With `--redlock`, `client` is the list of the
clients of every node (`aiolock.Redlock(clients, name, ...)`)."""


# =========================================================================== the history
@dataclass(frozen=True, slots=True)
class Section:
    """One critical section: the body of one `async with` that was entered."""

    name: str
    token: int
    enter: float
    exit: float
    lost: bool
    worker: str = ""
    reason: str = ""
    slot: int = -1
    """A semaphore permit's slot, a read-write lock's side (0 read, 1 write); -1 for a
    lock's section."""
    permits: int = 1
    """The semaphore permits the section held (`--weights`; its first slot is `slot`)."""

    @property
    def side(self) -> str:
        """The version that wrote it in a run of mixed versions, "old" or "new", else ""."""
        side, colon, _ = self.worker.partition(":")
        return side if colon else ""

    def to_json(self) -> str:
        return json.dumps(
            {
                "name": self.name,
                "token": self.token,
                "enter": self.enter,
                "exit": self.exit,
                "lost": self.lost,
                "worker": self.worker,
                "reason": self.reason,
                "slot": self.slot,
                "permits": self.permits,
            }
        )

    @classmethod
    def from_json(cls, line: str) -> Section:
        data = json.loads(line)
        return cls(
            name=str(data["name"]),
            token=int(data["token"]),
            enter=float(data["enter"]),
            exit=float(data["exit"]),
            lost=bool(data["lost"]),
            worker=str(data.get("worker", "")),
            reason=str(data.get("reason", "")),
            slot=int(data.get("slot", -1)),
            permits=int(data.get("permits", 1)),
        )


@dataclass(frozen=True, slots=True)
class Violation:
    kind: Literal["overlap", "over the limit", "token order", "duplicate token"]
    earlier: Section
    later: Section

    def __str__(self) -> str:
        e, l_ = self.earlier, self.later
        detail = (
            f"overlap of {min(e.exit, l_.exit) - l_.enter:.6f}s"
            if self.kind in ("overlap", "over the limit")
            else f"token {l_.token} after {e.token}"
        )
        if l_.slot >= 0:
            detail += f" (slots {e.slot} and {l_.slot})"
        return (
            f"{self.kind} on {e.name!r}: {detail}; earlier [{e.enter:.6f}, {e.exit:.6f}] "
            f"token {e.token} by {e.worker} (lost={e.lost}), later [{l_.enter:.6f}, "
            f"{l_.exit:.6f}] token {l_.token} by {l_.worker} (lost={l_.lost})"
        )


@dataclass(slots=True)
class Verdict:
    sections: int = 0
    lost: int = 0
    excused_overlaps: int = 0
    restart_overlaps: int = 0
    """Overlaps on a Redlock explained by a node restarted empty at once under the earlier
    holder (see `verify`'s `restarts`)."""
    violations: list[Violation] = field(default_factory=list)

    @property
    def overlaps(self) -> list[Violation]:
        return [v for v in self.violations if v.kind in ("overlap", "over the limit")]

    @property
    def token_violations(self) -> list[Violation]:
        return [v for v in self.violations if v.kind not in ("overlap", "over the limit")]


def _stale_grant(earlier: Section, later: Section) -> bool:
    """`later` was granted before `earlier` by a server that then lost it, and knows it."""
    return later.lost and later.token < earlier.token


def _under_restart(
    earlier: Section, later: Section, restarts: Sequence[tuple[float, float]], written: float
) -> bool:
    """Whether a node restarted empty at once after the earlier holder's acquire wrote it
    (at most `written` seconds before that holder entered: one node call's bound) and
    before the later holder entered: a holder of a bare majority is then left on fewer
    than a majority, which the Redlock guarantee does not cover (docs/deployments.md, "A
    delayed restart")."""
    return any(
        began <= later.enter and ended >= earlier.enter - written for began, ended in restarts
    )


def verify(
    sections: Iterable[Section],
    *,
    limit: int = 1,
    rw: bool = False,
    restarts: Sequence[tuple[float, float]] = (),
    written: float = 0.0,
) -> Verdict:
    """Check a history of critical sections (checks 1 and 2 of the module docstring): of a
    lock's, of a semaphore's of that `limit`, or (`rw`) of a read-write lock's.

    `restarts`: when Redlock nodes were restarted empty at once (monotonic intervals); an
    overlap of a lock's sections that one of them explains (`_under_restart`, a node's
    writes at most `written` seconds before the holder entered) is counted apart, not as a
    violation."""
    if rw:
        return _verify_rw(list(sections))
    verdict = Verdict()
    by_name: dict[str, list[Section]] = {}
    by_slot: dict[tuple[str, int], list[Section]] = {}
    for section in sections:
        by_name.setdefault(section.name, []).append(section)
        by_slot.setdefault((section.name, section.slot), []).append(section)
        verdict.sections += 1
        verdict.lost += section.lost
    if limit > 1:
        for history in by_name.values():
            _check_limit(history, limit, verdict)
    for history in by_slot.values():
        history.sort(key=lambda s: (s.enter, s.exit))
        open_sections: list[Section] = []  # entered earlier and not yet exited
        highest: Section | None = None
        seen: dict[int, Section] = {}
        for section in history:
            open_sections = [s for s in open_sections if s.exit > section.enter]
            for earlier in open_sections:
                if earlier.lost or _stale_grant(earlier, section):
                    verdict.excused_overlaps += 1
                elif limit == 1 and _under_restart(earlier, section, restarts, written):
                    verdict.restart_overlaps += 1
                else:
                    verdict.violations.append(Violation("overlap", earlier, section))
            open_sections.append(section)
            if section.token in seen:
                verdict.violations.append(
                    Violation("duplicate token", seen[section.token], section)
                )
            elif (
                highest is not None
                and section.token <= highest.token
                and not _stale_grant(highest, section)
            ):
                verdict.violations.append(Violation("token order", highest, section))
            seen.setdefault(section.token, section)
            if highest is None or section.token > highest.token:
                highest = section
    return verdict


def _verify_rw(sections: list[Section]) -> Verdict:
    """A read-write lock's history: readers (slot 0) may overlap each other, nothing may
    overlap a writer (slot 1); a writer's token is above those entered before it and below
    those entered after it; no token twice."""
    verdict = Verdict()
    by_name: dict[str, list[Section]] = {}
    for section in sections:
        by_name.setdefault(section.name, []).append(section)
        verdict.sections += 1
        verdict.lost += section.lost
    for history in by_name.values():
        history.sort(key=lambda s: (s.enter, s.exit))
        open_sections: list[Section] = []
        seen: dict[int, Section] = {}
        for section in history:
            open_sections = [s for s in open_sections if s.exit > section.enter]
            for earlier in open_sections:
                if earlier.slot == 0 and section.slot == 0:
                    continue  # readers share
                if earlier.lost or _stale_grant(earlier, section):
                    verdict.excused_overlaps += 1
                else:
                    verdict.violations.append(Violation("overlap", earlier, section))
            open_sections.append(section)
            if section.token in seen:
                verdict.violations.append(
                    Violation("duplicate token", seen[section.token], section)
                )
            seen.setdefault(section.token, section)
        _check_writers_order(history, verdict)
    return verdict


def _check_writers_order(history: list[Section], verdict: Verdict) -> None:
    """A writer's token is above those of the sections entered before it and below those
    entered after it (lost ones aside). `history` is sorted by entry. One pass: each
    section is compared with the highest token entered strictly before it, among the
    writers (a reader), or among all (a writer); at most one violation per section, named
    with the earlier section of that highest token."""
    top_writer: Section | None = None  # the highest token of a writer entered earlier
    top_any: Section | None = None  # the highest token of any section entered earlier
    kept = [s for s in history if not s.lost]
    start = 0
    while start < len(kept):
        end = start
        while end < len(kept) and kept[end].enter == kept[start].enter:
            end += 1
        tied = kept[start:end]  # entered at the same moment: neither is before the other
        for section in tied:
            earlier = top_any if section.slot == 1 else top_writer
            if earlier is not None and earlier.token > section.token:
                verdict.violations.append(Violation("token order", earlier, section))
        for section in tied:
            if top_any is None or section.token > top_any.token:
                top_any = section
            if section.slot == 1 and (top_writer is None or section.token > top_writer.token):
                top_writer = section
        start = end


def _check_limit(history: list[Section], limit: int, verdict: Verdict) -> None:
    """A semaphore's sections: no more than `limit` permits at once (each section's
    `permits`; lost ones excused, as stale grants are), and no token in two slots."""
    history.sort(key=lambda s: (s.enter, s.exit))
    open_sections: list[Section] = []
    seen: dict[int, Section] = {}
    for section in history:
        open_sections = [s for s in open_sections if s.exit > section.enter]
        counted = [s for s in open_sections if not (s.lost or _stale_grant(s, section))]
        if sum(s.permits for s in counted) + section.permits > limit:
            verdict.violations.append(Violation("over the limit", counted[0], section))
        open_sections.append(section)
        if section.token in seen and seen[section.token].slot != section.slot:
            verdict.violations.append(Violation("duplicate token", seen[section.token], section))
        seen.setdefault(section.token, section)


# =========================================================================== configuration
FaultKind = Literal[
    "pause", "restart", "failover", "reshard", "slow-reshard", "kill", "delay", "kill-master"
]
SENTINEL_FAULTS: tuple[FaultKind, ...] = ("pause", "failover", "kill-master")
"""The faults of a `--sentinel` run, in turn (on the master of the moment)."""
REDLOCK_FAULTS: tuple[FaultKind, ...] = ("pause", "kill", "restart", "delay")
"""The faults of a `--redlock` run (each on a minority of the nodes)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """`at` seconds after the start: "pause" the server for `length` s, or "restart" it empty.

    Of a Redlock's servers (one picked at random, or the two proxied ones): "pause" one for
    `length` s, "kill" one and start it again (empty) `length` s later, "restart" one empty
    at once, "delay" the replies of the two proxied ones by `amount` s for `length` s.

    Of a Sentinel deployment's master: "pause" it, "failover" (`SENTINEL FAILOVER`),
    "kill-master" (the Sentinels promote its replica; it is started again, empty, as the
    new master's replica).
    """

    at: float
    kind: FaultKind
    length: float = 0.0
    amount: float = 0.0

    def __str__(self) -> str:
        if self.kind == "pause":
            return f"pause {self.length:g}s at {self.at:g}s"
        if self.kind == "slow-reshard":
            return f"reshard held open {self.length:g}s at {self.at:g}s"
        if self.kind == "restart":
            return f"restart empty at {self.at:g}s"
        if self.kind == "kill":
            return f"kill, restart empty {self.length:g}s later at {self.at:g}s"
        if self.kind == "delay":
            return f"replies delayed {self.amount:g}s for {self.length:g}s at {self.at:g}s"
        if self.kind == "kill-master":
            return f"master killed, replica promoted at {self.at:g}s"
        return f"{self.kind} at {self.at:g}s"


SLOW_RESHARD = 3.0
"""Seconds a "slow-reshard" fault holds a slot's migration open (half its keys moved)."""


def fault_summary(injected: Sequence[str]) -> list[str]:
    """The faults of a run by kind: how many, and the first and last time of each (the log
    of `_nemesis`, one entry per fault, "KIND ... at Ts[ (what was done)]")."""
    kinds: dict[str, list[float]] = {}
    for entry in injected:
        kind, _, at = entry.split(" (", 1)[0].rpartition(" at ")
        kinds.setdefault(kind, []).append(float(at.removesuffix("s")))
    return [
        f"{kind}: {len(times)} (first at {min(times):g}s, last at {max(times):g}s)"
        for kind, times in sorted(kinds.items())
    ]


def periodic_faults(
    duration: float,
    ttl: float,
    *,
    every: float = 5.0,
    cluster: bool = False,
    redlock: bool = False,
    sentinel: bool = False,
) -> list[Fault]:
    """A pause of 30 % of the ttl and an empty restart, alternately, every `every` seconds;
    on a cluster a pause, a failover, a resharding and a resharding held open for
    SLOW_RESHARD seconds in turn; of a Redlock's servers (`redlock`), a pause of twice the
    ttl, a kill with a restart 1.5 ttl later, an empty restart and reply delays of 30 % of
    the ttl for twice the ttl, in turn; of a Sentinel deployment's master (`sentinel`), a
    pause, a failover and a kill, in turn (see the module docstring)."""
    if redlock:
        return _redlock_faults(duration, ttl, every)
    kinds: list[FaultKind] = (
        ["pause", "failover", "reshard", "slow-reshard"]
        if cluster
        else list(SENTINEL_FAULTS)
        if sentinel
        else ["pause", "restart"]
    )
    faults: list[Fault] = []
    at = min(2.0, duration / 4)
    while at < duration - 2.0:
        kind = kinds[len(faults) % len(kinds)]
        length = {"pause": round(ttl * 0.3, 3), "slow-reshard": SLOW_RESHARD}.get(kind, 0.0)
        faults.append(Fault(at, kind, length))
        at += every
    return faults


def _redlock_faults(duration: float, ttl: float, every: float) -> list[Fault]:
    if every < 2.5 * ttl:
        # Each fault must end, and the leases held meanwhile be renewed (a node restarted
        # empty gets its keys back), before the next: else more than a minority of the
        # nodes could be missing a lease's key at once.
        raise ValueError(f"faults of a Redlock's servers need --fault-every >= {2.5 * ttl:g}")
    lengths: dict[FaultKind, float] = {
        "pause": round(2 * ttl, 3),
        "kill": round(1.5 * ttl, 3),
        "restart": 0.0,
        "delay": round(2 * ttl, 3),
    }
    faults: list[Fault] = []
    at = min(2.0, duration / 4)
    while at < duration - 2.0 - 2 * ttl:
        kind = REDLOCK_FAULTS[len(faults) % len(REDLOCK_FAULTS)]
        amount = round(0.3 * ttl, 3) if kind == "delay" else 0.0
        faults.append(Fault(at, kind, lengths[kind], amount))
        at += every
    return faults


@dataclass(frozen=True, slots=True)
class CheckerConfig:
    processes: int = 4
    tasks: int = 8
    task_mix: tuple[int, ...] = ()
    """Tasks of each process in turn, repeated (1, 4: one task in the first, four in the
    second, one in the third...), instead of `tasks` in each."""
    names: int = 3
    duration: float = 60.0
    """Seconds of contention (from the moment every worker is ready)."""
    ttl: float = 1.0
    hold: float = 0.005
    """Longest time a body holds the lock (each picks uniformly in [0, hold])."""
    url: str | None = None
    faults: tuple[Fault, ...] = ()
    lock: str = DEFAULT_LOCK
    """The lock factory, as "module:attribute"."""
    limit: int = 0
    """A semaphore's limit: the factory (`lock`, by default then `aiolock:Semaphore`) is
    called with `limit=`; 0: a lock."""
    weights: int = 0
    """With `limit`: each section of the workers of this tree takes 1 to this many permits
    at once (`acquire(permits=)`, uniformly); 0: one each."""
    rw: bool = False
    """A read-write lock: the factory (by default then `aiolock:ReadWriteLock`) makes one,
    and each section reads or (a quarter of them) writes."""
    seed: int = 0
    old_processes: int = 0
    """How many of the `processes` (the first ones) run an older version of aiolock."""
    old_python: str | None = None
    """The interpreter of the older version's virtualenv (with `redis` installed)."""
    old_tree: str | None = None
    """The older version's source tree: its workers run there (`-m tests.checker`)."""
    serve_layout1_waiters: bool = True
    """With old workers: run the new ones with AIOLOCK_SERVE_LAYOUT1_WAITERS=1 (False: with
    the variable removed from their environment, as after a deployment that forgot it)."""
    cluster: bool = False
    """On a Redis Cluster the checker builds (three primaries, three replicas), through a
    `RedisCluster` client in every worker."""
    redlock: int = 0
    """A Redlock over this many servers the checker starts (by default then the factory is
    `aiolock:Redlock`, called with the list of a client per node); 0: one server."""
    multi: int = 0
    """Each section holds this many of the names at once (by default then the factory is
    `aiolock:MultiLock`, called with the list of names); 0: one name."""
    sentinel: bool = False
    """Through Sentinels, on a master and its replica the checker starts (by default then
    the factory is `replicated_lock`: a `Lock` with `replicas=1`)."""
    sync_processes: int = 0
    """How many of the `processes` (the first ones) lock through `aiolock.sync.Lock`, in
    threads, the others through `aiolock.Lock` (see the module docstring)."""

    def __post_init__(self) -> None:
        if self.sentinel:
            if (
                self.cluster
                or self.redlock
                or self.url is not None
                or self.old_processes
                or self.limit
                or self.rw
                or self.multi
            ):
                raise ValueError(
                    "sentinel: the checker starts the deployment (no url), of locks (no "
                    "cluster, redlock, old processes, limit, rw or multi)"
                )
            if self.lock == DEFAULT_LOCK:
                object.__setattr__(self, "lock", DEFAULT_SENTINEL_LOCK)
        if self.multi:
            if (
                not 1 <= self.multi <= self.names
                or self.limit
                or self.rw
                or self.redlock
                or self.old_processes
            ):
                raise ValueError(
                    f"multi: 1 to {self.names} names (the run's), of locks (no limit, rw, "
                    "redlock or old processes)"
                )
            if self.lock == DEFAULT_LOCK:
                object.__setattr__(self, "lock", DEFAULT_MULTILOCK)
        if self.redlock:
            if self.redlock < 1 or self.limit or self.rw or self.cluster or self.old_processes:
                raise ValueError("redlock: N >= 1 servers, a lock (no limit, rw, cluster)")
            if self.url is not None:
                raise ValueError("redlock: the checker starts the servers (no url)")
            if self.lock == DEFAULT_LOCK:
                object.__setattr__(self, "lock", DEFAULT_REDLOCK)
            if self.redlock < 3 and any(f.kind == "delay" for f in self.faults):
                raise ValueError("redlock: delays on two nodes need at least three")
        elif any(f.kind in ("kill", "delay") for f in self.faults):
            raise ValueError("kill and delay faults are for a Redlock's servers (redlock=N)")
        if not self.sentinel and any(f.kind == "kill-master" for f in self.faults):
            raise ValueError("kill-master faults are for a Sentinel deployment (sentinel=True)")
        if self.limit and self.lock == DEFAULT_LOCK:
            object.__setattr__(self, "lock", DEFAULT_SEMAPHORE)
        if self.rw and self.lock == DEFAULT_LOCK:
            object.__setattr__(self, "lock", DEFAULT_RWLOCK)
        if not 0 <= self.old_processes <= self.processes:
            raise ValueError(f"old_processes must be 0 to {self.processes}")
        if not 0 <= self.sync_processes <= self.processes:
            raise ValueError(f"sync_processes must be 0 to {self.processes}")
        if self.sync_processes and (
            self.old_processes
            or self.limit
            or self.rw
            or self.multi
            or self.redlock
            or self.cluster
            or self.sentinel
            or self.lock != DEFAULT_LOCK
        ):
            raise ValueError("sync_processes: locks on one server (aiolock.sync.Lock beside Lock)")
        if self.weights and not 1 <= self.weights <= self.limit:
            raise ValueError("weights: 1 to the limit (a semaphore's, limit=N)")
        if any(n < 1 for n in self.task_mix):
            raise ValueError("every process needs at least one task")
        if self.old_processes and not (self.old_python and self.old_tree):
            raise ValueError("old workers need old_python and old_tree")

    def face(self, index: int) -> str:
        """Which face worker `index` locks through: "sync" or "async"."""
        return "sync" if index < self.sync_processes else "async"

    def tasks_of(self, index: int) -> int:
        """How many tasks worker `index` runs."""
        return self.task_mix[index % len(self.task_mix)] if self.task_mix else self.tasks

    @property
    def sides(self) -> list[str]:
        """The version each worker runs, by index: "old" or "new"."""
        return ["old" if i < self.old_processes else "new" for i in range(self.processes)]


@dataclass(slots=True)
class Report:
    config: CheckerConfig
    verdict: Verdict
    elapsed: float
    faults_injected: list[str]
    held_at_end: list[str]
    """Keys of the run still held by someone when every worker had exited."""
    leaked: list[str]
    """Keys of the run still held a ttl (and a second) later: a violation."""
    counters: Counter[str]
    worker_failures: list[str]
    sections: list[Section] = field(default_factory=list)
    """The history, in the order the sections were entered."""
    worker_counters: list[Counter[str]] = field(default_factory=list)
    """Each worker's outcomes, by index (see `CheckerConfig.sides` for its version)."""
    worker_stderr: list[str] = field(default_factory=list)
    """What each worker wrote to its standard error (tracebacks, logged warnings)."""
    started: float = 0.0
    """When the workers were told to go (`time.monotonic()`, the sections' clock)."""
    ended: float = 0.0
    """When the workers were told to stop starting sections (same clock)."""

    @property
    def ok(self) -> bool:
        return not (self.verdict.violations or self.leaked or self.worker_failures)

    def side_counters(self, side: str) -> Counter[str]:
        """The outcomes of every worker of one side ("old" or "new") together."""
        total: Counter[str] = Counter()
        for worker_side, counters in zip(self.config.sides, self.worker_counters, strict=False):
            if worker_side == side:
                total.update(counters)
        return total

    def summary(self) -> str:
        c, v = self.config, self.verdict
        tasks = "/".join(map(str, c.task_mix)) if c.task_mix else str(c.tasks)
        lines = [
            (
                f"checker: {c.processes} processes x {tasks} tasks x {c.duration:g}s on "
                f"{c.names} names ({'semaphore' if c.limit else 'read-write lock' if c.rw else 'lock'} "
                f"{c.lock}"
                f"{f', limit {c.limit}' if c.limit else ''}"
                f"{f', 1 to {c.weights} permits a section' if c.weights else ''}"
                f"{f', {c.multi} names at once' if c.multi else ''}"
                f"{f' over {c.redlock} servers' if c.redlock else ''}"
                f"{' through Sentinels' if c.sentinel else ''}, ttl {c.ttl:g}s, "
                f"seed {c.seed}); "
                f"{self.elapsed:.1f}s in all"
            ),
            (
                f"critical sections checked: {v.sections} (reported lost: {v.lost}; overlaps "
                f"excused because a lease was reported lost: {v.excused_overlaps})"
            ),
            f"overlaps found: {len(v.overlaps)}",
            *(
                [
                    (
                        f"overlaps under a node restarted empty at once (a holder of a bare "
                        f"majority is not covered: docs/deployments.md): {v.restart_overlaps}"
                    )
                ]
                if c.redlock
                else []
            ),
            f"fencing-token violations: {len(v.token_violations)}",
            (
                f"held at the end: {len(self.held_at_end)} (still held after the ttl: "
                f"{len(self.leaked)})"
            ),
            *(f"  {held}" for held in self.held_at_end[:5]),
            f"faults injected: {len(self.faults_injected)}",
            *(f"  {line}" for line in fault_summary(self.faults_injected)),
            "worker outcomes: "
            + ", ".join(f"{key} {n}" for key, n in sorted(self.counters.items())),
        ]
        if c.sync_processes:
            by_face = Counter(s.worker.partition(":")[0] for s in self.sections)
            lines.append(
                f"faces: {c.sync_processes} processes through aiolock.sync.Lock (threads): "
                f"{by_face['sync']} sections; {c.processes - c.sync_processes} through "
                f"aiolock.Lock (tasks): {by_face['async']} sections"
            )
        if c.old_processes:
            variable = f"{SERVE_LAYOUT1}=1" if c.serve_layout1_waiters else f"no {SERVE_LAYOUT1}"
            lines.append(
                f"versions: {c.old_processes} old processes ({c.old_tree}), "
                f"{c.processes - c.old_processes} new ({variable})"
            )
            for side in ("old", "new"):
                counters = self.side_counters(side)
                lines.append(
                    f"  {side} side outcomes: "
                    + (", ".join(f"{key} {n}" for key, n in sorted(counters.items())) or "none")
                )
        lines += [f"worker failure: {failure}" for failure in self.worker_failures]
        lines += [f"VIOLATION {violation}" for violation in v.violations[:20]]
        if len(v.violations) > 20:
            lines.append(f"... and {len(v.violations) - 20} more violations")
        lines.append("result: " + ("OK" if self.ok else "VIOLATIONS FOUND"))
        return "\n".join(lines)


# =========================================================================== a worker process
def _open_log(path: str | Path, mode: str) -> Any:
    """A log file, line-buffered when text (each record reaches the disk as written)."""
    if "b" in mode:
        return open(path, mode)  # the caller closes it
    return open(path, mode, buffering=1, encoding="utf-8")


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def lock_without_handoff_renewal(client: Any, name: str, **options: Any) -> Lock:
    """`--lock tests.checker:lock_without_handoff_renewal`: a `Lock` with
    `renew_on_handoff=False` (a lease handed over by another process starts its block
    without first renewing it to the full ttl)."""
    return Lock(client, name, renew_on_handoff=False, **options)


def replicated_lock(client: Any, name: str, **options: Any) -> Lock:
    """`--sentinel`'s default factory: a `Lock` with `replicas=1` (each acquire and renewal
    confirmed by the replica, which a failover promotes)."""
    return Lock(client, name, replicas=1, **options)


def load_factory(spec: str) -> LockFactory:
    module, _, attribute = spec.partition(":")
    factory: LockFactory = getattr(importlib.import_module(module), attribute)
    return factory


async def _contend(
    client: Any,
    factory: LockFactory,
    names: Sequence[str],
    *,
    ttl: float,
    hold: float,
    end_at: float,
    rng: random.Random,
    worker: str,
    out: Any,
    counters: Counter[str],
    limit: int = 0,
    rw: bool = False,
    multi: int = 0,
    weights: int = 0,
) -> None:
    """One task: take a random lock (or `multi` random names at once; 1 to `weights`
    permits of a semaphore), hold it a little, record the section (one per name); until
    `end_at`."""
    extra = {"limit": limit} if limit else {}
    while (now := time.monotonic()) < end_at:
        held = rng.sample(list(names), multi) if multi else [rng.choice(names)]
        enter: float | None = None
        exit_ = 0.0
        token = 0
        tokens: dict[str, int] = {}
        slot = -1
        lost = False
        lost_names: set[str] = set()
        reason = ""
        lease: Any = None
        permits = rng.randint(1, weights) if weights else 1
        try:
            timeout = min(5.0, end_at - now)
            made: Any = factory(
                client, held if multi else held[0], ttl=ttl, timeout=timeout, **extra
            )
            writing = rw and rng.random() < WRITE_SHARE
            if rw:
                made = made.write() if writing else made.read()
            if permits > 1:
                made = await made.acquire(permits=permits, timeout=timeout)
            async with made as lease:
                enter = time.monotonic()
                if multi:
                    tokens = {str(n): int(t) for n, t in lease.fencing_tokens.items()}
                else:
                    token = int(lease.fencing_token)
                slot = -1 if getattr(lease, "slot", None) is None else int(lease.slot)
                if rw:
                    slot = int(writing)
                try:
                    await asyncio.sleep(rng.uniform(0, hold))
                finally:
                    exit_ = time.monotonic()  # also when the loss cancels the body
        except LeaseLostError as error:
            lost = True
            # A MultiLease's error names its first lost name: each name's own lease says
            # whether it was lost too.
            each_lease = getattr(lease, "leases", {}) if multi else {}
            lost_names = {n for n, held in each_lease.items() if held.lost} | {error.name}
            reason = error.reason.value
            counters["lost"] += 1
        except AcquireTimeoutError:
            counters["acquire timeouts"] += 1
            continue
        except BackendError as error:
            counters["backend errors"] += 1
            cause = type(error.__cause__).__name__ if error.__cause__ is not None else "timeout"
            counters[f"backend errors ({error.operation}, {cause})"] += 1
            await asyncio.sleep(0.05)
            continue
        if enter is None:
            continue  # lost before the body began: no critical section
        counters["sections"] += 1
        for each in held:
            lost_here = lost and (not multi or each in lost_names)
            section = Section(
                each, tokens.get(each, token), enter, exit_, lost_here, worker, reason, slot,
                permits,
            )  # fmt: skip
            out.write(section.to_json() + "\n")
        out.flush()


async def _worker(args: argparse.Namespace) -> None:
    factory = load_factory(args.lock)
    names = args.names.split(",")
    _say(json.dumps({"event": "ready", "pid": os.getpid()}))
    go = sys.stdin.readline()  # before any task runs: nothing else waits meanwhile
    end_at = float(go.split()[1])
    counters: Counter[str] = Counter()
    nodes: list[redis.asyncio.Redis] = [
        redis.asyncio.Redis.from_url(url) for url in (args.urls or "").split(",") if url
    ]
    sentinel = (
        Sentinel([("127.0.0.1", int(port)) for port in args.sentinels.split(",")])
        if getattr(args, "sentinels", None)
        else None
    )
    client: Any = (
        nodes
        if nodes
        else sentinel.master_for(SERVICE)
        if sentinel is not None
        else RedisCluster.from_url(args.url)
        if args.cluster
        else redis.asyncio.Redis.from_url(args.url)
    )
    try:
        with _open_log(args.out, "a") as out:
            async with asyncio.TaskGroup() as group:
                for i in range(int(args.tasks)):
                    group.create_task(
                        _contend(
                            client,
                            factory,
                            names,
                            ttl=args.ttl,
                            hold=args.hold,
                            end_at=end_at,
                            rng=random.Random(f"{args.seed}:{i}"),
                            worker=f"{os.getpid()}/{i}",
                            out=out,
                            counters=counters,
                            limit=int(getattr(args, "limit", 0) or 0),
                            rw=bool(getattr(args, "rw", False)),
                            multi=int(getattr(args, "multi", 0) or 0),
                            weights=int(getattr(args, "weights", 0) or 0),
                        )
                    )
    finally:
        for each in nodes or [client]:
            await each.aclose()
        for each in sentinel.sentinels if sentinel is not None else []:
            await each.aclose()
    _say(json.dumps({"event": "done", "counters": dict(counters)}))


def _contend_sync(
    client: Any,
    names: Sequence[str],
    *,
    ttl: float,
    hold: float,
    end_at: float,
    rng: random.Random,
    worker: str,
    out: Any,
    written: threading.Lock,
    counters: Counter[str],
) -> None:
    """One thread: as `_contend`, through `aiolock.sync.Lock` (a sync body, a `time.sleep`,
    that a loss cannot stop: its block's exit says so)."""
    import aiolock.sync

    while (now := time.monotonic()) < end_at:
        name = rng.choice(names)
        enter: float | None = None
        exit_ = 0.0
        token = 0
        lost = False
        reason = ""
        try:
            lock = aiolock.sync.Lock(client, name, ttl=ttl, timeout=min(5.0, end_at - now))
            with lock as lease:
                enter = time.monotonic()
                token = lease.fencing_token
                try:
                    time.sleep(rng.uniform(0, hold))
                finally:
                    exit_ = time.monotonic()
        except LeaseLostError as error:
            lost, reason = True, error.reason.value
            with written:
                counters["lost"] += 1
        except AcquireTimeoutError:
            with written:
                counters["acquire timeouts"] += 1
            continue
        except BackendError as error:
            cause = type(error.__cause__).__name__ if error.__cause__ is not None else "timeout"
            with written:
                counters["backend errors"] += 1
                counters[f"backend errors ({error.operation}, {cause})"] += 1
            time.sleep(0.05)
            continue
        if enter is None:
            continue
        section = Section(name, token, enter, exit_, lost, worker, reason)
        with written:
            counters["sections"] += 1
            out.write(section.to_json() + "\n")
            out.flush()


def _sync_worker(args: argparse.Namespace) -> None:
    """A worker whose threads lock through `aiolock.sync.Lock`, on a synchronous client."""
    import redis

    import aiolock.sync

    names = args.names.split(",")
    _say(json.dumps({"event": "ready", "pid": os.getpid()}))
    go = sys.stdin.readline()
    end_at = float(go.split()[1])
    counters: Counter[str] = Counter()
    written = threading.Lock()
    client = redis.Redis.from_url(args.url)
    try:
        with _open_log(args.out, "a") as out:
            threads = [
                threading.Thread(
                    target=_contend_sync,
                    args=(client, names),
                    kwargs={
                        "ttl": args.ttl,
                        "hold": args.hold,
                        "end_at": end_at,
                        "rng": random.Random(f"{args.seed}:{i}"),
                        "worker": f"{os.getpid()}/{i}",
                        "out": out,
                        "written": written,
                        "counters": counters,
                    },
                )
                for i in range(int(args.tasks))
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        aiolock.sync.shutdown()
        client.close()
    _say(json.dumps({"event": "done", "counters": dict(counters)}))


# =========================================================================== the orchestrator
async def _held_keys(client: redis.asyncio.Redis, pattern: str) -> list[str]:
    """Keys matching `pattern` that have a holder: a lock's state with a token, or a
    semaphore's with a permit that has not expired; each named with who holds it (the
    holder recorded, "<host> <pid> <task>", where there is one) and the ms it has left."""
    seconds, micros = await client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    held = []
    async for key in client.scan_iter(match=pattern, _type="hash", count=1000):
        fields = {
            (k.decode() if isinstance(k, bytes) else str(k)): (
                v.decode() if isinstance(v, bytes) else str(v)
            )
            for k, v in (await client.hgetall(key)).items()
        }
        permits = [v for k, v in fields.items() if k.startswith("p:")]
        if "token" in fields or any(int(v.split(" ")[1]) > now_ms for v in permits):
            name = key.decode() if isinstance(key, bytes) else str(key)
            holder = fields.get("m", f"{len(permits)} permits")
            held.append(f"{name} (held by {holder}, {await client.pttl(key)} ms left)")
    return held


async def _nemesis(
    server: Any,
    faults: Sequence[Fault],
    started: float,
    log: list[str],
    *,
    names: Sequence[str] = (),
    rng: random.Random | None = None,
    restarts: list[tuple[float, float]] | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    for fault in sorted(faults, key=lambda f: f.at):
        await asyncio.sleep(max(0.0, started + fault.at - loop.time()))
        if isinstance(server, ClusterGroup):
            assert rng is not None
            done = await server.inject(fault.kind, rng.choice(list(names)), fault.length)
            log.append(f"{fault} ({done})")
            continue
        if isinstance(server, SentinelGroup):
            log.append(f"{fault} ({await _sentinel_fault(server, fault)})")
            continue
        if isinstance(server, ServerGroup):
            assert rng is not None
            began = time.monotonic()
            done = await _group_fault(server, fault, rng)
            if fault.kind == "restart" and restarts is not None:
                restarts.append((began, time.monotonic()))
            log.append(f"{fault} ({done})")
            continue
        if fault.kind == "pause":
            await _paused(server, fault.length)
        else:
            await asyncio.to_thread(server.restart_empty)
        log.append(str(fault))


async def _paused(server: Any, seconds: float) -> None:
    """SIGSTOP `server` (a `RedisServer`) for `seconds`; SIGCONT on every path."""
    server.pause()
    try:
        await asyncio.sleep(seconds)
    finally:
        server.resume()


async def _group_fault(group: ServerGroup, fault: Fault, rng: random.Random) -> str:
    """Inject `fault` into one node of `group` picked by `rng` (into two proxied ones for a
    delay), and undo it before returning (on every path): where it was done."""
    try:
        if fault.kind == "delay":
            nodes = sorted(rng.sample(group.proxied, 2))
            await group.delay(nodes, fault.amount)
            try:
                await asyncio.sleep(fault.length)
            finally:
                await group.undelay()
            return f"nodes {nodes[0]} and {nodes[1]}"
        node = rng.randrange(len(group))
        if fault.kind == "pause":
            group.pause(node)
            try:
                await asyncio.sleep(fault.length)
            finally:
                group.resume(node)
        elif fault.kind == "kill":
            group.kill(node)
            try:
                await asyncio.sleep(fault.length)
            finally:
                await group.start(node)
        elif fault.kind == "restart":
            await group.restart_empty(node)
        else:
            raise ValueError(f"{fault.kind} is not a fault of a Redlock's servers")
        return f"node {node}"
    finally:
        for proxy in group.proxies.values():
            proxy.arrivals.clear()  # a long run would keep every request otherwise


async def _sentinel_fault(group: SentinelGroup, fault: Fault) -> str:
    """Inject `fault` into the master of the moment, and undo it before returning: where it
    was done."""
    master = group.by_port(await group.master_port())
    if fault.kind == "pause":
        await _paused(master, fault.length)
        return f"master on {master.port}"
    if fault.kind == "failover":
        new = await group.failover()
        return f"from {master.port} to {new.port}"
    if fault.kind == "kill-master":
        (replica,) = [server for server in group.data_servers if server is not master]
        master.kill()
        try:
            await group.wait_for_master(replica.port)
        finally:
            await asyncio.to_thread(master.start)
        await group.wait_for_role(master, "slave")
        await group.replicated()
        return f"{master.port} killed, {replica.port} promoted"
    raise ValueError(f"{fault.kind} is not a fault of a Sentinel deployment")


def _worker_command(config: CheckerConfig, index: int) -> tuple[str, Path, dict[str, str]]:
    """The interpreter, working directory and environment of worker `index`."""
    env = dict(os.environ)
    if config.sides[index] == "old":
        assert config.old_python is not None and config.old_tree is not None
        # `-m tests.checker` and `import aiolock` must find the old tree (the working
        # directory, first on sys.path), nothing of this one.
        for variable in ("PYTHONPATH", "PYTHONSAFEPATH", "PYTHONHOME", SERVE_LAYOUT1):
            env.pop(variable, None)
        return config.old_python, Path(config.old_tree).resolve(), env
    if config.old_processes:
        if config.serve_layout1_waiters:
            env[SERVE_LAYOUT1] = "1"
        else:
            env.pop(SERVE_LAYOUT1, None)
    return sys.executable, ROOT, env


async def _spawn(
    config: CheckerConfig,
    urls: Sequence[str],
    names: Sequence[str],
    index: int,
    directory: Path,
    *,
    sentinels: Sequence[int] = (),
) -> tuple[asyncio.subprocess.Process, Path, Any]:
    out = directory / f"worker-{index}.jsonl"
    stderr = _open_log(directory / f"worker-{index}.stderr", "wb")  # closed by run()
    python, cwd, env = _worker_command(config, index)
    process = await asyncio.create_subprocess_exec(
        python,
        "-m",
        "tests.checker",
        "--worker",
        "--url",
        urls[0],
        *(("--urls", ",".join(urls)) if config.redlock else ()),
        "--names",
        ",".join(names),
        "--tasks",
        str(config.tasks_of(index)),
        "--ttl",
        str(config.ttl),
        "--hold",
        str(config.hold),
        "--seed",
        f"{config.seed}:{index}",
        "--lock",
        config.lock,
        *(("--limit", str(config.limit)) if config.limit else ()),
        *(("--rw",) if config.rw else ()),
        *(("--multi", str(config.multi)) if config.multi else ()),
        *(
            ("--weights", str(config.weights))
            if config.weights and config.sides[index] == "new"
            else ()
        ),
        *(("--cluster",) if config.cluster else ()),
        *(("--sync",) if config.face(index) == "sync" else ()),
        *(("--sentinels", ",".join(map(str, sentinels))) if sentinels else ()),
        "--out",
        str(out),
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
    )
    return process, out, stderr


async def _line(process: asyncio.subprocess.Process, timeout: float) -> dict[str, Any] | None:
    assert process.stdout is not None
    async with asyncio.timeout(timeout):
        line = await process.stdout.readline()
    return json.loads(line) if line else None


async def run(config: CheckerConfig, *, server: Any = None) -> Report:
    """Run the workload and verify it. `server` (an `aiolock.testing.RedisServer`) is needed
    to inject faults; without it and without `config.url`, the checker starts its own."""
    own_server: Any = None
    if (config.cluster or config.sentinel) and server is None:
        from aiolock.testing import find_binaries

        binary = find_binaries()[0]
        deployment = ClusterGroup(binary) if config.cluster else SentinelGroup(binary)
        own_server = server = deployment.__enter__()
        try:
            await (server.create() if config.cluster else server.ready())
        except BaseException:
            server.stop()
            raise
    elif config.redlock and server is None:
        from aiolock.testing import find_binaries

        proxied = [i for i in REDLOCK_PROXIED if i < config.redlock]
        group = ServerGroup(find_binaries()[0], config.redlock, proxied=proxied)
        own_server = server = await group.__aenter__()
    elif server is None and config.url is None:
        from aiolock.testing import RedisServer, find_binaries

        own_server = server = RedisServer(find_binaries()[0]).start()
    if config.faults and server is None:
        raise ValueError("faults need a server the checker may pause and restart (no --url)")
    if config.redlock and not isinstance(server, ServerGroup):
        raise ValueError("a Redlock run needs a ServerGroup of its servers")
    ports: list[int] = []
    nodes: list[str] = []
    url: str | None
    urls: list[str]
    sentinels: list[int] = []
    if isinstance(server, SentinelGroup):
        url = f"redis://127.0.0.1:{await server.master_port()}/0"
        sentinels = [s.port for s in server.sentinels]
        urls = [url]
    elif isinstance(server, ClusterGroup):
        url = f"redis://127.0.0.1:{server.servers[0].port}/0"
        ports = [s.port for s in server.servers]
        urls = [url]
    elif isinstance(server, ServerGroup):
        urls = server.urls
        url = urls[0]
        nodes = server.direct_urls
    else:
        url = config.url if server is None else server.url
        assert url is not None
        urls = [url]
    assert url is not None
    run_id = uuid.uuid4().hex[:8]
    names = [f"checker-{run_id}:{i}" for i in range(config.names)]
    loop = asyncio.get_running_loop()
    began = loop.time()
    counters: Counter[str] = Counter()
    failures: list[str] = []
    faults_log: list[str] = []
    restarts: list[tuple[float, float]] = []  # a Redlock node's empty restarts at once
    workers: list[tuple[asyncio.subprocess.Process, Path, Any]] = []
    worker_counters: list[Counter[str]] = [Counter() for _ in range(config.processes)]
    stderr_logs: list[str] = []
    go_at = 0.0
    with tempfile.TemporaryDirectory(prefix="aiolock-checker-") as tmp:
        directory = Path(tmp)
        try:
            workers = [
                await _spawn(config, urls, names, i, directory, sentinels=sentinels)
                for i in range(config.processes)
            ]
            for process, _, _ in workers:
                ready = await _line(process, 60)
                if ready is None or ready.get("event") != "ready":
                    raise RuntimeError(f"a worker did not start: {ready}")
            started = loop.time()
            go_at = time.monotonic()
            end_at = go_at + config.duration
            for process, _, _ in workers:
                assert process.stdin is not None
                process.stdin.write(f"go {end_at!r}\n".encode())
                await process.stdin.drain()
            nemesis = (
                asyncio.create_task(
                    _nemesis(
                        server,
                        config.faults,
                        started,
                        faults_log,
                        names=names,
                        rng=random.Random(f"{config.seed}:nemesis"),
                        restarts=restarts,
                    )
                )
                if config.faults
                else None
            )
            try:
                for index, (process, _, _) in enumerate(workers):
                    done = await _line(process, config.duration + 60)
                    code = await asyncio.wait_for(process.wait(), 30)
                    if done is None or code != 0:
                        failures.append(f"worker {index} exited with {code}")
                    else:
                        counters.update(done["counters"])
                        worker_counters[index].update(done["counters"])
            finally:
                if nemesis is not None:
                    if failures:
                        nemesis.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await nemesis
            sections = [
                _labelled(Section.from_json(line), config, index)
                for index, (_, out, _) in enumerate(workers)
                if out.exists()
                for line in out.read_text(encoding="utf-8").splitlines()
                if line
            ]
            sections.sort(key=lambda s: (s.enter, s.exit))
            verdict = verify(
                sections,
                limit=max(config.limit, 1),
                rw=config.rw,
                restarts=restarts,
                # (a node's call is bounded by a tenth of the ttl; a moment more to enter)
                written=config.ttl / 10 + 0.05,
            )
            if isinstance(server, SentinelGroup):  # the master of the end
                url = f"redis://127.0.0.1:{await server.master_port()}/0"
            held, leaked = await _sweep(url, names, config.ttl, ports, nodes=nodes)
        finally:
            for process, _, stderr in workers:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                if process.stdin is not None:
                    process.stdin.close()
                if process.stdout is not None:
                    await process.stdout.read()
                stderr.close()
            for index, (process, _, _) in enumerate(workers):
                if process.returncode not in (0, None) and not failures:
                    failures.append(f"worker {index} exited with {process.returncode}")
            if isinstance(own_server, ServerGroup):
                await own_server.aclose()
            elif own_server is not None:
                own_server.stop()
        for index in range(len(workers)):
            log = (directory / f"worker-{index}.stderr").read_text(errors="replace")
            stderr_logs.append(log)
            if failures and log.strip():
                failures.append(f"worker {index} stderr (last lines): {log[-2000:]}")
    return Report(
        config=config,
        verdict=verdict,
        elapsed=loop.time() - began,
        faults_injected=faults_log,
        held_at_end=held,
        leaked=leaked,
        counters=counters,
        worker_failures=failures,
        sections=sections,
        worker_counters=worker_counters,
        worker_stderr=stderr_logs,
        started=go_at,
        ended=go_at + config.duration,
    )


def _labelled(section: Section, config: CheckerConfig, index: int) -> Section:
    """`section`, written by worker `index`, labelled with that worker's version."""
    if config.sync_processes:
        return dataclasses.replace(section, worker=f"{config.face(index)}:{section.worker}")
    if not config.old_processes:
        return section
    return dataclasses.replace(section, worker=f"{config.sides[index]}:{section.worker}")


async def _sweep(
    url: str,
    names: Sequence[str],
    ttl: float,
    ports: Sequence[int] = (),
    *,
    nodes: Sequence[str] = (),
) -> tuple[list[str], list[str]]:
    """Keys of the run held right at the end, and those still held after their ttl (on a
    cluster, `ports` are its nodes: the primaries among them are scanned; of a Redlock,
    `nodes` are its servers' URLs: every one is scanned, and a key is named with its node's
    index, "node 3: KEY")."""
    prefix = names[0].rsplit(":", 1)[0]
    patterns = tuple(f"aiolock:{kind}{{{prefix}:*" for kind in ("", "sem:", "rw:", "rl:"))
    clients = (
        [redis.asyncio.Redis(port=port) for port in ports]
        or [redis.asyncio.Redis.from_url(node) for node in nodes]
        or [redis.asyncio.Redis.from_url(url)]
    )

    async def held_now() -> list[str]:
        found: list[str] = []
        for index, client in enumerate(clients):
            if ports and (await client.info("replication")).get("role") != "master":
                continue
            keys = [key for pattern in patterns for key in await _held_keys(client, pattern)]
            found += [f"node {index}: {key}" for key in keys] if nodes else keys
        return found

    try:
        held = await held_now()
        leaked = held
        if held:
            await asyncio.sleep(ttl + 1.0)  # a release that failed: the key expires by itself
            leaked = await held_now()
        return held, leaked
    finally:
        for client in clients:
            await client.aclose()


# =========================================================================== command line
def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.checker",
        description="Check aiolock's mutual exclusion and fencing under contention and faults.",
    )
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument(
        "--tasks",
        default="8",
        help="tasks per process; a list (1,4) gives each process the next number in turn",
    )
    parser.add_argument("--names", default="3", help="number of lock names")
    duration = parser.add_mutually_exclusive_group()
    duration.add_argument("--minutes", type=float)
    duration.add_argument("--seconds", type=float)
    parser.add_argument("--url", help="an existing server (default: start one)")
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--hold", type=float, default=0.005, help="longest body, seconds")
    parser.add_argument(
        "--faults", action="store_true", help="pause and restart the server (not with --url)"
    )
    parser.add_argument("--fault-every", type=float, default=5.0, help="seconds between faults")
    parser.add_argument("--lock", default=DEFAULT_LOCK, help="lock factory, module:attribute")
    parser.add_argument(
        "--limit",
        type=int,
        default=0,
        help=f"check a semaphore of this limit ({DEFAULT_SEMAPHORE} unless --lock says)",
    )
    parser.add_argument(
        "--rw",
        action="store_true",
        help=f"check a read-write lock ({DEFAULT_RWLOCK} unless --lock says)",
    )
    parser.add_argument(
        "--sentinel",
        action="store_true",
        help="through 3 Sentinels of the checker's own, on a master and its replica",
    )
    parser.add_argument(
        "--weights",
        type=int,
        default=0,
        metavar="W",
        help="with --limit: each section takes 1 to W permits at once (acquire(permits=))",
    )
    parser.add_argument(
        "--multi",
        type=int,
        default=0,
        metavar="K",
        help=f"each section holds K of the names at once ({DEFAULT_MULTILOCK} unless --lock says)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="on a Redis Cluster of the checker's own (3 primaries, 3 replicas)",
    )
    parser.add_argument(
        "--redlock",
        type=int,
        default=0,
        metavar="N",
        help=f"check a Redlock ({DEFAULT_REDLOCK} unless --lock says) over N servers of its own",
    )
    parser.add_argument(
        "--sync-processes",
        type=int,
        default=0,
        help="how many of the processes lock through aiolock.sync.Lock (threads)",
    )
    parser.add_argument("--seed", default="0")
    parser.add_argument(
        "--old-processes",
        type=int,
        default=0,
        help="how many of the processes run an older version (with --old-python, --old-tree)",
    )
    parser.add_argument("--old-python", help="the older version's virtualenv interpreter")
    parser.add_argument("--old-tree", help="the older version's source tree")
    parser.add_argument(
        "--without-serve-layout1",
        action="store_true",
        help=f"run the new processes without {SERVE_LAYOUT1}=1 (with old processes)",
    )
    # Internal: what the orchestrator passes to a worker process.
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--urls", help=argparse.SUPPRESS)
    parser.add_argument("--sentinels", help=argparse.SUPPRESS)
    parser.add_argument("--sync", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.worker:
        if args.sync:
            _sync_worker(args)
        else:
            asyncio.run(_worker(args))
        return 0
    if args.cluster and args.url:
        sys.stderr.write("--cluster builds a cluster of the checker's own: leave out --url\n")
        return 2
    if args.redlock and args.url:
        sys.stderr.write("--redlock starts servers of the checker's own: leave out --url\n")
        return 2
    if args.sentinel and args.url:
        sys.stderr.write("--sentinel starts servers of the checker's own: leave out --url\n")
        return 2
    if args.faults and args.url:
        sys.stderr.write("--faults needs a server of the checker's own: leave out --url\n")
        return 2
    duration = 60.0 * args.minutes if args.minutes is not None else (args.seconds or 60.0)
    mix = tuple(int(n) for n in args.tasks.split(","))
    config = CheckerConfig(
        processes=args.processes,
        tasks=mix[0],
        task_mix=mix if len(mix) > 1 else (),
        names=int(args.names),
        duration=duration,
        ttl=args.ttl,
        hold=args.hold,
        url=args.url,
        faults=tuple(
            periodic_faults(
                duration,
                args.ttl,
                every=args.fault_every,
                cluster=args.cluster,
                redlock=bool(args.redlock),
                sentinel=args.sentinel,
            )
        )
        if args.faults
        else (),
        cluster=args.cluster,
        sentinel=args.sentinel,
        redlock=args.redlock,
        lock=args.lock,
        limit=args.limit,
        weights=args.weights,
        rw=args.rw,
        multi=args.multi,
        seed=int(args.seed),
        old_processes=args.old_processes,
        sync_processes=args.sync_processes,
        old_python=args.old_python,
        old_tree=args.old_tree,
        serve_layout1_waiters=not args.without_serve_layout1,
    )
    report = asyncio.run(run(config))
    _say(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
