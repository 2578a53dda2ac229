"""A pool of asyncio workers in several processes, sharing jobs under locks.

    python examples/worker_pool.py

3 processes run 4 workers each over the same 40 jobs. A worker takes a job's lock
without waiting (another worker has it: move on), checks under the lock that the job is
not done yet, does it, and marks it done before releasing. The jobs share a resource that
takes at most 3 at once (a database, a partner's API): each job runs under a permit of one
`Semaphore(limit=3)`. Every job is done exactly once, and never more than 3 at a time
(whichever processes happen to take them).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import secrets

import redis.asyncio
from _server import check, redis_url

from aiolock import Lock, Semaphore

JOBS = 40
PROCESSES = 3
WORKERS = 4
AT_ONCE = 3


async def worker(db: redis.asyncio.Redis, run: str) -> None:
    shared = Semaphore(db, f"{run}:shared-resource", limit=AT_ONCE, ttl=5)
    for job in range(JOBS):
        lease = await Lock(db, f"{run}:job:{job}", ttl=5).try_acquire()
        if lease is None:
            continue  # another worker has this job right now
        async with lease:
            if await db.sismember(f"{run}:done", str(job)):
                continue  # done by someone before we got the lock
            async with shared:  # waits its turn for the shared resource
                running = await db.incr(f"{run}:running")
                await db.eval(MOST, 1, f"{run}:most", str(running))
                await asyncio.sleep(0.01)  # the job
                await db.decr(f"{run}:running")
            await db.hincrby(f"{run}:runs", str(job), 1)
            await db.hincrby(f"{run}:by-process", str(os.getpid()), 1)
            await db.sadd(f"{run}:done", job)  # before the release: the next holder sees it


# Keeps the most jobs seen running at once.
MOST = (
    "if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[1]) or '0') then "
    "redis.call('SET', KEYS[1], ARGV[1]) end"
)


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
        most = int(await db.get(f"{run}:most") or 0)
        await db.aclose()
    print(
        f"{len(runs)} jobs done; jobs per process: {sorted(by_process.values())}; "
        f"at most {most} at once"
    )
    check(all(p.exitcode == 0 for p in processes), "every process finished")
    check(len(runs) == JOBS and set(runs.values()) == {"1"}, "every job done exactly once")
    check(most <= AT_ONCE, f"never more than {AT_ONCE} jobs at once")


if __name__ == "__main__":
    asyncio.run(main())
