"""Readers share, a writer is alone: a catalog read by many, updated now and then.

    python examples/catalog.py

Twenty readers in two processes read a two-key catalog over and over under the read side
of one `ReadWriteLock`; a writer updates both keys under the write side. No reader ever
sees a half-written catalog (the two keys always match), readers overlap each other, and
the writer gets in during the stream of readers (a waiting writer stops new readers).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import secrets
import time

import redis.asyncio
from _server import check, redis_url

from aiolock import ReadWriteLock

READERS = 10  # per process
READER_PROCESSES = 2
UPDATES = 5


async def reader(db: redis.asyncio.Redis, run: str, until: float) -> None:
    """Read until the writer is done (or, should it never be, until `until`)."""
    catalog = ReadWriteLock(db, f"{run}:catalog", ttl=10)
    while time.monotonic() < until and not await db.exists(f"{run}:done"):
        async with catalog.read():
            inside = await db.incr(f"{run}:readers-inside")
            await db.eval(
                "if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[1]) or '0') then "
                "redis.call('SET', KEYS[1], ARGV[1]) end",
                1, f"{run}:most-readers", str(inside),
            )  # fmt: skip
            items, prices = await db.mget(f"{run}:items", f"{run}:prices")
            if items != prices:
                await db.incr(f"{run}:torn-reads")
            await asyncio.sleep(0.005)
            await db.decr(f"{run}:readers-inside")


async def writer(db: redis.asyncio.Redis, run: str) -> list[float]:
    catalog = ReadWriteLock(db, f"{run}:catalog", ttl=10)
    waits = []
    for version in range(1, UPDATES + 1):
        asked = time.monotonic()
        async with catalog.write() as lease:
            waits.append(time.monotonic() - asked)
            await db.set(f"{run}:items", version)
            await asyncio.sleep(0.01)  # half written: readers must not see this
            await db.set(f"{run}:prices", version)
            await db.set(f"{run}:fence", lease.fencing_token)
        await asyncio.sleep(0.05)
    return waits


def start_readers(url: str, run: str, until: float) -> None:
    async def main() -> None:
        db = redis.asyncio.Redis.from_url(url)
        try:
            await asyncio.gather(*(reader(db, run, until) for _ in range(READERS)))
        finally:
            await db.aclose()

    asyncio.run(main())


async def main() -> None:
    run = f"catalog-{secrets.token_hex(4)}"
    async with redis_url() as url:
        db = redis.asyncio.Redis.from_url(url, decode_responses=True)
        await db.mset({f"{run}:items": 0, f"{run}:prices": 0})
        until = time.monotonic() + 60.0  # the readers stop once the writer is done
        context = multiprocessing.get_context("spawn")
        processes = [
            context.Process(target=start_readers, args=(url, run, until))
            for _ in range(READER_PROCESSES)
        ]
        for process in processes:
            process.start()
        # The readers are other processes: their progress is watched in Redis (they may
        # take a while to start on a busy machine).
        overlapping = time.monotonic() + 30.0
        while int(await db.get(f"{run}:most-readers") or 0) < 2:
            if time.monotonic() > overlapping:
                break  # reported below
            await asyncio.sleep(0.01)
        waits = await writer(db, run)
        await db.set(f"{run}:done", 1)
        for process in processes:
            await asyncio.to_thread(process.join, 60)
        torn = int(await db.get(f"{run}:torn-reads") or 0)
        most = int(await db.get(f"{run}:most-readers") or 0)
        await db.aclose()
    print(f"{UPDATES} updates, longest wait of the writer {max(waits):.3f}s; "
          f"up to {most} readers at once; {torn} torn reads")  # fmt: skip
    check(all(p.exitcode == 0 for p in processes), "every reader process finished")
    check(torn == 0, "no reader saw a half-written catalog")
    check(most >= 2, "readers overlapped")
    check(max(waits) < 2.0, "the writer got in during the stream of readers")


if __name__ == "__main__":
    asyncio.run(main())
