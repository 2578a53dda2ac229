"""The floor of a hand-off between two processes: a token passed back and forth through one
Redis, raw, beside aiolock's own hand-off of one lock, all in one run.

    python benchmarks/floor.py                        # a throwaway server; about 30 s
    python benchmarks/floor.py --rounds 200 --url redis://127.0.0.1:PORT
    python benchmarks/floor.py --variants pubsub-asyncio-confirmed,aiolock   # and the floor

Run by `benchmarks/run.py` as the scenario `handoff-floor` (through `bench.py`), so that
its figures come from the same run, server and interpreter as every other scenario's.

Two processes (this one and a peer it starts) hand a token to each other, `--rounds` times
each way:

- pubsub-asyncio: PUBLISH on the other's channel, read by its `redis.asyncio` pub/sub;
- pubsub-asyncio-busy: the same while both event loops are busy: a task on each works
  0.1 ms every 1 ms (a timer always armed, and a message may come in mid-work);
- pubsub-asyncio-confirmed: the same, the taker writing one command (a PEXPIRE, as a
  lease's renewal) before it has the token: the floor of a hand-off whose taker proves
  itself alive to the server before its work starts, as aiolock's grantee does (its
  first renewal, written before `acquire()` returns);
- pubsub-blocking: the same with redis-py's blocking client (a blocking socket read);
- blpop-asyncio, blpop-blocking: LPUSH on the other's list, taken by its BLPOP;
- blpop-blocking-claimed: the same, the taker having the token only once one more
  command's reply came (a SET NX PX): a waiter woken by a signal list that then takes the
  lock itself, as python-redis-lock's does;
- aiolock, aiolock-busy: one `aiolock.Lock` taken in turn: each process acquires, holds
  the lock until the other waits for it (read with `Lock.info()`, untimed), releases, and
  acquires again; the waiter idle or busy as above.

A hand-off is timed from the moment the giver starts giving (before its PUBLISH, LPUSH or
`release()` call) to the moment the taker's code has the token (its read returned, its
`acquire()` returned), on the machine's monotonic clock, which both processes share. For
aiolock only the acquisitions that followed a release by the other process count (told
apart by fencing token: each acquisition takes a greater one). Reported: p50 and p99 per
hand-off in µs, and each as a multiple of the raw asyncio pub/sub floor's p50; for aiolock
also when, within the hand-off, the taker's listener dispatched the message that told it
(before: the release's round trip and the message; after: the taker's client work).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import redis
import redis.asyncio

VARIANTS = (
    "pubsub-asyncio",
    "pubsub-asyncio-busy",
    "pubsub-asyncio-confirmed",
    "pubsub-blocking",
    "blpop-asyncio",
    "blpop-blocking",
    "blpop-blocking-claimed",
    "aiolock",
    "aiolock-busy",
)
BUSY_EVERY, BUSY_WORK = 0.001, 0.0001
"""A busy loop: a task works (spins) 0.1 ms every 1 ms beside the hand-offs."""
FLOOR = "pubsub-asyncio"
"""The variant every other is read against."""

Records = dict[str, dict[str, float]]
"""One side's records: "sent" and "got" (the round, or fencing token, as text, to the
monotonic time); aiolock's also "heard" (its listener's messages, in order)."""


def now() -> float:
    return time.perf_counter()  # CLOCK_MONOTONIC: one clock for every process of the machine


# --------------------------------------------------------------------------- the raw ways
async def pubsub_asyncio(
    url: str, key: str, rounds: int, first: bool, ready: Callable[[], None]
) -> Records:
    return await _pubsub_asyncio(url, key, rounds, first, ready, confirmed=False)


async def pubsub_asyncio_confirmed(
    url: str, key: str, rounds: int, first: bool, ready: Callable[[], None]
) -> Records:
    return await _pubsub_asyncio(url, key, rounds, first, ready, confirmed=True)


async def _pubsub_asyncio(
    url: str,
    key: str,
    rounds: int,
    first: bool,
    ready: Callable[[], None],
    *,
    confirmed: bool,
) -> Records:
    """With `confirmed`, the taker writes one command (a PEXPIRE of a key of its own, as a
    lease's renewal) on a connection of its own before it has the token, and reads its
    reply only once it gives the token back: what a hand-off costs that must prove the
    taker alive to the server before its work starts."""
    client = redis.asyncio.Redis.from_url(url)
    pubsub = client.pubsub()
    mine, theirs = (f"{key}:a", f"{key}:b") if first else (f"{key}:b", f"{key}:a")
    sent: dict[str, float] = {}
    got: dict[str, float] = {}
    connection = await client.connection_pool.get_connection() if confirmed else None
    unread = 0
    try:
        await pubsub.subscribe(mine)
        while (await pubsub.get_message(timeout=1.0)) is None:
            pass  # the subscription's confirmation
        ready()

        async def take() -> str:
            nonlocal unread
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
                if message is not None:
                    text = message["data"].decode()
                    if connection is not None:
                        await connection.send_command("PEXPIRE", mine, 10_000)
                        unread += 1
                    got[text] = now()
                    return text

        for round_ in range(rounds):
            if not first:
                await take()
            while connection is not None and unread:
                await connection.read_response()
                unread -= 1
            sent[str(round_)] = now()
            await client.publish(theirs, str(round_))
            if first:
                await take()
    finally:
        if connection is not None:
            await connection.disconnect()
        await pubsub.aclose()
        await client.aclose()
    return {"sent": sent, "got": got}


def pubsub_blocking(
    url: str, key: str, rounds: int, first: bool, ready: Callable[[], None]
) -> Records:
    client = redis.Redis.from_url(url)
    pubsub = client.pubsub()
    mine, theirs = (f"{key}:a", f"{key}:b") if first else (f"{key}:b", f"{key}:a")
    sent: dict[str, float] = {}
    got: dict[str, float] = {}
    try:
        pubsub.subscribe(mine)
        while pubsub.get_message(timeout=1.0) is None:
            pass  # the subscription's confirmation
        ready()
        messages = pubsub.listen()

        def take() -> None:
            for message in messages:
                if message["type"] == "message":
                    got[message["data"].decode()] = now()
                    return

        for round_ in range(rounds):
            if not first:
                take()
            sent[str(round_)] = now()
            client.publish(theirs, str(round_))
            if first:
                take()
    finally:
        pubsub.close()
        client.close()
    return {"sent": sent, "got": got}


async def blpop_asyncio(
    url: str, key: str, rounds: int, first: bool, ready: Callable[[], None]
) -> Records:
    client = redis.asyncio.Redis.from_url(url)
    mine, theirs = (f"{key}:a", f"{key}:b") if first else (f"{key}:b", f"{key}:a")
    sent: dict[str, float] = {}
    got: dict[str, float] = {}
    try:
        await client.ping()
        ready()
        for round_ in range(rounds):
            if not first:
                _, value = await client.blpop([mine], timeout=0)
                got[value.decode()] = now()
            sent[str(round_)] = now()
            await client.lpush(theirs, str(round_))
            if first:
                _, value = await client.blpop([mine], timeout=0)
                got[value.decode()] = now()
    finally:
        await client.aclose()
    return {"sent": sent, "got": got}


def blpop_blocking(
    url: str, key: str, rounds: int, first: bool, ready: Callable[[], None]
) -> Records:
    return _blpop_blocking(url, key, rounds, first, ready, claimed=False)


def blpop_blocking_claimed(
    url: str, key: str, rounds: int, first: bool, ready: Callable[[], None]
) -> Records:
    return _blpop_blocking(url, key, rounds, first, ready, claimed=True)


def _blpop_blocking(
    url: str,
    key: str,
    rounds: int,
    first: bool,
    ready: Callable[[], None],
    *,
    claimed: bool,
) -> Records:
    """With `claimed`, the taker, woken by its BLPOP, has the token only once one more
    command's reply came (a SET NX PX of a key of its own): the shape of a hand-off by a
    signal list, the waiter woken and then taking the lock itself (python-redis-lock's)."""
    client = redis.Redis.from_url(url)
    mine, theirs = (f"{key}:a", f"{key}:b") if first else (f"{key}:b", f"{key}:a")
    sent: dict[str, float] = {}
    got: dict[str, float] = {}

    def take() -> None:
        reply = client.blpop([mine], timeout=0)
        assert reply is not None
        if claimed:
            client.set(f"{mine}:claim", reply[1], nx=True, px=10_000)
        got[reply[1].decode()] = now()
        if claimed:
            client.delete(f"{mine}:claim")  # (once the token is had: not timed)

    try:
        client.ping()
        ready()
        for round_ in range(rounds):
            if not first:
                take()
            sent[str(round_)] = now()
            client.lpush(theirs, str(round_))
            if first:
                take()
    finally:
        client.close()
    return {"sent": sent, "got": got}


# --------------------------------------------------------------------------- aiolock
async def aiolock_turns(
    url: str, key: str, rounds: int, first: bool, ready: Callable[[], None]
) -> Records:
    """Acquire, release, acquire again: "got" by fencing token when acquired, "sent" by
    fencing token when its release was called."""
    from aiolock import Lock
    from aiolock._engine.notifier import Notifier

    client = redis.asyncio.Redis.from_url(url)
    lock = Lock(client, key, ttl=10)
    sent: dict[str, float] = {}
    got: dict[str, float] = {}
    heard: dict[str, float] = {}  # when the listener dispatched each message it read
    dispatch = Notifier._dispatch

    def heard_then_dispatch(self: Notifier, message: dict[str, Any]) -> None:
        if message["type"] == "message":
            heard[str(len(heard))] = now()
        dispatch(self, message)

    Notifier._dispatch = heard_then_dispatch  # type: ignore[method-assign]
    try:
        async with Lock(client, f"{key}:warm-up", ttl=10):
            pass  # scripts loaded, connections open
        ready()
        for round_ in range(rounds):
            lease = await lock.acquire()
            token = str(lease.fencing_token)
            got[token] = now()
            if round_ < rounds - 1:
                await other_waiting(lock)
            sent[token] = now()
            await lease.release()
    finally:
        Notifier._dispatch = dispatch  # type: ignore[method-assign]
        await client.aclose()
    return {"sent": sent, "got": got, "heard": heard}


async def other_waiting(lock: Any, bound: float = 1.0) -> None:
    """Hold `lock` until the other process waits for it (at most `bound` seconds: it may
    have made its last round), so that the release is a hand-off."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(bound):
            while True:
                info = await lock.info()
                if info is not None and info.waiting:
                    return
                await asyncio.sleep(0.0002)


Side = Callable[[str, str, int, bool, Callable[[], None]], Any]
SIDES: dict[str, tuple[Side, bool]] = {  # the side's function, busy or not
    "pubsub-asyncio": (pubsub_asyncio, False),
    "pubsub-asyncio-busy": (pubsub_asyncio, True),
    "pubsub-asyncio-confirmed": (pubsub_asyncio_confirmed, False),
    "pubsub-blocking": (pubsub_blocking, False),
    "blpop-asyncio": (blpop_asyncio, False),
    "blpop-blocking": (blpop_blocking, False),
    "blpop-blocking-claimed": (blpop_blocking_claimed, False),
    "aiolock": (aiolock_turns, False),
    "aiolock-busy": (aiolock_turns, True),
}


async def run_side(
    variant: str, url: str, key: str, rounds: int, *, first: bool, ready: Callable[[], None]
) -> Records:
    """One process's side of `variant`; with a busy loop if the variant says so."""
    side, busy = SIDES[variant]
    if not asyncio.iscoroutinefunction(side):
        records: Records = side(url, key, rounds, first, ready)
        return records

    async def spin() -> None:
        while True:
            await asyncio.sleep(BUSY_EVERY)
            started = now()
            while now() - started < BUSY_WORK:
                pass

    spinner = asyncio.create_task(spin()) if busy else None
    try:
        coro: Coroutine[Any, Any, Records] = side(url, key, rounds, first, ready)
        return await coro
    finally:
        if spinner is not None:
            spinner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await spinner


# --------------------------------------------------------------------------- the peer
class Peer:
    """The other process: told a variant per line on its stdin, it says "ready" once set
    up, starts on "go", and answers with its records as one JSON line."""

    def __init__(self, url: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--peer", "--url", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def read(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the peer ended (status {self.process.wait(timeout=30)})")
        return line.strip()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send("")
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def peer_main(url: str) -> None:
    for line in sys.stdin:
        if not line.strip():
            return
        variant, key, rounds = line.split()
        go = False

        def ready() -> None:
            nonlocal go
            print("ready", flush=True)
            go = sys.stdin.readline().strip() == "go"
            if not go:
                raise RuntimeError("not told to go")

        records = await run_side(variant, url, key, int(rounds), first=False, ready=ready)
        print(json.dumps(records), flush=True)


# --------------------------------------------------------------------------- measuring
def heard_within(a: Records, b: Records) -> list[tuple[float, float]]:
    """aiolock's hand-offs, in the order they were made: how long after the release was
    called the taker's listener dispatched the message that told it, and how long after
    that its `acquire()` returned (the taker's client work and its loop's turns), seconds."""
    made: list[tuple[float, float, float]] = []
    turns = sorted(
        (int(token), side, got, records["sent"][token])
        for side, records in enumerate((a, b))
        for token, got in records["got"].items()
    )
    for (_, giver, _, sent), (_, taker, got, _) in itertools.pairwise(turns):
        told = [at for at in (a, b)[taker]["heard"].values() if sent <= at <= got]
        if giver != taker and told:
            made.append((sent, min(told) - sent, got - min(told)))
    return [(heard, taken) for _, heard, taken in sorted(made)]


def gaps(a: Records, b: Records, variant: str) -> list[float]:
    """Every hand-off's time, seconds, in the order they were made: from a "sent" of one
    side to the matching "got" of the other."""
    made: list[tuple[float, float]] = []
    if SIDES[variant][0] is aiolock_turns:
        # Fencing tokens grow with each acquisition: in their order, an acquisition by the
        # other side than the one before was a hand-off from that one's release.
        turns = sorted(
            (int(token), side, got, records["sent"][token])
            for side, records in enumerate((a, b))
            for token, got in records["got"].items()
        )
        for (_, giver, _, sent), (_, taker, got, _) in itertools.pairwise(turns):
            if giver != taker:
                made.append((sent, got - sent))
    else:
        for gave, took in ((a, b), (b, a)):
            for mark, given_at in gave["sent"].items():
                taken_at = took["got"].get(mark)
                if taken_at is not None:
                    made.append((given_at, taken_at - given_at))
    return [gap for _, gap in sorted(made)]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


async def measure_variant(
    peer: Peer, variant: str, url: str, rounds: int
) -> tuple[list[float], list[tuple[float, float]]]:
    key = f"bench:floor:{uuid.uuid4().hex[:8]}"
    peer.send(f"{variant} {key} {rounds}")
    if peer.read() != "ready":
        raise RuntimeError("the peer did not get ready")

    def ready() -> None:
        peer.send("go")

    mine = await run_side(variant, url, key, rounds, first=True, ready=ready)
    theirs: Records = json.loads(peer.read())
    told = heard_within(mine, theirs) if SIDES[variant][0] is aiolock_turns else []
    return gaps(mine, theirs, variant), told


async def measure(
    url: str, rounds: int, warm: int = 0, variants: tuple[str, ...] = VARIANTS
) -> dict[str, Any]:
    """Each of `variants` (the floor's always), one after another with one peer: p50/p99
    per hand-off (µs), how many hand-offs were timed, and each p50 and p99 over the floor's
    p50. The first `warm` rounds of each variant are not timed (default: a tenth, at least
    5)."""
    warm = warm or max(rounds // 10, 5)
    variants = (FLOOR, *(v for v in variants if v != FLOOR))
    peer = Peer(url)
    out: dict[str, Any] = {}
    try:
        for variant in variants:
            made, told = await measure_variant(peer, variant, url, rounds + warm)
            timed = made[min(2 * warm, len(made) // 2) :]
            if not timed:
                raise RuntimeError(f"{variant}: no hand-off was made")
            label = variant.replace("-", "_")
            told = told[min(2 * warm, len(told) // 2) :]
            if told:
                out[f"{label}_heard_p50_us"] = percentile([h for h, _ in told], 50) * 1e6
                out[f"{label}_taken_p50_us"] = percentile([t for _, t in told], 50) * 1e6
            out[f"{label}_p50_us"] = percentile(timed, 50) * 1e6
            out[f"{label}_p99_us"] = percentile(timed, 99) * 1e6
            out[f"{label}_handoffs"] = len(timed)
    finally:
        peer.close()
    floor = out[f"{FLOOR.replace('-', '_')}_p50_us"]
    for variant in variants:
        label = variant.replace("-", "_")
        out[f"{label}_p50_x"] = out[f"{label}_p50_us"] / floor
        out[f"{label}_p99_x"] = out[f"{label}_p99_us"] / floor
    return out


def table(results: dict[str, Any]) -> str:
    lines = [
        "| hand-off | p50 µs | p99 µs | p50 / floor | p99 / floor | timed |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for variant in VARIANTS:
        label = variant.replace("-", "_")
        if label + "_p50_us" not in results:
            continue
        lines.append(
            f"| {variant} | {results[label + '_p50_us']:.0f} | {results[label + '_p99_us']:.0f} "
            f"| {results[label + '_p50_x']:.2f} | {results[label + '_p99_x']:.2f} "
            f"| {results[label + '_handoffs']:g} |"
        )
    for variant in VARIANTS:
        label = variant.replace("-", "_")
        if f"{label}_heard_p50_us" in results:
            lines.append(
                f"\n{variant}: the taker's listener dispatched the release's message "
                f"{results[label + '_heard_p50_us']:.0f} µs (p50) after the release was "
                f"called; its `acquire()` returned {results[label + '_taken_p50_us']:.0f} µs "
                "(p50) after that."
            )
    return "\n".join(lines)


@contextlib.contextmanager
def server_url(url: str) -> Iterator[str]:
    """`url`, or a throwaway server's."""
    if url:
        yield url
        return
    from aiolock.testing import RedisServer, find_binaries

    server = RedisServer(find_binaries()[0]).start()
    try:
        yield server.url
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2000, help="hand-offs timed each way")
    parser.add_argument("--url", default="", help="use this server instead of starting one")
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated subset (the floor, {FLOOR}, always runs)",
    )
    parser.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        asyncio.run(peer_main(args.url))
        return
    with server_url(args.url) as url:
        chosen = tuple(v for v in args.variants.split(",") if v)
        unknown = sorted(set(chosen) - set(VARIANTS))
        if unknown:
            parser.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
        results = asyncio.run(measure(url, args.rounds, variants=chosen))
    print(json.dumps(results, indent=1) if args.json else table(results))


if __name__ == "__main__":
    main()
