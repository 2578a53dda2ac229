"""What one connection shared by every task of a process (its calls written together, their
replies read together) would save over a connection per call, for many tasks on names of
their own, beside aiolock in the same run.

    python benchmarks/multiplex_floor.py                     # a throwaway server; about 1 min
    python benchmarks/multiplex_floor.py --tasks 64 --seconds 3 --rounds 3 --url redis://...

Every variant runs `--tasks` tasks, each taking and giving back a name of its own in a
loop: a script that sets the name if free (SET NX PX) and a script that deletes it if it
still holds the caller's token (GET, DEL), as a minimal lock would. Variants:

- pool: redis-py's asyncio client, a connection of its pool per call (`evalsha`);
- multiplexed: one connection for all the tasks: each call's command is added to a buffer
  written once per pass of the event loop, and its reply is taken, in order, from what one
  read brought (hiredis parses it); nothing else (no timeouts, no reconnection);
- aiolock: `aiolock.Lock` made per cycle, acquired and released, on the same client.

Reported per variant: cycles per second and the client's CPU time per cycle (the process's
user and system time), the median over `--rounds` rounds taken in turn, and each as a
multiple of the pool's. The multiplexed row is a floor, not a client: it shows what the
per-call send, read and pool checkout cost, which no lock written on a pool can avoid.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import hiredis
import redis.asyncio
from floor import server_url

import aiolock

ACQUIRE = "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])"
RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


def _pack(*args: str | bytes) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode() if isinstance(arg, str) else arg
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class Multiplexed(asyncio.Protocol):
    """One connection whose calls are written together once per pass and whose replies are
    handed out in order."""

    def __init__(self) -> None:
        self._reader = hiredis.Reader()
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._out: list[bytes] = []
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            future = self._waiting.popleft()
            if not future.done():
                future.set_result(reply)

    def _flush(self) -> None:
        assert self._transport is not None
        self._transport.write(b"".join(self._out))
        self._out.clear()

    def call(self, command: bytes) -> asyncio.Future[Any]:
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(command)
        future = self._loop.create_future()
        self._waiting.append(future)
        return future


async def _cycles(tasks: int, seconds: float, cycle: Callable[[int], Awaitable[None]]) -> int:
    done = 0
    stop = False

    async def task(i: int) -> None:
        nonlocal done
        while not stop:
            await cycle(i)
            done += 1

    running = [asyncio.create_task(task(i)) for i in range(tasks)]
    await asyncio.sleep(seconds)
    stop = True
    await asyncio.gather(*running)
    return done


async def _measure(
    tasks: int, seconds: float, cycle: Callable[[int], Awaitable[None]]
) -> tuple[float, float]:
    await _cycles(tasks, 0.3, cycle)  # warm up
    cpu, wall = time.process_time(), time.perf_counter()
    done = await _cycles(tasks, seconds, cycle)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return done / wall, cpu / done * 1e6


async def measure(url: str, tasks: int, seconds: float, rounds: int) -> dict[str, Any]:
    client = redis.asyncio.Redis.from_url(url, max_connections=tasks + 8)
    acquire_sha = await client.script_load(ACQUIRE)
    release_sha = await client.script_load(RELEASE)
    prefix = f"mux:{secrets.token_hex(4)}:"
    names = [f"{prefix}{i}" for i in range(tasks)]
    host, port = (
        client.connection_pool.connection_kwargs["host"],
        client.connection_pool.connection_kwargs["port"],
    )
    loop = asyncio.get_running_loop()
    _, mux = await loop.create_connection(Multiplexed, host, port)

    async def pool(i: int) -> None:
        token = secrets.token_hex(16)
        assert await client.evalsha(acquire_sha, 1, names[i], token, 10_000)
        await client.evalsha(release_sha, 1, names[i], token)

    async def multiplexed(i: int) -> None:
        token = secrets.token_hex(16)
        reply = await mux.call(_pack("EVALSHA", acquire_sha, "1", names[i], token, "10000"))
        assert reply == b"OK", reply
        await mux.call(_pack("EVALSHA", release_sha, "1", names[i], token))

    async def lock(i: int) -> None:
        lease = await aiolock.Lock(client, names[i], ttl=10).acquire()
        await lease.release()

    variants: dict[str, Callable[[int], Awaitable[None]]] = {
        "pool": pool, "multiplexed": multiplexed, "aiolock": lock
    }  # fmt: skip
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    try:
        for _ in range(rounds):
            for name, cycle in variants.items():
                figures[name].append(await _measure(tasks, seconds, cycle))
    finally:
        await client.aclose()
    results: dict[str, Any] = {}
    for name, runs in figures.items():
        rate = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        results[name] = {"cycles_per_s": rate, "client_cpu_us_per_cycle": cpu}
    base = results["pool"]
    for row in results.values():
        row["rate_vs_pool"] = row["cycles_per_s"] / base["cycles_per_s"]
        row["cpu_vs_pool"] = row["client_cpu_us_per_cycle"] / base["client_cpu_us_per_cycle"]
    return results


def table(results: dict[str, Any], tasks: int) -> str:
    lines = [
        f"{tasks} tasks on names of their own",
        "",
        "| variant | cycles/s | ÷ pool | client CPU µs/cycle | ÷ pool |",
        "|---|---|---|---|---|",
    ]
    for name, row in results.items():
        lines.append(
            f"| {name} | {row['cycles_per_s']:,.0f} | {row['rate_vs_pool']:.2f} "
            f"| {row['client_cpu_us_per_cycle']:.1f} | {row['cpu_vs_pool']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0, help="each variant, each round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", default="", help="use this server instead of starting one")
    args = parser.parse_args()
    with server_url(args.url) as url:
        results = asyncio.run(measure(url, args.tasks, args.seconds, args.rounds))
    print(table(results, args.tasks))


if __name__ == "__main__":
    main()
