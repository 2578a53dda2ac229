"""A pool of asyncio workers in several processes, sharing jobs under locks.

    python examples/worker_pool.py

3 processes run 4 workers each over the same 40 jobs. A worker takes a job's lock
without waiting (another worker has it: move on), checks under the lock that the job is
not done yet, does it, and marks it done before releasing. Every job is done exactly once,
and the work spreads over the processes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import secrets

import redis.asyncio
from _server import check, redis_url

from aiolock import Lock

JOBS = 40
PROCESSES = 3
WORKERS = 4


async def worker(db: redis.asyncio.Redis, run: str) -> None:
    for job in range(JOBS):
        lease = await Lock(db, f"{run}:job:{job}", ttl=5).try_acquire()
        if lease is None:
            continue  # another worker has this job right now
        async with lease:
            if await db.sismember(f"{run}:done", str(job)):
                continue  # done by someone before we got the lock
            await asyncio.sleep(0.01)  # the job
            await db.hincrby(f"{run}:runs", str(job), 1)
            await db.hincrby(f"{run}:by-process", str(os.getpid()), 1)
            await db.sadd(f"{run}:done", job)  # before the release: the next holder sees it


async def process_main(url: str, run: str) -> None:
    db = redis.asyncio.Redis.from_url(url)
    try:
        await asyncio.gather(*(worker(db, run) for _ in range(WORKERS)))
    finally:
        await db.aclose()


def start_process(url: str, run: str) -> None:
    asyncio.run(process_main(url, run))


async def main() -> None:
    run = f"pool-{secrets.token_hex(4)}"
    async with redis_url() as url:
        context = multiprocessing.get_context("spawn")
        processes = [
            context.Process(target=start_process, args=(url, run)) for _ in range(PROCESSES)
        ]
        for process in processes:
            process.start()
        for process in processes:
            await asyncio.to_thread(process.join, 60)
        db = redis.asyncio.Redis.from_url(url, decode_responses=True)
        runs = await db.hgetall(f"{run}:runs")
        by_process = await db.hgetall(f"{run}:by-process")
        await db.aclose()
    print(f"{len(runs)} jobs done; jobs per process: {sorted(by_process.values())}")
    check(all(p.exitcode == 0 for p in processes), "every process finished")
    check(len(runs) == JOBS and set(runs.values()) == {"1"}, "every job done exactly once")


if __name__ == "__main__":
    asyncio.run(main())
