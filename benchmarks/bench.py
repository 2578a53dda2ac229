"""One library, one scenario, one run: prints a JSON object on stdout.

Run by `benchmarks/run.py`, which starts the server, picks the interpreter that has each
library installed, repeats every run and reports medians and ratios. By hand:

    python benchmarks/bench.py --lib aiolock --scenario uncontended --url redis://127.0.0.1:PORT

Libraries (each behind the same small adapter):
    aiolock, aiolock-scripts (a lower bound for the uncontended scenarios: aiolock's scripts
    sent with plain evalsha, no client logic), aiolock-handoff (renew_on_handoff=False),
    aiolock-noop-renewal (a lower bound for the 4-process scenario: aiolock with its renewals
    running a script that does nothing), redispy (redis-py's asyncio Lock, sleep=0.1), redispy-fast (sleep=0.001),
    pottery (AIORedlock on one master), aioredlock, python-redis-lock (sync, in threads),
    redis-lock-py (asyncio, pub/sub).

Floors of the contended scenarios, not locks: token-list (a name's one token in a Redis
list, taken by BLPOP and given back by LPUSH, in asyncio) and token-list-threads (the same
with blocking sockets in threads).

At most N holders (the contended scenario; it reports the most holders seen at once):
    aiolock-sem1, aiolock-sem4, aiolock-sem16 (aiolock.Semaphore, limit 1, 4, 16), and
    nlocks4, nlocks16: the workaround without a semaphore, N aiolock.Locks named
    NAME:slot0 .. NAME:slotN-1 tried with try_acquire() in a random order, and when all are
    busy a sleep of NLOCKS_POLL (5 ms) before the next round.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import json
import os
import random
import resource
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Self

import redis
import redis.asyncio

Cycle = Callable[[str], contextlib.AbstractAsyncContextManager[Any]]


# --------------------------------------------------------------------------- adapters
class Adapter:
    """`hold(name)` is an async context manager holding the lock `name`."""

    ttl = 10.0
    renewing = False  # the leases scenario: keep every lock alive by the library's renewal
    limit = 1  # holders allowed at once

    async def open(self, url: str) -> None:
        self.url = url
        self.client = redis.asyncio.Redis.from_url(url, max_connections=512)

    async def close(self) -> None:
        await self.client.aclose()

    def hold(self, name: str) -> contextlib.AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    def messages_read(self) -> int | None:
        """Pub/sub messages this process's lock client has read so far (None: not known)."""
        return None

    async def take(self, name: str) -> tuple[Callable[[], bool], Callable[[], Any]]:
        """Acquire outside any block: (is it lost?, release)."""
        cm = self.hold(name)
        await cm.__aenter__()
        return (lambda: False), (lambda: cm.__aexit__(None, None, None))


class AiolockAdapter(Adapter):
    renew_on_handoff = True

    async def open(self, url: str) -> None:
        await super().open(url)
        from aiolock import Lock

        self.lock_class = Lock

    def hold(self, name: str) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._lock(name)

    async def take(self, name: str) -> tuple[Callable[[], bool], Callable[[], Any]]:
        lease = await self._lock(name).acquire()
        return (lambda: lease.lost), lease.release

    def _lock(self, name: str) -> Any:
        return self.lock_class(
            self.client, name, ttl=self.ttl, renew_on_handoff=self.renew_on_handoff
        )

    def messages_read(self) -> int | None:
        from aiolock._engine.runtime import runtime_for

        return runtime_for(self.client).notifier.messages_received


class AiolockHandoffAdapter(AiolockAdapter):
    """aiolock with `renew_on_handoff=False`: a lease handed over by another process's
    release starts its block without renewing it first (a trade of the stall bound right
    after a hand-off; see docs/worker-pools.md)."""

    renew_on_handoff = False


class AiolockNoopRenewalAdapter(AiolockAdapter):
    """A lower bound, not a library: aiolock whose renewals run a script that does nothing
    on the same key (answering "renewed"), sent as aiolock sends them. A lease handed over by
    another process's release still has that call written before its block, as the
    default's stall bound needs, and its answer read while the block runs; only the
    renewal's own work in Redis is gone. aiolock's distance to it is what that work costs;
    its distance to aiolock-handoff, what one more command per hand-off costs."""

    async def open(self, url: str) -> None:
        await super().open(url)
        from aiolock import Lock
        from aiolock._lua.lock import Script

        noop = Script(
            "noop-renewal", "local out = {}\nfor i = 1, #KEYS do out[i] = 1 end\nreturn out"
        )

        def renew_call(lock: Any, token: str, ttl_ms: int, permits: int = 1) -> Any:
            return noop, (lock._key,), [token, ttl_ms, lock._renewal_kind(0, permits)]

        # (a worker process runs one row: the class is changed for this process only)
        Lock._renew_call = renew_call  # type: ignore[method-assign,assignment]


class AiolockScriptsAdapter(Adapter):
    """A lower bound, not a library: aiolock's own acquire and release scripts (the calls a
    `Lock` makes when nobody waits) sent with plain `client.evalsha`, with no lease, no
    renewal, no deadline and no events. The gap between this and aiolock is what aiolock's
    client code costs; the gap between this and redis-py's lock is the scripts' server time
    (see server_time.py). Uncontended scenarios only: a refused acquire raises."""

    async def open(self, url: str) -> None:
        await super().open(url)
        from aiolock import Lock

        self.lock_class = Lock
        lock = Lock(self.client, "bench:scripts")
        for script in (lock._acquire_call("t" * 32, "", None, ())[0], lock._release_call()[0]):
            await self.client.script_load(script.source)

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        lock = self.lock_class(self.client, name, ttl=self.ttl)
        config = lock._config
        token = os.urandom(16).hex()
        script, keys, args = lock._acquire_call(token, "bench", None, ())
        reply = await self.client.evalsha(script.sha, len(keys), *keys, *args)
        granted = isinstance(reply, int)  # the fencing token; refused: a list
        if not granted:
            raise RuntimeError(f"aiolock-scripts: {name} is busy: {reply!r}")
        try:
            yield
        finally:
            script, keys, args = lock._release_call(
                token=token,
                retain_ms=config.retain_ms,
                renewed=config.renew_interval is not None,
                look_at_queue=config.serve_layout1,
            )
            status = await self.client.evalsha(script.sha, len(keys), *keys, *args)
            if status != 1:
                raise RuntimeError(f"aiolock-scripts: {name} not released: {status!r}")


class RedisPyAdapter(Adapter):
    def __init__(self, sleep: float) -> None:
        self.sleep = sleep

    def hold(self, name: str) -> contextlib.AbstractAsyncContextManager[Any]:
        return self.client.lock(name, timeout=self.ttl, sleep=self.sleep, thread_local=False)


class PotteryAdapter(Adapter):
    def hold(self, name: str) -> contextlib.AbstractAsyncContextManager[Any]:
        from pottery import AIORedlock

        return AIORedlock(key=name, masters={self.client}, auto_release_time=self.ttl)


class AioredlockAdapter(Adapter):
    async def open(self, url: str) -> None:
        await super().open(url)
        from aioredlock import Aioredlock

        parsed = redis.asyncio.connection.parse_url(url)
        self.manager = Aioredlock(
            [{"host": parsed.get("host", "127.0.0.1"), "port": parsed.get("port", 6379)}],
            retry_count=1_000_000,  # block until acquired, as the others do
            internal_lock_timeout=self.ttl,
        )

    async def close(self) -> None:
        await self.manager.destroy()
        await super().close()

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        lock = await self.manager.lock(name, lock_timeout=self.ttl)
        try:
            yield
        finally:
            await self.manager.unlock(lock)

    async def take(self, name: str) -> tuple[Callable[[], bool], Callable[[], Any]]:
        # Without a lock_timeout, aioredlock extends the lock in the background.
        lock = await self.manager.lock(name, lock_timeout=None)
        return (lambda: not lock.valid), (lambda: self.manager.unlock(lock))


class BlockingSockets(Adapter):
    """A synchronous client too, its calls made in threads of a pool of their own."""

    async def open(self, url: str) -> None:
        await super().open(url)
        self.sync = redis.Redis.from_url(url, max_connections=512)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=256)

    async def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.sync.close()
        await super().close()


class PythonRedisLockAdapter(BlockingSockets):
    """Synchronous: each acquire blocks a thread (BLPOP), as its users run it."""

    async def open(self, url: str) -> None:
        await super().open(url)
        import redis_lock

        self.module = redis_lock

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        lock = self.module.Lock(self.sync, name, expire=int(self.ttl))
        await loop.run_in_executor(self.pool, lock.acquire)
        try:
            yield
        finally:
            await loop.run_in_executor(self.pool, lock.release)


class RedisLockPyAdapter(Adapter):
    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        from redis_lock.asyncio import RedisLock

        lock = RedisLock(self.client, name, blocking_timeout=600, expire_timeout=int(self.ttl))
        await lock.acquire()
        try:
            yield
        finally:
            await lock.release()


class AiolockSemaphoreAdapter(Adapter):
    """`aiolock.Semaphore(limit=N)`, used as the lock adapters are."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    async def open(self, url: str) -> None:
        await super().open(url)
        from aiolock import Semaphore

        self.semaphore_class = Semaphore

    def hold(self, name: str) -> contextlib.AbstractAsyncContextManager[Any]:
        return self.semaphore_class(self.client, name, limit=self.limit, ttl=self.ttl)

    async def take(self, name: str) -> tuple[Callable[[], bool], Callable[[], Any]]:
        semaphore = self.semaphore_class(self.client, name, limit=self.limit, ttl=self.ttl)
        lease = await semaphore.acquire()
        return (lambda: lease.lost), lease.release


# A token's list: the least a lock can send, for the floors of the contended scenarios.
TOKEN_LIST_INIT = """
if redis.call('SET', KEYS[1] .. ':made', 1, 'NX') then redis.call('RPUSH', KEYS[1], 't') end
return 1
"""


class TokenListAdapter(Adapter):
    """A lower bound, not a lock: the name is a Redis list holding one token. To hold it, a
    BLPOP takes the token (the server wakes exactly one blocked taker, in the order they
    blocked); to give it back, an LPUSH. One command each way and nothing else: no ttl, no
    owner, no renewal, no crash safety, no notification but the pop itself. No lock that
    sends a command can hand over between processes with less. Here in asyncio (a pool
    connection per blocked task), as aiolock runs."""

    made: set[str]

    async def open(self, url: str) -> None:
        await super().open(url)
        self.made = set()

    async def _make(self, name: str) -> str:
        key = f"bench:token:{name}"
        if key not in self.made:
            await self.client.eval(TOKEN_LIST_INIT, 1, key)
            self.made.add(key)
        return key

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        key = await self._make(name)
        await self.client.blpop([key], timeout=0)
        try:
            yield
        finally:
            await self.client.lpush(key, "t")


class TokenListConfirmedAdapter(TokenListAdapter):
    """The token list with what a lease handed over needs before its block: the taker,
    woken by its BLPOP, writes one more command (a PEXPIRE of a key of its own, as a first
    renewal would be) before its block starts, and reads its answer while the block runs.
    The floor of a hand-off that a stalled taker survives."""

    async def open(self, url: str) -> None:
        await super().open(url)
        self.readers: set[asyncio.Task[None]] = set()

    async def _confirm(self, key: str) -> None:
        pool = self.client.connection_pool
        connection = await pool.get_connection()
        await connection.send_command("PEXPIRE", f"{key}:taker", 10_000)

        async def answer() -> None:
            try:
                await connection.read_response()
            finally:
                await pool.release(connection)

        task = asyncio.create_task(answer())
        self.readers.add(task)
        task.add_done_callback(self.readers.discard)

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        key = await self._make(name)
        await self.client.blpop([key], timeout=0)
        await self._confirm(key)
        try:
            yield
        finally:
            await self.client.lpush(key, "t")


class TokenListThreadsAdapter(BlockingSockets, TokenListAdapter):
    """The same token list with blocking sockets, each BLPOP and LPUSH in a thread, as
    python-redis-lock runs in this harness."""

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        key = await self._make(name)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.pool, functools.partial(self.sync.blpop, [key], 0))
        try:
            yield
        finally:
            await loop.run_in_executor(self.pool, self.sync.lpush, key, "t")


NLOCKS_POLL = 0.005  # seconds the N-locks workaround sleeps when it found every lock busy


class NLocksAdapter(Adapter):
    """What users write without a semaphore: N `aiolock.Lock`s, NAME:slot0 to slotN-1, each
    tried once (`try_acquire()`, one round trip) in a new random order; if all are busy,
    sleep NLOCKS_POLL and try them all again. The Lock objects are made once per name."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.slots: dict[str, list[Any]] = {}

    async def open(self, url: str) -> None:
        await super().open(url)
        from aiolock import Lock

        self.lock_class = Lock

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        locks = self.slots.get(name)
        if locks is None:
            locks = self.slots[name] = [
                self.lock_class(self.client, f"{name}:slot{i}", ttl=self.ttl)
                for i in range(self.limit)
            ]
        order = list(range(self.limit))
        while True:
            random.shuffle(order)
            for i in order:
                lease = await locks[i].try_acquire()
                if lease is not None:
                    break
            else:
                await asyncio.sleep(NLOCKS_POLL)
                continue
            break
        try:
            yield
        finally:
            await lease.release()


ADAPTERS: dict[str, Callable[[], Adapter]] = {
    "aiolock": AiolockAdapter,
    "aiolock-scripts": AiolockScriptsAdapter,
    "aiolock-handoff": AiolockHandoffAdapter,
    "aiolock-noop-renewal": AiolockNoopRenewalAdapter,
    "redispy": lambda: RedisPyAdapter(0.1),
    "redispy-fast": lambda: RedisPyAdapter(0.001),
    "pottery": PotteryAdapter,
    "aioredlock": AioredlockAdapter,
    "python-redis-lock": PythonRedisLockAdapter,
    "redis-lock-py": RedisLockPyAdapter,
    **{f"aiolock-sem{n}": functools.partial(AiolockSemaphoreAdapter, n) for n in (1, 4, 16)},
    **{f"nlocks{n}": functools.partial(NLocksAdapter, n) for n in (4, 16)},
    "token-list": TokenListAdapter,
    "token-list-confirmed": TokenListConfirmedAdapter,
    "token-list-threads": TokenListThreadsAdapter,
}


def limit_of(lib: str) -> int:
    """Holders allowed at once by the library `lib`."""
    return ADAPTERS[lib]().limit


# --------------------------------------------------------------------------- helpers
def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def jain(counts: list[int]) -> float:
    total = sum(counts)
    squares = sum(c * c for c in counts)
    return total * total / (len(counts) * squares) if squares else float("nan")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def server_cpu_seconds(client: redis.asyncio.Redis) -> float:
    """The server's CPU seconds so far (user and system, all its threads)."""
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class CommandCounter:
    """Counts the commands clients send, through MONITOR, which sees every client of the
    server, in any process. The commands a script runs inside the server (MONITOR tags them
    "lua") are left out: an EVALSHA counts as one, the PUBLISH it runs as none. Connection
    set-up (HELLO) and subscriptions count: clients send them. MONITOR slows the server, so
    nothing timed should run under it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.count = 0
        self.by_name: dict[str, int] = {}  # the same count, by command name
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._marker = f"bench:counted:{uuid.uuid4().hex}"
        # Connected before MONITOR starts, so that its own handshake is not counted.
        self._control = redis.asyncio.Redis.from_url(url, single_connection_client=True)

    async def __aenter__(self) -> Self:
        await self._control.ping()
        self._task = asyncio.create_task(self._run())
        ready = asyncio.ensure_future(self._ready.wait())
        await asyncio.wait({ready, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():  # MONITOR failed: raise its error
            ready.cancel()
            await self._control.aclose()
            await self._task
        return self

    async def _run(self) -> None:
        client = redis.asyncio.Redis.from_url(self.url)
        try:
            async with client.monitor() as monitor:
                self._ready.set()
                while True:
                    entry = await monitor.next_command()
                    if entry.get("client_type") == "lua":
                        continue
                    command = entry.get("command", "")
                    if self._marker in command:
                        return  # every command before the marker has been seen
                    self.count += 1
                    name = command.split(" ", 1)[0].upper()
                    self.by_name[name] = self.by_name.get(name, 0) + 1
        finally:
            await client.aclose()

    async def __aexit__(self, *exc: object) -> None:
        # MONITOR reports commands in the order the server runs them: once the marker sent
        # now comes back, nothing sent before it is still on its way.
        assert self._task is not None
        try:
            await self._control.echo(self._marker)
            await asyncio.wait_for(asyncio.shield(self._task), timeout=30)
        finally:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            await self._control.aclose()


def unique(prefix: str) -> str:
    return f"bench:{prefix}:{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- scenarios
async def floor(adapter: Adapter, args: argparse.Namespace) -> dict[str, Any]:
    """The raw round trip: PING and a trivial EVALSHA on the same server, and a PING after
    the process sat idle (the floor of the wake-up scenario)."""
    client = adapter.client
    sha = await client.script_load("return 1")
    out: dict[str, Any] = {}
    for label, call in (("ping", client.ping), ("evalsha", lambda: client.evalsha(sha, 0))):
        for _ in range(200):
            await call()
        samples = []
        for _ in range(args.iterations):
            start = time.perf_counter()
            await call()
            samples.append(time.perf_counter() - start)
        out[f"{label}_p50_us"] = percentile(samples, 50) * 1e6
    # The wake-up scenario's release comes after the process sat idle for 50 ms: on a
    # virtual machine the first round trip after idling costs more than a busy one.
    samples = []
    for _ in range(max(args.iterations // 20, 10)):
        await asyncio.sleep(0.05)
        start = time.perf_counter()
        await client.ping()
        samples.append(time.perf_counter() - start)
    out["ping_after_idle_p50_us"] = percentile(samples, 50) * 1e6
    return out


async def handoff_floor(adapter: Adapter, args: argparse.Namespace) -> dict[str, Any]:
    """A hand-off between two processes through the same server: raw (pub/sub and BLPOP,
    asyncio and blocking sockets) and aiolock's own, in one run (see `floor.py`); a
    quarter of `--iterations` rounds each way, each variant."""
    from floor import measure

    return await measure(adapter.url, rounds=max(args.iterations // 4, 10))


SERVER_CYCLES = 2000
"""Uncontended cycles over which the server's time per cycle is measured."""


async def uncontended(adapter: Adapter, args: argparse.Namespace) -> dict[str, Any]:
    """One task, acquire + release on one key, again and again."""
    name = unique("uncontended")
    for _ in range(100):
        async with adapter.hold(name):
            pass
    samples = []
    for _ in range(args.iterations):
        start = time.perf_counter()
        async with adapter.hold(name):
            pass
        samples.append(time.perf_counter() - start)
    async with CommandCounter(adapter.url) as counter:
        for _ in range(100):
            async with adapter.hold(name):
                pass
    # Server time: INFO commandstats' usec of the commands the client itself sent (those
    # the MONITOR run saw), over more cycles. A script's usec includes the commands it
    # runs; those are also listed under their own names, and are not added again (unless
    # the client also sends a command of that name itself: none of the peers does).
    sent = {command.lower() for command in counter.by_name}
    info = redis.asyncio.Redis.from_url(adapter.url)
    try:
        before = await info.info("commandstats")
        for _ in range(SERVER_CYCLES):
            async with adapter.hold(name):
                pass
        after = await info.info("commandstats")
    finally:
        await info.aclose()
    usec = sum(
        int(stats["usec"]) - int(before.get(key, {}).get("usec", 0))
        for key, stats in after.items()
        if key.removeprefix("cmdstat_") in sent
    )
    return {
        "p50_us": percentile(samples, 50) * 1e6,
        "p99_us": percentile(samples, 99) * 1e6,
        "commands_per_cycle": counter.count / 100,
        "server_us_per_cycle": usec / SERVER_CYCLES,
    }


async def distinct(adapter: Adapter, args: argparse.Namespace) -> dict[str, Any]:
    """64 tasks, each cycling on a key of its own, for the run's duration: cycles per second,
    and the CPU time per cycle of this process and of the server. The server's is its whole
    process's (INFO cpu): its loop's sleeps, wake-ups and passes included, which the
    commands' own times (commandstats) leave out."""
    stop = time.perf_counter() + args.seconds
    counts = [0] * 64

    async def task(i: int) -> None:
        name = unique(f"distinct{i}")
        while time.perf_counter() < stop:
            async with adapter.hold(name):
                pass
            counts[i] += 1

    info = redis.asyncio.Redis.from_url(adapter.url)
    try:
        server_before, client_before = await server_cpu_seconds(info), cpu_seconds()
        await asyncio.gather(*(task(i) for i in range(64)))
        client, server = cpu_seconds() - client_before, await server_cpu_seconds(info)
        server -= server_before
    finally:
        await info.aclose()
    cycles = max(sum(counts), 1)
    return {
        "cycles_per_s": sum(counts) / args.seconds,
        "client_cpu_us_per_cycle": client * 1e6 / cycles,
        "server_cpu_us_per_cycle": server * 1e6 / cycles,
    }


async def contended(adapter: Adapter, args: argparse.Namespace) -> dict[str, Any]:
    """N tasks on one key: a 1 ms critical section, a 5 ms pause between holds.

    run.py starts one or several worker processes of it on one --key, with --start-at stdin
    so that they start together, and merges their records (the monotonic clock is the
    machine's, shared by the processes).
    """
    name = args.key or unique("contended")
    if args.start_at == "stdin":  # started by run.py with other workers: wait for the word
        print("ready", file=sys.stderr, flush=True)
        start_at = float(await asyncio.to_thread(sys.stdin.readline))
    else:
        start_at = float(args.start_at) if args.start_at else time.monotonic() + 0.5
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    stop = start_at + args.seconds
    records: list[tuple[float, float, int]] = []  # (acquired, released, task)
    holders = most = 0  # holders in this process now, and the most seen at once

    async def task(i: int) -> None:
        nonlocal holders, most
        while time.monotonic() < stop:
            async with adapter.hold(name):
                holders += 1
                most = max(most, holders)
                acquired = time.monotonic()
                await asyncio.sleep(0.001)
                released = time.monotonic()
                holders -= 1
            records.append((acquired, released, i))
            await asyncio.sleep(0.005)

    cpu, messages = cpu_seconds(), adapter.messages_read()
    await asyncio.gather(*(task(i) for i in range(args.tasks)))
    out = {"records": records, "cpu_s": cpu_seconds() - cpu, "pid": os.getpid()}
    if messages is not None:  # the release messages this process read while its tasks ran
        out["messages"] = (adapter.messages_read() or 0) - messages
    out |= {"limit": adapter.limit, "max_holders_here": most}
    if most > adapter.limit:
        out["LIMIT_EXCEEDED"] = f"{most} holders at once in this process, limit {adapter.limit}"
        print(f"LIMIT EXCEEDED: {out['LIMIT_EXCEEDED']}", file=sys.stderr)
    return out


def max_holders(records: list[tuple[float, float, str]], limit: int) -> tuple[int, int]:
    """The most records held at once (across processes: the monotonic clock is the
    machine's), and how many acquisitions found `limit` or more already held. A release
    and an acquisition at the same instant do not overlap."""
    events = sorted([(a, 1) for a, _, _ in records] + [(r, -1) for _, r, _ in records])
    held = most = violations = 0
    for _, step in events:
        held += step
        most = max(most, held)
        if step > 0 and held > limit:
            violations += 1
    return most, violations


def summarize_contended(
    records: list[tuple[float, float, str]], seconds: float, limit: int = 1
) -> dict[str, Any]:
    records.sort()
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(records)]
    overlaps = sum(1 for gap in gaps if gap < 0)
    most, violations = max_holders(records, limit)
    per_task: dict[str, int] = {}
    for _, _, task in records:
        per_task[task] = per_task.get(task, 0) + 1
    counts = list(per_task.values())
    return {
        "critical_sections_per_s": len(records) / seconds,
        "handoff_gap_p50_ms": percentile(gaps, 50) * 1e3,
        "handoff_gap_p99_ms": percentile(gaps, 99) * 1e3,
        "per_task_max": max(counts) if counts else 0,
        "per_task_min": min(counts) if counts else 0,
        "jain_fairness": jain(counts),
        "overlaps": overlaps,
        "limit": limit,
        "max_holders": most,
        "limit_violations": violations,
        "critical_sections": len(records),
    }


async def wakeup(adapter: Adapter, args: argparse.Namespace) -> dict[str, Any]:
    """A waiter blocked on a held lock: time from the release to the waiter holding it."""
    count_runs = 20

    async def one(name: str) -> float:
        holder_in = asyncio.Event()
        release = asyncio.Event()
        released_at = 0.0

        async def holder() -> None:
            nonlocal released_at
            async with adapter.hold(name):
                holder_in.set()
                await release.wait()
                released_at = time.perf_counter()
            # leaving the block released the lock

        holding = asyncio.create_task(holder())
        await holder_in.wait()

        async def waiter() -> float:
            async with adapter.hold(name):
                return time.perf_counter()

        waiting = asyncio.create_task(waiter())
        await asyncio.sleep(0.05)  # the waiter is blocked by now
        release.set()
        acquired_at = await waiting
        await holding
        return acquired_at - released_at

    name = unique("wakeup")  # one hot lock, as in a service
    samples = [await one(name) for _ in range(args.iterations // 10)]
    async with CommandCounter(adapter.url) as counter:
        for _ in range(count_runs):
            await one(name)
    return {
        "p50_ms": percentile(samples, 50) * 1e3,
        "p99_ms": percentile(samples, 99) * 1e3,
        "commands_per_wakeup": counter.count / count_runs,
    }


async def leases(adapter: Adapter, args: argparse.Namespace) -> dict[str, Any]:
    """Hold N leases with renewal for the run's duration: CPU, Redis load, false losses."""
    info = redis.asyncio.Redis.from_url(adapter.url)
    taken = [
        await adapter.take(f"bench:lease:{uuid.uuid4().hex[:6]}:{i}") for i in range(args.leases)
    ]

    async def counters() -> tuple[int, int]:
        stats = await info.info("commandstats")
        scripts = sum(
            int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval")
        )
        total = (await info.info("stats"))["total_commands_processed"]
        return int(total), scripts

    total_before, calls_before = await counters()
    cpu = cpu_seconds()
    started = time.perf_counter()
    await asyncio.sleep(args.seconds)
    elapsed = time.perf_counter() - started
    cpu_used = cpu_seconds() - cpu
    total_after, calls_after = await counters()
    lost = sum(1 for is_lost, _ in taken if is_lost())
    for _, release in taken:
        with contextlib.suppress(Exception):
            await release()
    await info.aclose()
    return {
        "leases": args.leases,
        "ttl_s": adapter.ttl,
        "client_cpu_percent": 100 * cpu_used / elapsed,
        "redis_commands_per_s": (total_after - total_before) / elapsed,
        "renewal_calls_per_s": (calls_after - calls_before) / elapsed,
        "false_losses": lost,
    }


SCENARIOS = {
    "floor": floor,
    "handoff-floor": handoff_floor,
    "uncontended": uncontended,
    "distinct": distinct,
    "contended": contended,
    "wakeup": wakeup,
    "leases": leases,
}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lib", choices=sorted(ADAPTERS), required=True)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--leases", type=int, default=1000)
    parser.add_argument("--ttl", type=float, default=10.0)
    parser.add_argument("--key", default="")
    parser.add_argument(
        "--start-at",
        default="",
        help="time.monotonic() at which the contended tasks start; 'stdin': say 'ready' on "
        "stderr, then read it from stdin",
    )
    args = parser.parse_args()
    adapter = ADAPTERS[args.lib]()
    adapter.ttl = args.ttl
    adapter.renewing = args.scenario == "leases"
    await adapter.open(args.url)
    try:
        result = await SCENARIOS[args.scenario](adapter, args)
    finally:
        await adapter.close()
    json.dump({"lib": args.lib, "scenario": args.scenario, **result}, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
