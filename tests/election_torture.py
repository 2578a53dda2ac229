"""Leader election under process faults: candidate processes campaign on one election while
a nemesis kills and pauses them, and a fenced log checks what their leaders write.

```
python -m tests.election_torture --seconds 60 [--candidates 3] [--ttl 1] [--seed N] [--json]
    [--faults kill-leader,pause-leader,...] [--transfer 0.5]
```

The torture starts a throwaway server of its own (`aiolock.testing`) and `--candidates`
candidate processes. Each campaigns for ever (`Election.campaign()`); as leader it writes to
the fenced log at once, then every 20 ms, and resigns after 10 to 75 writes (0.2 to 1.5 s)
(with `--transfer P`, it hands the term instead, with probability P, to the last candidate
in line: `Term.transfer()`, timed and checked as a resignation is). The
fenced log is a Lua script on the same server: it accepts a write only with a fencing token
(the term's number) at least the highest it has accepted, and notes whether the write was
late: whether the writer's term had ended by then in Redis (the election's key no longer
holds it: resigned, expired or taken over). Every candidate logs, on `time.monotonic()` (one clock for every process of
the machine): each term won (once announced), each write as it is sent and its outcome
(which a loss may cut short), each resignation (just before `resign()`), each loss, how
each term was acquired (attempts, time waited), and each time its event loop ran more than
50 ms late (a stall: the process was not scheduled). An observer in this process records
what `Election.observe()` yields.

The nemesis injects one fault at a time, every 1 to 2 s: SIGKILL of the leader (restarted
0.3 s later), SIGSTOP of the leader for ttl + 0.5 to ttl + 1.5 s (then SIGCONT), or the same
to a candidate that is not leading. It waits for a killed candidate to be back before the
next fault.

Checked (the run fails on any):

- the fenced log never accepts a lower fencing token after a higher one, and refuses every
  late write (every write a leader attempted after its term had ended);
- the terms' fencing tokens strictly increase in the order the server announced them
  (`Term.since`);
- a leader paused past its ttl finds its term lost when it runs again, and its work is
  cancelled: it attempts at most one write after resuming (one may be under way);
- takeover after a leader was killed or paused: the next term is won within ttl + 0.2 s of
  the kill or the SIGSTOP (`TortureConfig.kill_bound`), not counting the winner's own
  stalls in between;
- takeover after a resignation: within `TortureConfig.resign_bound` (50 ms) at the p99,
  unless the candidate first in line was killed or paused (a killed one's entry stays in
  the queue until the leader's key would expire, plus 2 s): the term is granted to it, and
  the grant lapses after 1 s; those are timed apart, and reported; so are those that the
  stalls of the processes involved (the resigning leader, the one first in line, the
  winner) account for, as they measured them: within the bound with the stalled time out;
  a resignation whose leader was killed or paused before the takeover (after it logged the
  resignation, its release may not have reached Redis) is judged as a takeover after a
  kill or a pause, from the fault on;
- the observer saw every term won, in increasing order, and nothing after a term's end but
  None or a later term;
- a transfer hands the term to the candidate named (the next term is its), unless that
  candidate or the leader was killed or paused before the takeover.

The report gives the counts and the takeover times (p50, p99, max). From tests:
`report = await run(TortureConfig(seconds=8))`, then `report.ok`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio

from aiolock import (
    ConfigError,
    Election,
    EventKind,
    Leader,
    LeaseLostError,
    LockEvent,
    Term,
    add_listener,
)

ROOT = Path(__file__).resolve().parents[1]

FENCED_WRITE = """
-- KEYS[1] the fenced log's highest fencing token (string), KEYS[2] its log (list), KEYS[3]
-- the election's state hash; ARGV[1] the writer's term's fencing token, ARGV[2] writer,
-- ARGV[3] the writer's sequence number
-- Returns {accepted (1/0), late (1/0)}: accepted if the token is at least the highest
-- accepted; late if the election no longer holds that term (it ended before this write).
local token = tonumber(ARGV[1])
local highest = tonumber(redis.call('GET', KEYS[1]) or '0')
local s = redis.call('HMGET', KEYS[3], 'token', 'fence')
local late = 0
if not s[1] or tonumber(s[2] or '0') ~= token then
  late = 1
end
local accepted = 0
if token >= highest then
  accepted = 1
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. accepted .. ' ' .. late .. ' ' .. ARGV[2] .. ' ' .. ARGV[3])
return {accepted, late}
"""

NEXT_IN_LINE = """
-- KEYS[1] the election's wait queue (zset), KEYS[2] its entries (hash)
-- Returns the pid of the first process whose entry is live (the one a release grants the
-- term to), or 0: "<until ms> <count> <host> <pid> ..." (see aiolock's `_lua.layout`).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, wid in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local entry = redis.call('HGET', KEYS[2], wid) or ''
  local until_ms, pid = string.match(entry, '^(%d+) %d+ %S+ (%d+)')
  if until_ms and tonumber(until_ms) >= now then
    return tonumber(pid)
  end
end
return 0
"""

LAST_IN_LINE = """
-- KEYS[1] the election's wait queue (zset), KEYS[2] its entries (hash), KEYS[3] the
-- candidates' identities (hash, by queue id)
-- Returns {pid, identity} of the last process in line whose entry is live and whose
-- identity is recorded (the successor a transfer names), or {0, ''}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local line = redis.call('ZRANGE', KEYS[1], 0, -1)
for i = #line, 1, -1 do
  local entry = redis.call('HGET', KEYS[2], line[i]) or ''
  local identity = redis.call('HGET', KEYS[3], line[i])
  local until_ms, pid = string.match(entry, '^(%d+) %d+ %S+ (%d+)')
  if until_ms and tonumber(until_ms) >= now and identity then
    return {tonumber(pid), identity}
  end
end
return {0, ''}
"""

WRITE_EVERY = 0.02
STALL_TICK, STALL = 0.01, 0.05
"""A candidate checks every STALL_TICK that its event loop runs when asked; one running more
than STALL late is logged as a stall (its process was not scheduled)."""
HOLD = (10, 75)
"""Writes a leader makes before it resigns (0.2 to 1.5 s at WRITE_EVERY): counted, not
timed, so that a leader whose work went on after a pause would show it."""


# =========================================================================== a candidate
async def _candidate(args: argparse.Namespace, out: Any) -> None:
    client = redis.asyncio.Redis.from_url(args.url)
    pid = os.getpid()
    election = Election(client, args.name, ttl=args.ttl, identity=f"c{args.index}:{pid}")
    write = client.register_script(FENCED_WRITE)
    next_in_line = client.register_script(NEXT_IN_LINE)
    last_in_line = client.register_script(LAST_IN_LINE)
    line_keys = [election.key + ":queue", election.key + ":waiters", election.key + ":ids"]
    keys = [f"{args.name}:highest", f"{args.name}:fenced", election.key]
    rng = random.Random(f"{args.seed}:{args.index}:{pid}")

    def record(event: str, fencing_token: int, **fields: Any) -> None:
        """One line of the log: `fencing_token` is the term's it is about (0 for none)."""
        line = {"ev": event, "i": args.index, "pid": pid, "t": time.monotonic()}
        out.write(json.dumps({**line, "fencing_token": fencing_token, **fields}) + "\n")

    def on_event(event: LockEvent) -> None:
        if event.kind is EventKind.ACQUIRED:  # how the term was taken: tries, time waited
            record("acquired", event.fencing_token or 0, attempts=event.attempts, wait=event.wait)

    add_listener(on_event)
    watch = asyncio.create_task(_watch_stalls(record))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    async for term in election.campaign():
        token = term.fencing_token
        record("won", token, since=term.since)
        try:
            async with term:
                last = rng.randint(*HOLD)
                seq = 0
                while True:
                    seq += 1
                    record("try", token, seq=seq)  # (its outcome may never come: a loss)
                    accepted, late = await write(keys=keys, args=[token, f"c{args.index}", seq])
                    record("write", token, seq=seq, accepted=int(accepted), late=int(late))
                    if seq >= last:
                        break
                    await asyncio.sleep(WRITE_EVERY)
                if not await _transferred(
                    args, rng, term, last_in_line=last_in_line, line_keys=line_keys, record=record
                ):
                    head = await next_in_line(keys=line_keys[:2])
                    record("resign", token, next=int(head))
                    await term.resign()
        except LeaseLostError as exc:
            record("lost", token, reason=str(exc.reason))
    watch.cancel()


async def _transferred(
    args: argparse.Namespace,
    rng: random.Random,
    term: Term,
    *,
    last_in_line: Any,
    line_keys: list[str],
    record: Any,
) -> bool:
    """With probability `--transfer`, hand the term to the last candidate in line: whether
    it was handed (logged as a resignation naming that candidate's pid)."""
    if rng.random() >= args.transfer:
        return False
    pid, identity = await last_in_line(keys=line_keys)
    if not int(pid):
        return False
    record("resign", term.fencing_token, next=int(pid), named=int(pid))
    try:
        await term.transfer(identity.decode())
    except ConfigError:  # it left the line meanwhile: the term is kept
        record("named-gone", term.fencing_token)
        return False
    return True


async def _watch_stalls(record: Any) -> None:
    """Log each time this process's event loop ran more than STALL later than asked (the
    process was not scheduled: a loaded machine), as a "stalled" event from `since`."""
    while True:
        asked = time.monotonic() + STALL_TICK
        await asyncio.sleep(STALL_TICK)
        if time.monotonic() - asked > STALL:
            record("stalled", 0, since=asked)


# =========================================================================== the run
@dataclass(frozen=True, slots=True)
class TortureConfig:
    seconds: float = 60.0
    candidates: int = 3
    ttl: float = 1.0
    seed: int = 1
    kill_bound: float = 0.2
    """A takeover after a kill or a pause must come within ttl + this, seconds."""
    resign_bound: float = 0.05
    """The 99th percentile of the takeovers after a resignation must be within this."""
    fault_every: tuple[float, float] = (1.0, 2.0)
    kinds: tuple[str, ...] = ()
    """Faults to inject in this order, round and round (default: chosen at random)."""
    transfer: float = 0.0
    """The probability that a leader hands its term to a named successor (the last in line)
    rather than resigning."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str  # "kill-leader", "pause-leader", "kill-other", "pause-other"
    index: int
    pid: int
    fencing_token: int  # the fencing token of the term the leader held (0: another candidate)
    start: float
    resumed: float
    """When the fault stopped acting: just before SIGCONT was sent (a pause), or the time
    of `end` (a kill). The resumed process may run, and log, before its sender goes on to
    read the clock for `end`: its events from `resumed` on are after it resumed."""
    end: float


@dataclass
class Report:
    config: TortureConfig
    counts: Counter[str] = field(default_factory=Counter)
    takeovers: dict[str, list[float]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def figures(self, kind: str) -> dict[str, float | int | None]:
        values = sorted(self.takeovers.get(kind, []))
        return {
            "count": len(values),
            "p50": _percentile(values, 50),
            "p99": _percentile(values, 99),
            "max": values[-1] if values else None,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "counts": dict(sorted(self.counts.items())),
            "takeovers_ms": {
                kind: {
                    k: None if v is None else round(v * 1000, 1) if k != "count" else v
                    for k, v in self.figures(kind).items()
                }
                for kind in sorted(self.takeovers)
            },
            "violations": self.violations,
            "ok": self.ok,
        }

    def summary(self) -> str:
        verdict = "OK" if self.ok else "FAILED"
        head = f"election torture, {self.config.seconds:g}s, {self.config.candidates} candidates"
        lines = [f"{head}, ttl {self.config.ttl:g}s: {verdict}"]
        lines += [f"  {key}: {value}" for key, value in sorted(self.counts.items())]
        for kind in sorted(self.takeovers):
            f = self.figures(kind)
            if f["count"]:
                slowest = ", ".join(_ms(v) for v in sorted(self.takeovers[kind])[-3:][::-1])
                lines.append(
                    f"  takeover after {kind}: n={f['count']}, p50 {_ms(f['p50'])}, "
                    f"p99 {_ms(f['p99'])}, max {_ms(f['max'])} (slowest: {slowest})"
                )
        lines += [f"  VIOLATION: {violation}" for violation in self.violations]
        return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def _percentile(values: Sequence[float], percent: float) -> float | None:
    """Nearest rank."""
    if not values:
        return None
    return values[max(math.ceil(percent / 100 * len(values)), 1) - 1]


class _Candidates:
    """The candidate processes, restarted after a kill; every one ended on the way out."""

    def __init__(self, url: str, name: str, config: TortureConfig, directory: Path) -> None:
        self.url, self.name, self.config, self.directory = url, name, config, directory
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        self.log = directory / "candidates.jsonl"
        self._stderr = open(directory / "candidates.stderr", "ab")  # noqa: SIM115 - closed in stop()

    async def start(self, index: int) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.election_torture",
            "--candidate",
            "--url",
            self.url,
            "--name",
            self.name,
            "--index",
            str(index),
            "--ttl",
            str(self.config.ttl),
            "--seed",
            str(self.config.seed),
            "--log",
            str(self.log),
            "--transfer",
            str(self.config.transfer),
            cwd=ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._stderr,
        )
        self.processes[index] = process
        assert process.stdout is not None
        async with asyncio.timeout(30):
            line = await process.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"candidate {index} did not start: {line!r}")

    def index_of(self, pid: int) -> int | None:
        return next((i for i, p in self.processes.items() if p.pid == pid), None)

    async def stop(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)
                process.kill()
        for process in self.processes.values():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await process.wait()
            transport = getattr(process, "_transport", None)
            if transport is not None:
                transport.close()
        self._stderr.close()


def _pid_of(leader: Leader | None) -> int | None:
    if leader is None:
        return None
    _, _, pid = leader.identity.partition(":")
    return int(pid) if pid.isdigit() else None


async def _nemesis(
    election: Election, candidates: _Candidates, config: TortureConfig, until: float
) -> list[Fault]:
    rng = random.Random(f"nemesis:{config.seed}")
    faults: list[Fault] = []
    kinds = itertools.cycle(config.kinds) if config.kinds else None
    while time.monotonic() < until:
        await asyncio.sleep(rng.uniform(*config.fault_every))
        if time.monotonic() >= until:
            break
        if kinds is not None:
            kind = next(kinds)
        else:
            kind = rng.choice(["kill-leader", "pause-leader", "kill-other", "pause-other"])
        leader = await election.leader()
        patience = time.monotonic() + 3 * config.ttl
        while leader is None and time.monotonic() < patience:  # a hand-over under way
            await asyncio.sleep(0.01)
            leader = await election.leader()
        pid = _pid_of(leader)
        index = None if pid is None else candidates.index_of(pid)
        if kind.endswith("other") or index is None:
            others = [i for i in candidates.processes if i != index]
            index, token = rng.choice(others), 0
            kind = kind.replace("leader", "other")
        else:
            assert leader is not None
            token = leader.fencing_token
        process = candidates.processes[index]
        start = time.monotonic()
        if kind.startswith("kill"):
            process.kill()
            await process.wait()
            await asyncio.sleep(0.3)
            end = time.monotonic()
            faults.append(Fault(kind, index, process.pid, token, start, end, end))
            await candidates.start(index)
        else:
            length = rng.uniform(config.ttl + 0.5, config.ttl + 1.5)
            process.send_signal(signal.SIGSTOP)
            await asyncio.sleep(length)
            resumed = time.monotonic()
            process.send_signal(signal.SIGCONT)
            faults.append(Fault(kind, index, process.pid, token, start, resumed, time.monotonic()))
    return faults


async def _observe(election: Election, seen: list[tuple[float, int | None]]) -> None:
    async for leader in election.observe():
        seen.append((time.monotonic(), None if leader is None else leader.fencing_token))  # noqa: PERF401 - as they come


async def run(config: TortureConfig) -> Report:
    """Run the torture on a server of its own, and check what happened."""
    from aiolock.testing import RedisServer, find_binaries

    name = f"torture:{uuid.uuid4().hex[:8]}"
    server = RedisServer(find_binaries()[0]).start()
    try:
        with tempfile.TemporaryDirectory(prefix="election-torture-") as directory:
            client = redis.asyncio.Redis.from_url(server.url)
            candidates = _Candidates(server.url, name, config, Path(directory))
            seen: list[tuple[float, int | None]] = []
            observer = asyncio.create_task(_observe(Election(client, name), seen))
            try:
                for index in range(config.candidates):
                    await candidates.start(index)
                until = time.monotonic() + config.seconds
                faults = await _nemesis(Election(client, name), candidates, config, until)
                await asyncio.sleep(max(until - time.monotonic(), 0) + config.ttl)
            finally:
                await candidates.stop()
                observer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await observer
            lines = await client.lrange(f"{name}:fenced", 0, -1)
            fenced = [
                (line.decode() if isinstance(line, bytes) else line).split() for line in lines
            ]
            logged: list[Any] = await client.xrange(Election(client, name).key + ":log") or []
            await client.aclose()
            events = [json.loads(line) for line in candidates.log.read_text().splitlines()]
    finally:
        server.stop()
    won_in_log = [
        int(entry_id.decode().split("-")[0])
        for entry_id, fields in logged
        if fields.get(b"e") == b"won"
    ]
    return check(
        config, events=events, faults=faults, fenced=fenced, seen=seen, won_in_log=won_in_log
    )


def check(
    config: TortureConfig,
    *,
    events: list[dict[str, Any]],
    faults: list[Fault],
    fenced: list[list[str]],
    seen: list[tuple[float, int | None]],
    won_in_log: list[int],
) -> Report:
    report = Report(config)
    counts = report.counts
    violations = report.violations
    events.sort(key=lambda event: event["t"])
    # The fenced log.
    highest = 0
    for token_text, accepted, late, writer, seq in fenced:
        token = int(token_text)
        counts["writes"] += 1
        counts["writes accepted" if accepted == "1" else "writes refused"] += 1
        if late == "1":
            counts["late writes"] += 1
            counts["late writes refused" if accepted == "0" else "late writes ACCEPTED"] += 1
            if accepted == "1":
                violations.append(
                    f"late write with fencing token {token} by {writer} (#{seq}) accepted"
                )
        if accepted == "1":
            if token < highest:
                violations.append(f"fencing token {token} accepted after fencing token {highest}")
            highest = max(highest, token)
    # Terms won: a higher fencing token is never announced before a lower one, by the
    # server's clock (a candidate that stalls between its win and its log line logs it late).
    won = [event for event in events if event["ev"] == "won"]
    counts["terms won"] = len(won)
    by_token = sorted(won, key=lambda event: event["fencing_token"])
    for earlier, later in itertools.pairwise(by_token):
        if later["fencing_token"] == earlier["fencing_token"]:
            violations.append(f"fencing token {later['fencing_token']} won twice")
        elif later.get("since", math.inf) < earlier.get("since", -math.inf):
            violations.append(
                f"fencing token {later['fencing_token']} was announced (server clock) before "
                f"fencing token {earlier['fencing_token']}"
            )
    counts["resignations"] = sum(event["ev"] == "resign" for event in events)
    counts["terms lost"] = sum(event["ev"] == "lost" for event in events)
    # Faults, and what the leaders did.

    def leading(fault: Fault) -> int | None:
        """The fencing token of the term the fault's target led when the fault began (None:
        it did not lead)."""
        mine = [e for e in events if e["pid"] == fault.pid and e["t"] < fault.start]
        wins = [e for e in mine if e["ev"] == "won"]
        if not wins:
            return None
        token = int(wins[-1]["fencing_token"])
        ended = any(e["ev"] in ("resign", "lost") and e["fencing_token"] == token for e in mine)
        return None if ended else token

    takeovers: dict[str, list[float]] = {"kill": [], "pause": [], "resign": []}
    for fault in faults:
        led = leading(fault)
        if led is None:
            counts[f"{fault.kind.split('-')[0]} of a candidate not leading"] += 1
            continue
        kind, token = fault.kind.split("-")[0], led
        counts[f"{kind} of the leader"] += 1
        taken = _next_won(won, fault.start, token)
        if taken is None:
            violations.append(f"{kind} of the leader (fencing token {token}): nobody took over")
            continue
        delay = taken["t"] - fault.start
        takeovers[kind].append(delay)
        stalled = _late_after_fault(config, events, fault, taken)
        if stalled is not None:
            violations.append(
                f"{kind} of the leader (fencing token {token}): taken over after "
                f"{delay * 1000:.0f} ms"
                + (f" ({stalled * 1000:.0f} ms of it stalled)" if stalled else "")
            )
        if kind == "pause":
            after = [
                e
                for e in events
                if e["pid"] == fault.pid and e["fencing_token"] == token and e["t"] >= fault.resumed
            ]
            writes = [e for e in after if e["ev"] == "try"]
            counts["writes attempted by paused leaders after resuming"] += len(writes)
            if not any(e["ev"] == "lost" for e in after):
                violations.append(
                    f"the paused leader (fencing token {token}): no loss after resuming"
                )
            elif len(writes) > 1:
                # One write may be under way when the loss cancels the work; no more.
                violations.append(
                    f"the paused leader (fencing token {token}) went on writing after resuming "
                    f"({len(writes)} writes)"
                )
            else:
                counts["paused leaders that found their term lost on resuming"] += 1

    report.takeovers = takeovers
    _check_resignations(config, events, faults, won, report)
    # The observer.
    observed = [token for _, token in seen if token is not None]
    counts["changes observed"] = len(seen)
    if observed != sorted(set(observed)):
        violations.append(
            "the observer saw a term again, or an older term after a newer one (by their "
            "fencing tokens)"
        )
    missed = [token for token in won_in_log if token not in set(observed)]
    if missed:
        violations.append(f"the observer missed {len(missed)} term(s), fencing tokens {missed[:5]}")
    return report


def _check_transfer(
    event: dict[str, Any], taken: dict[str, Any], faults: list[Fault], report: Report
) -> None:
    """A transfer (`event`) hands the term to the candidate named, unless that candidate
    was killed before the next term (`taken`) was won (its entry stays in line: the grant
    to it lapses), or paused meanwhile, or the leader was killed or paused meanwhile."""
    named, start, end = event["named"], event["t"], taken["t"]
    report.counts["transfers"] += 1
    disrupted = any(
        (f.pid == named and f.start <= end and (f.kind.startswith("kill") or f.end >= start))
        or (f.pid == event["pid"] and start <= f.start <= end)
        for f in faults
    )
    if taken["pid"] == named:
        report.counts["transfers won by the one named"] += 1
    elif disrupted:
        report.counts["transfers cut short by a kill or pause"] += 1
    else:
        report.violations.append(
            f"transfer of fencing token {event['fencing_token']} to pid {named}: pid "
            f"{taken['pid']} won the next term"
        )


def _check_resignations(
    config: TortureConfig,
    events: list[dict[str, Any]],
    faults: list[Fault],
    won: list[dict[str, Any]],
    report: Report,
) -> None:
    """Time each takeover after a resignation, and check their p99 against the bound.

    A candidate killed or paused may be first in line when a leader resigns (a killed one's
    entry lives until the holder's key would expire, plus GRACE_MS): the term is granted to
    it, and the grant lapses. Such takeovers (the leader logs who was first in line as it
    resigns) are timed apart. So are those that a stall of the processes involved (the
    resigning leader, the one first in line, the winner), as they measured it themselves,
    accounts for: with the stalled time taken out, within the bound.
    """

    def faulty(pid: int, at: float) -> bool:
        return any(
            f.pid == pid and f.start <= at and (f.kind.startswith("kill") or at <= f.end)
            for f in faults
        )

    def cut_short(pid: int, start: float, end: float) -> Fault | None:
        """The kill or pause of `pid` that began between its resignation and the takeover:
        its release may not have reached Redis (the term then ends when its key expires)."""
        return next((f for f in faults if f.pid == pid and start <= f.start <= end), None)

    report.counts["stalls of a candidate over 50 ms"] = sum(e["ev"] == "stalled" for e in events)
    takeovers = report.takeovers
    timed: list[tuple[float, dict[str, Any], dict[str, Any]]] = []
    takeovers["resign to a killed or paused candidate"] = []
    takeovers["resign while a candidate stalled"] = []
    takeovers["resign cut short by a kill or pause"] = []
    lost_terms = {(e["pid"], e["fencing_token"]) for e in events if e["ev"] == "lost"}
    kept = {(e["pid"], e["fencing_token"]) for e in events if e["ev"] == "named-gone"}
    report.counts["transfers refused (the one named had left the line)"] = len(kept)
    for event in events:
        if event["ev"] != "resign" or (event["pid"], event["fencing_token"]) in lost_terms:
            continue  # (a resignation that found the term lost hands nothing over)
        if "named" in event and (event["pid"], event["fencing_token"]) in kept:
            continue  # (a transfer refused: the term was kept, and resigned after)
        taken = _next_won(won, event["t"], event["fencing_token"])
        if taken is None:
            continue
        if "named" in event:
            _check_transfer(event, taken, faults, report)
        delay = taken["t"] - event["t"]
        involved = {event["pid"], event.get("next", 0), taken["pid"]}
        stalled = _stalled(events, involved, event["t"], taken["t"])
        fault = cut_short(event["pid"], event["t"], taken["t"])
        if fault is not None:
            # Judged as a takeover after a kill or a pause of the leader (less the winner's
            # own stalls), from the fault on.
            takeovers["resign cut short by a kill or pause"].append(delay)
            if _late_after_fault(config, events, fault, taken) is not None:
                report.violations.append(
                    f"resignation (fencing token {event['fencing_token']}) cut short by a "
                    f"{fault.kind.split('-')[0]} of its leader: taken over after "
                    f"{(taken['t'] - fault.start) * 1000:.0f} ms"
                )
        elif faulty(event.get("next", 0), event["t"]):
            takeovers["resign to a killed or paused candidate"].append(delay)
        elif stalled > 0 and delay - stalled <= config.resign_bound:
            takeovers["resign while a candidate stalled"].append(delay)
        else:
            takeovers["resign"].append(delay)
            timed.append((delay, event, taken))
    resign_p99 = _percentile(sorted(takeovers["resign"]), 99)
    if resign_p99 is not None and resign_p99 > config.resign_bound:
        delay, event, taken = max(timed, key=lambda each: each[0])
        acquired = next(
            (
                e
                for e in events
                if e["ev"] == "acquired" and e["fencing_token"] == taken["fencing_token"]
            ),
            {},
        )
        report.violations.append(
            f"takeover after a resignation: p99 {resign_p99 * 1000:.1f} ms (the slowest: "
            f"fencing token {event['fencing_token']} resigned by pid {event['pid']}, pid "
            f"{event.get('next')} first in line, fencing token {taken['fencing_token']} won by "
            f"pid {taken['pid']} after "
            f"{delay * 1000:.1f} ms, in {acquired.get('attempts')} attempt(s))"
        )


def _late_after_fault(
    config: TortureConfig, events: list[dict[str, Any]], fault: Fault, taken: dict[str, Any]
) -> float | None:
    """If the term `taken` was won later than ttl + kill_bound after `fault` began, less
    what the winner's own stalls in between account for (as it measured them): how long
    the winner stalled meanwhile; else None."""
    stalled = _stalled(events, {taken["pid"]}, fault.start, taken["t"])
    if taken["t"] - fault.start - stalled > config.ttl + config.kill_bound:
        return stalled
    return None


def _next_won(won: list[dict[str, Any]], after: float, fencing_token: int) -> dict[str, Any] | None:
    """The first term with a fencing token above `fencing_token` logged as won at or after
    `after`, if any."""
    return next((e for e in won if e["t"] >= after and e["fencing_token"] > fencing_token), None)


def _stalled(events: list[dict[str, Any]], pids: set[int], start: float, end: float) -> float:
    """How much of [start, end] the processes `pids` spent stalled, as they logged it."""
    stalls = [(e["since"], e["t"]) for e in events if e["ev"] == "stalled" and e["pid"] in pids]
    return _overlap(stalls, start, end)


def _overlap(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """How much of [start, end] the union of `intervals` covers."""
    covered, reach = 0.0, start
    for since, until in sorted(intervals):
        low, high = max(since, reach), min(until, end)
        if high > low:
            covered += high - low
            reach = high
    return covered


# =========================================================================== command line
def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.election_torture")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--faults",
        default="",
        help="faults in this order, round and round: kill-leader, pause-leader, kill-other, "
        "pause-other, comma-separated (default: at random)",
    )
    parser.add_argument(
        "--transfer",
        type=float,
        default=0.0,
        help="probability that a leader hands its term to the last candidate in line "
        "(Term.transfer) instead of resigning (default 0)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--candidate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.candidate:
        with open(args.log, "a", buffering=1, encoding="utf-8") as out:  # one line per write
            asyncio.run(_candidate(args, out))
        return 0
    config = TortureConfig(
        seconds=args.seconds,
        candidates=args.candidates,
        ttl=args.ttl,
        seed=args.seed,
        kinds=tuple(kind for kind in args.faults.split(",") if kind),
        transfer=args.transfer,
    )
    report = asyncio.run(run(config))
    sys.stdout.write(
        (json.dumps(report.to_dict(), indent=2) if args.json else report.summary()) + "\n"
    )
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
