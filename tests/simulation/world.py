"""One simulated run: servers, processes whose tasks take critical sections with the real
primitives, a nemesis that injects the faults, and the verdict.

A run is a function of its seed: the scenario (which primitive, how many processes, which
faults) is drawn from it, and so is everything that happens (`loop`, `server`). The history
is recorded in the safety checker's format (`tests.checker.Section`) and judged by its judge
(`tests.checker.verify`); on top of it, what only a simulation can see:

- a body step that ran past its lease's deadline without being told (the lease's promise:
  a loss raises in the body at its first await after a stall);
- a waiter left waiting while its name was free for longer than `SERVED_WITHIN`;
- a key still held once every process has ended (and its ttl run out).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import gc
import io
import random
import secrets
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

import aiolock
from aiolock import AcquireTimeoutError, BackendError, LeaseLostError
from aiolock._lua.layout import RESERVATION_MS, TOLD_EVERY_MS, LockKeys
from tests.checker import Section, Verdict, Violation, _held_keys, verify

from .loop import PROCESS, SimLoop, Stuck
from .server import EPOCH, NetworkFaults, SimServer, virtual_time

__all__ = ("KINDS", "Outcome", "Scenario", "run", "scenario_for")

KINDS = ("lock", "semaphore", "redlock", "multilock", "election", "rwlock")
FAULTS = (
    "delay",
    "loss",
    "messages",
    "subscription",
    "pause",
    "kill",
    "cancel",
    "restart",
    "failover",
)
SERVED_WITHIN = (RESERVATION_MS + TOLD_EVERY_MS) / 1000 + 0.05
"""Longest a waiter may wait while its name is free (virtual seconds), when no fault
struck: a grant told to its process alone is kept for that process up to RESERVATION_MS,
and a waiter of another process told to check again within TOLD_EVERY_MS of the last
grant told to all (docs/guarantees.md); a Redlock's split vote is retried sooner."""
LATENCY = 0.002
"""Every request, reply and pushed message takes up to this long (seconds) to the first
server, up to five times longer to the second, nine times to the third: a Redlock's
release reaches its nodes one after the other, and their announcements too."""
CLEAN = 0.3
"""The share of seeds run without faults (where a waiter's service is judged too)."""
SHOWN = 8
WRITES = 0.4
"""The share of a read-write lock's sections that write."""
"""Problems a report shows (the first ones)."""
PAST_DEADLINE = 0.005
"""How late after its lease's deadline a body step may still run (the loop's own lag)."""
LATE_WRITES = 30.0
"""How long after every process ended the servers may still be running scripts (the late
calls of a process paused in the middle of them)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    kind: str
    processes: int
    tasks: int
    names: int
    ttl: float
    hold: float
    seconds: float
    faults: tuple[str, ...]
    servers: int = 1

    def __str__(self) -> str:
        faults = ",".join(self.faults) or "none"
        return (
            f"{self.kind} servers={self.servers} processes={self.processes} tasks={self.tasks} "
            f"names={self.names} ttl={self.ttl:g} hold={self.hold:g} seconds={self.seconds:g} "
            f"faults={faults}"
        )


def scenario_for(seed: int, kind: str | None = None) -> Scenario:
    """The scenario of `seed` (of `kind`, or one drawn from the seed)."""
    rng = random.Random(f"scenario {seed}")
    kind = kind or KINDS[seed % len(KINDS)]
    unlike_redlock = ("restart", "failover")
    allowed = [f for f in FAULTS if not (kind == "redlock" and f in unlike_redlock)]
    faults = tuple(f for f in allowed if rng.random() < 0.35)
    if rng.random() < CLEAN:
        faults = ()
    scenario = Scenario(
        kind=kind,
        processes=rng.randint(2, 4),
        tasks=rng.randint(1, 3),
        names=1 if kind == "election" else rng.randint(1, 3),
        ttl=rng.choice((1.0, 2.0, 5.0)),
        hold=rng.choice((0.05, 0.3, 1.0)),
        seconds=rng.choice((10.0, 20.0, 30.0)),
        faults=faults,
        servers=3 if kind == "redlock" else 1,
    )
    # A Redlock's restart (a node down past the ttl, back empty) is drawn last, so that a
    # seed's other draws are those of the scenarios before it was added.
    if kind == "redlock" and faults and rng.random() < 0.35:
        scenario = dataclasses.replace(scenario, faults=(*faults, "restart"))
    return scenario


@dataclass(slots=True)
class Outcome:
    seed: int
    scenario: Scenario
    verdict: Verdict
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    steps: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def report(self) -> str:
        lines = [f"seed {self.seed}: {self.scenario}"]
        lines += [f"  problem: {p}" for p in self.problems[:SHOWN]]
        if len(self.problems) > SHOWN:
            lines.append(f"  ... and {len(self.problems) - SHOWN} more problems")
        lines += [f"  trace: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass(slots=True)
class _Process:
    name: str
    clients: list[Any]
    rng: random.Random
    open: dict[int, tuple[list[str], dict[str, int], float, int]] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class World:
    """The run in progress (see the module docstring)."""

    def __init__(self, seed: int, scenario: Scenario, loop: SimLoop) -> None:
        self.seed = seed
        self.scenario = scenario
        self.loop = loop
        self.rng = random.Random(f"world {seed}")
        s = scenario
        faults = NetworkFaults(
            latency=LATENCY,
            delay=0.2 if "delay" in s.faults else 0.0,
            max_delay=s.ttl * 0.3,
            loss=0.01 if "loss" in s.faults else 0.0,
            message_loss=0.1 if "messages" in s.faults else 0.0,
        )
        self.servers = [
            SimServer(
                f"server{i}",
                loop,
                random.Random(f"server {seed} {i}"),
                dataclasses.replace(faults, latency=LATENCY * (1 + 4 * i)),
            )
            for i in range(s.servers)
        ]
        self.names = [f"sim:{i}" for i in range(s.names)]
        self.end = loop.time() + s.seconds
        self.out = io.StringIO()
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.waiting: list[tuple[str, float, float]] = []  # name, began, served (or end)
        self.struck = False  # a fault struck that excuses a slow service
        self.forgot: list[float] = []  # when a server forgot writes (empty restart, failover)
        self.emptied: list[float] = []  # when the server restarted empty (it forgot all)
        self.paused: dict[str, list[tuple[float, float]]] = {}  # a process's pauses
        self.processes = [
            _Process(f"p{i}", [srv.client() for srv in self.servers], random.Random(f"{seed} {i}"))
            for i in range(s.processes)
        ]

    def note(self, what: str) -> None:
        self.notes.append(f"{self.loop.time():.6f} {what}")

    # ----------------------------------------------------------------- the primitives
    def _make(self, proc: _Process, names: list[str], timeout: float, side: int) -> Any:
        """The primitive a section takes (`side`: a read-write lock's, 0 read, 1 write)."""
        s = self.scenario
        client = proc.clients[0]
        if s.kind == "rwlock":
            rw = aiolock.ReadWriteLock(client, names[0], ttl=s.ttl, timeout=timeout)
            return rw.write() if side else rw.read()
        if s.kind == "lock":
            return aiolock.Lock(client, names[0], ttl=s.ttl, timeout=timeout)
        if s.kind == "semaphore":
            return aiolock.Semaphore(client, names[0], limit=2, ttl=s.ttl, timeout=timeout)
        if s.kind == "redlock":
            return aiolock.Redlock(proc.clients, names[0], ttl=s.ttl, timeout=timeout)
        if s.kind == "multilock":
            return aiolock.MultiLock(client, names, ttl=s.ttl, timeout=timeout)
        raise AssertionError(s.kind)

    # ----------------------------------------------------------------- one task
    async def _section(self, proc: _Process, index: int) -> None:
        s, loop, rng = self.scenario, self.loop, proc.rng
        multi = s.kind == "multilock"
        held = (
            rng.sample(self.names, min(2, len(self.names))) if multi else [rng.choice(self.names)]
        )
        timeout = min(5.0, max(self.end - loop.time(), 0.1))
        side = int(rng.random() < WRITES) if s.kind == "rwlock" else -1
        made = self._make(proc, held, timeout, side)
        enter: float | None = None
        exit_ = 0.0
        tokens: dict[str, int] = {}
        slot = -1
        lost_names: set[str] = set()
        reason = ""
        began = loop.time()
        lease: Any = None
        steps: list[float] = []
        try:
            async with made as lease:
                enter = loop.time()
                self.waiting.append((held[0], began, enter))
                if multi:
                    tokens = {str(n): int(t) for n, t in lease.fencing_tokens.items()}
                else:
                    tokens = {held[0]: int(lease.fencing_token)}
                leased = getattr(lease, "slot", None)
                slot = side if side >= 0 else -1 if leased is None else int(leased)
                proc.open[index] = (held, tokens, enter, slot)
                try:
                    await self._body(rng, steps, lease)
                finally:
                    exit_ = loop.time()
                    proc.open.pop(index, None)
        except LeaseLostError as error:
            self._check_steps(proc, lease, steps)
            leases = getattr(lease, "leases", {}) if multi else {}
            lost_names = {n for n, each in leases.items() if each.lost} | {error.name}
            reason = error.reason.value
        except AcquireTimeoutError:
            self.waiting.append((held[0], began, loop.time()))
            return
        except BackendError as error:
            self._check_backend_error(proc, error)
            await asyncio.sleep(0.05)
            return
        if enter is None:
            return
        self._record(
            held,
            tokens=tokens,
            span=(enter, exit_),
            worker=f"{proc.name}/{index}",
            lost=lost_names,
            reason=reason,
            slot=slot,
        )

    def _check_backend_error(self, proc: _Process, error: BackendError) -> None:
        """A server's error reply (a script that raised, a command refused) is a bug: the
        faults simulated only break connections and delay or lose traffic."""
        cause = error.__cause__
        if isinstance(cause, redis.ResponseError):
            self.problems.append(f"{proc.name}: the server answered an error: {cause}")

    def _record(
        self,
        held: list[str],
        *,
        tokens: dict[str, int],
        span: tuple[float, float],
        worker: str,
        lost: set[str] | None = None,
        reason: str = "",
        slot: int = -1,
    ) -> None:
        """One section per name of `held`, in the checker's format."""
        enter, exit_ = span
        for name in held:
            lost_here = lost is not None and name in lost
            section = Section(name, tokens[name], enter, exit_, lost_here, worker, reason, slot)
            self.out.write(section.to_json() + "\n")

    async def _body(self, rng: random.Random, steps: list[float], lease: Any = None) -> None:
        """A few steps, each an effect that must happen within the lease (their times in
        `steps`, for `_check_steps`)."""
        for _ in range(rng.randint(1, 3)):
            steps.append(self.loop.time())
            self._check_validity(lease)
            if rng.random() < 0.2:
                await asyncio.sleep(0)
            else:
                await asyncio.sleep(rng.uniform(0, self.scenario.hold))

    def _check_validity(self, lease: Any) -> None:
        """A `Lock`'s lease never counts on more than the server gives it: while the server
        holds the key under the lease's token, the lease's deadline is not later than the
        key's expiry (a deadline counts from when the acquire or renewal was sent)."""
        if lease is None or self.scenario.kind != "lock":
            return
        if {"restart", "failover"} & set(self.scenario.faults):
            return  # a documented fault: the server forgot, the holder is told later
        key = LockKeys.build("aiolock", lease.name).lock.encode()
        db = self.servers[0].fake.dbs[0]
        item = db._dict.get(key)
        if item is None or item.expireat is None:
            return
        fields = item.value
        if fields.get(b"token") != lease.token.encode():
            return
        expires = item.expireat - EPOCH
        if lease.deadline > expires + PAST_DEADLINE:
            self.problems.append(
                f"a lease of {lease.name!r} (token {lease.fencing_token}) counts on "
                f"{lease.deadline - expires:.6f}s more than the server's expiry of its key"
            )

    def _check_steps(self, proc: _Process, lease: Any, steps: list[float]) -> None:
        """Once the block has ended: of a lease that was lost, at most one step of the body
        ran after the lease's end (its last deadline: renewals confirmed later moved it).

        The promise (`_engine.guard`): a loss raises at the body's first await after a
        stall; the code between the stall and that await cannot be stopped (fencing covers
        it). So one step may run late, the next one never."""
        if lease is None:
            return
        for each in list(getattr(lease, "leases", {}).values()) or [lease]:
            if not each.lost:
                continue
            late = [t - each.deadline for t in steps if t - each.deadline > PAST_DEADLINE]
            if len(late) > 1:
                self.problems.append(
                    f"{proc.name}: {len(late)} body steps ran after the end of its lost lease "
                    f"(token {each.fencing_token}), up to {max(late):.6f}s late, before it "
                    "was told (at most one may: the code up to the first await)"
                )

    async def _worker(self, proc: _Process, index: int) -> None:
        cancel = "cancel" in self.scenario.faults
        while self.loop.time() < self.end:
            attempt = asyncio.ensure_future(self._section(proc, index))
            timer = None
            if cancel and proc.rng.random() < 0.2:
                timer = self.loop.call_later(proc.rng.uniform(0, self.scenario.ttl), attempt.cancel)
            try:
                await attempt
            except asyncio.CancelledError:
                if not attempt.cancelled():
                    raise
                opened = proc.open.pop(index, None)
                if opened is not None:
                    held, tokens, enter, slot = opened
                    span = (enter, self.loop.time())
                    self._record(held, tokens=tokens, span=span, worker=proc.name, slot=slot)
            finally:
                if timer is not None:
                    timer.cancel()

    async def _elect(self, proc: _Process, index: int) -> None:
        """A candidate: each term won is a section of the election's name."""
        s, loop = self.scenario, self.loop
        election = aiolock.Election(proc.clients[0], self.names[0], ttl=s.ttl)
        campaign = election.campaign()
        while loop.time() < self.end:
            began = loop.time()
            try:
                term = await campaign.__anext__()
            except BackendError:  # the campaign ends with the error: a new one
                await campaign.aclose()
                await asyncio.sleep(0.05)
                campaign = election.campaign()
                continue
            lost: set[str] = set()
            self.waiting.append((self.names[0], began, loop.time()))
            tokens = {self.names[0]: int(term.fencing_token)}
            steps: list[float] = []
            span: tuple[float, float] | None = None
            try:
                async with term:
                    enter = loop.time()
                    proc.open[index] = ([self.names[0]], tokens, enter, -1)
                    try:
                        await self._body(proc.rng, steps)
                    finally:
                        span = (enter, loop.time())
                        proc.open.pop(index, None)
            except LeaseLostError:
                lost = set(self.names)
                self._check_steps(proc, term.lease, steps)
            if span is None:
                continue  # lost before the body began: no section
            worker = f"{proc.name}/{index}"
            self._record(list(tokens), tokens=tokens, span=span, worker=worker, lost=lost)
        await campaign.aclose()

    # ----------------------------------------------------------------- the nemesis
    async def _nemesis(self) -> None:
        s, loop, rng = self.scenario, self.loop, self.rng
        events = [
            f for f in s.faults if f in ("pause", "kill", "subscription", "restart", "failover")
        ]
        if "failover" in events:
            loop.create_task(self._replicate())
        killed = False
        while events and loop.time() < self.end - s.ttl:
            await asyncio.sleep(rng.uniform(0.2, 2.0) * s.ttl)
            fault = rng.choice(events)
            server = rng.choice(self.servers)
            alive = [p for p in self.processes if not loop.killed(p.name)]
            if fault == "pause":
                proc = rng.choice(alive)
                pause = rng.uniform(0.3, 2.0) * s.ttl
                self.note(f"{proc.name} paused for {pause:.6f}s")
                self.struck = True
                loop.pause(proc.name)
                self.paused.setdefault(proc.name, []).append((loop.time(), loop.time() + pause))
                await asyncio.sleep(pause)
                loop.resume(proc.name)
                self.note(f"{proc.name} resumed")
            elif fault == "kill" and not killed and len(alive) > 1:
                killed = True
                self._kill(rng.choice(alive))
            elif fault == "subscription":
                if server.drop_subscription():
                    self.note(f"{server.name}: a subscription lost")
            elif fault == "restart" and s.kind == "redlock":
                # A node restarted empty only after the longest ttl (docs/guarantees.md,
                # "Empty restarts"): within the Redlock's guarantee, nothing excused.
                self.struck = True
                server.stop()
                await asyncio.sleep(rng.uniform(1.05, 1.5) * s.ttl)
                server.start_empty()
            elif fault == "restart":
                self.struck = True
                self.forgot.append(loop.time())
                self.emptied.append(loop.time())
                server.restart_empty()
            elif fault == "failover":
                self.struck = True
                self.forgot.append(loop.time())
                server.fail_over()

    async def _replicate(self) -> None:
        while self.loop.time() < self.end:
            for server in self.servers:
                server.replicate()
            await asyncio.sleep(self.rng.uniform(0.05, 0.5) * self.scenario.ttl)

    def _kill(self, proc: _Process) -> None:
        """The process dies at once: no `finally` of it runs; its sections end now."""
        self.struck = True
        self.loop.kill(proc.name)
        self.note(f"{proc.name} killed")
        now = self.loop.time()
        for index, (held, tokens, enter, slot) in list(proc.open.items()):
            span = (enter, now)
            self._record(held, tokens=tokens, span=span, worker=f"{proc.name}/{index}", slot=slot)
        proc.open.clear()
        for sock_owner in proc.clients:
            with contextlib.suppress(Exception):
                for conn in list(sock_owner.connection_pool._available_connections) + list(
                    sock_owner.connection_pool._in_use_connections
                ):
                    if conn._sock is not None:
                        conn._sock.reset()

    # ----------------------------------------------------------------- the run
    def _spawn(self, proc: _Process, coro: Any) -> asyncio.Task[None]:
        context = contextvars.copy_context()
        context.run(PROCESS.set, proc.name)
        return self.loop.create_task(coro, context=context)

    async def main(self) -> None:
        s, loop = self.scenario, self.loop
        for proc in self.processes:
            for index in range(s.tasks):
                job = (
                    self._elect(proc, index) if s.kind == "election" else self._worker(proc, index)
                )
                proc.tasks.append(self._spawn(proc, job))
        nemesis = loop.create_task(self._nemesis())
        await nemesis
        live = [t for p in self.processes if not loop.killed(p.name) for t in p.tasks]
        done, pending = await asyncio.wait(live, timeout=max(self.end - loop.time(), 0) + 30.0)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                error = task.exception()
                self.problems.append(f"a task failed: {type(error).__name__}: {error}")
        if pending:
            self.problems.append(f"{len(pending)} task(s) still running 30 s after the end")
            for task in pending:
                task.cancel()
        await self._judge_end()
        for proc in self.processes:
            if loop.killed(proc.name):
                continue
            for client in proc.clients:
                await client.aclose()

    async def _judge_end(self) -> None:
        """Nothing held once every process has ended: when no fault struck, once the calls
        left in the background have ended; else once the ttl has run out since the last
        script the servers ran."""
        checker = [server.client(clean=True) for server in self.servers]
        clean = not self.scenario.faults
        try:
            if clean:
                # a quorum's calls to its slowest node end in the background (a give-back
                # among them), each within the node timeout (a tenth of the ttl)
                await asyncio.sleep(self.scenario.ttl / 4)
                held = [k for c in checker for k in await _held_keys(c, "aiolock:*")]
                if held:
                    self.problems.append(f"held after every process released: {held}")
            await asyncio.sleep(self.scenario.ttl * (3 / 4 if clean else 1) + 1.0)
            if not clean:
                # A call of a process paused in the middle of it may write after the end
                # (its node's acquire, on a Redlock: a key held for the ttl, no longer):
                # what is judged is a ttl after the last script the servers ran.
                await self._until_scripts_stop(self.scenario.ttl + 0.05)
            held = [k for c in checker for k in await _held_keys(c, "aiolock:*")]
            if held:
                self.problems.append(f"held after the ttl, every process ended: {held}")
        finally:
            for client in checker:
                await client.aclose()

    async def _until_scripts_stop(self, quiet: float) -> None:
        """Wait until no server has run a script for `quiet` seconds (at most LATE_WRITES
        seconds after now: then it is a problem)."""
        loop = self.loop
        give_up = loop.time() + LATE_WRITES
        while (wait := max(s.last_script for s in self.servers) + quiet - loop.time()) > 0:
            if loop.time() + wait > give_up:
                self.problems.append(f"scripts still run {LATE_WRITES:g} s after the end")
                return
            await asyncio.sleep(wait)

    def judge(self) -> Verdict:
        sections = [Section.from_json(line) for line in self.out.getvalue().splitlines()]
        kind = self.scenario.kind
        verdict = verify(sections, limit=2 if kind == "semaphore" else 1, rw=kind == "rwlock")
        forgot = bool({"restart", "failover"} & set(self.scenario.faults))
        for violation in verdict.violations:
            if forgot and _fenced_store_accepts(violation):
                self.notes.append(f"excused after a restart or failover: {violation}")
            elif within_forgetting_bound(violation, self.forgot, self.scenario.ttl):
                self.notes.append(f"within an empty restart's or failover's bound: {violation}")
            else:
                self.problems.append(str(violation))
        self._judge_told_after_restarts(sections)
        if not self.struck and not set(self.scenario.faults) & {
            "delay",
            "loss",
            "messages",
            "subscription",
            "cancel",
        }:
            self._judge_service(sections)
        return verdict

    def _judge_told_after_restarts(self, sections: list[Section]) -> None:
        """The body of a holder whose server restarted empty ends within its lease's
        deadline, told or not (docs/guarantees.md: the loss is found at the next renewal,
        which fails; no renewal sent after the restart succeeds, so the deadline is at
        most a ttl after it, and the body is cancelled there). A pause of the process
        after the restart excuses it: a stalled process cannot be stopped, only told when
        it resumes (the "told in time" check judges that)."""
        bound = self.scenario.ttl + PAST_DEADLINE
        for when in self.emptied:
            for section in sections:
                if section.enter >= when or section.exit <= when + bound:
                    continue
                process = section.worker.partition("/")[0]
                pauses = self.paused.get(process, [])
                if any(start < section.exit and end > when for start, end in pauses):
                    continue
                told = "told at the release" if section.lost else "never told"
                self.problems.append(
                    f"a body ran {section.exit - when:.6f}s after an empty restart at "
                    f"{when:.6f} ({told}; bound: the ttl): {section}"
                )

    def _judge_service(self, sections: list[Section]) -> None:
        """A waiter is served within `SERVED_WITHIN` of its name becoming free."""
        if self.scenario.kind not in ("lock", "redlock", "election"):
            return
        by_name: dict[str, list[tuple[float, float]]] = {}
        for section in sections:
            by_name.setdefault(section.name, []).append((section.enter, section.exit))
        for name, began, served in self.waiting:
            free_since = began
            for enter, exit_ in sorted(by_name.get(name, [])):
                if exit_ <= free_since or enter >= served:
                    free_since = max(free_since, exit_)
                    continue
                if enter - free_since > SERVED_WITHIN:
                    break
                free_since = max(free_since, exit_)
            else:
                enter = served
            if min(enter, served) - free_since > SERVED_WITHIN:
                self.problems.append(
                    f"a waiter of {name!r} (since {began:.6f}) waited "
                    f"{min(enter, served) - free_since:.6f}s while the name was free "
                    f"(from {free_since:.6f}; served at {served:.6f})"
                )


def within_forgetting_bound(violation: Violation, forgot: list[float], ttl: float) -> bool:
    """An overlap that a server's forgetting lets in, within its documented bound
    (docs/guarantees.md, "Mutual exclusion"): the server forgot the earlier holder's lease
    (restarted empty, or failed over to a replica without it) at a time F after that holder
    entered and before the later one did; the later holds the larger fencing token (a
    fenced store rejects the earlier's writes once the later's landed); and the earlier was
    told of the loss, or its body ended by F + ttl: no renewal sent after F can succeed, so
    its lease ended by then, and a body that ends within its lease is not told (its
    renewals and its release may all have failed to reach the server: then the release
    failure is logged, the work having run within the lease's deadline). Likewise a lease
    granted before F whose holder entered after one granted since: tokens out of order,
    the lower one's writes rejected by a fenced store, within the same bound."""
    earlier, later = violation.earlier, violation.later
    if violation.kind == "token order":
        # A lease granted before F (its token below the server's clock at F: tokens are
        # floored by it) whose holder entered after a holder granted since, untold: its
        # writes come with the lower token, which a fenced store rejects, until its lease
        # ends, by F + ttl.
        return any(
            later.token < (EPOCH + when) * 1e6
            and earlier.enter >= when
            and (later.lost or later.exit <= when + ttl + PAST_DEADLINE)
            for when in forgot
        )
    if violation.kind != "overlap" or later.token <= earlier.token:
        return False
    return any(
        earlier.enter < when <= later.enter
        and (earlier.lost or earlier.exit <= when + ttl + PAST_DEADLINE)
        for when in forgot
    )


def _fenced_store_accepts(violation: Violation) -> bool:
    """A token granted again after a server forgot its last writes (an empty restart, a
    failover), to holders that did not overlap: a fenced store accepts an equal token
    after it (docs/fencing.md), so what a failover's documented bound promises holds."""
    earlier, later = violation.earlier, violation.later
    return violation.kind == "duplicate token" and earlier.exit <= later.enter


@contextlib.contextmanager
def _determined(seed: int) -> Iterator[None]:
    """Every source of chance aiolock and fakeredis use, drawn from `seed` for the block."""
    entropy = random.Random(f"entropy {seed}")
    original_random = random.Random

    class Seeded(random.Random):
        def __init__(self, x: Any = None) -> None:
            super().__init__(entropy.getrandbits(64) if x is None else x)

    original_hex: Callable[..., str] = secrets.token_hex
    state = random.getstate()

    def token_hex(nbytes: int | None = None) -> str:
        size = 32 if nbytes is None else nbytes
        return entropy.getrandbits(8 * size).to_bytes(size, "big").hex()

    secrets.token_hex = token_hex
    random.Random = Seeded  # type: ignore[misc]
    random.seed(seed)
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        random.Random = original_random  # type: ignore[misc]
        secrets.token_hex = original_hex
        random.setstate(state)
        if collecting:
            gc.enable()


def run(seed: int, scenario: Scenario | None = None, *, trace: bool = False) -> Outcome:
    """One run of `seed` (its scenario drawn from it unless given)."""
    scenario = scenario or scenario_for(seed)
    with _determined(seed):
        loop = SimLoop(seed)
        loop.tracing = trace
        asyncio.set_event_loop(loop)
        world = World(seed, scenario, loop)
        try:
            with virtual_time(loop):
                try:
                    loop.run_until_complete(world.main())
                except Stuck as error:
                    world.problems.append(f"stuck: {error}")
                _drain(loop)
        finally:
            asyncio.set_event_loop(None)
            loop.close()
            _collect()
        verdict = world.judge()
    notes = sorted(world.notes + [n for srv in world.servers for n in srv.notes])
    outcome = Outcome(seed, scenario, verdict, world.problems, notes, loop.steps)
    if trace:
        outcome.notes += loop.trace
    return outcome


def _collect() -> None:
    """Collect the run's garbage: the coroutines of a killed process among it, whose
    `finally` blocks run now, on a closed loop (their errors are not the run's)."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda _: None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gc.collect()
    finally:
        sys.unraisablehook = hook


def _drain(loop: SimLoop) -> None:
    """Cancel what is left (the runtimes' tasks) and let it end, within a bound."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        with contextlib.suppress(BaseException):
            loop.run_until_complete(asyncio.wait(pending, timeout=5.0))
