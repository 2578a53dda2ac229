"""At most 5 calls in flight to a rate-limited API, from 4 processes of 10 workers each.

    python examples/api_pool.py

Every worker makes its calls under a permit of one `Semaphore(limit=5)`. The "API" counts
the calls in flight (in Redis, so across processes) and records the most it ever saw; each
call also checks its permit's fencing token against the highest seen for its slot, as a
storage that rejects a holder whose permit was lost would. Waiting workers are served in
turn, without polling; every call is made, and never more than 5 at once.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import secrets

import redis.asyncio
from _server import check, redis_url

from aiolock import Semaphore

LIMIT = 5
PROCESSES = 4
WORKERS = 10
CALLS = 5  # per worker

# The API's side: calls in flight, the most seen, and a fencing check per permit slot.
ENTER = """
local now = redis.call('INCR', KEYS[1])
if now > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], now) end
local highest = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
if tonumber(ARGV[2]) < highest then return 0 end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
return 1
"""


async def call_api(db: redis.asyncio.Redis, run: str, slot: int, fence: int) -> None:
    keys = (f"{run}:in-flight", f"{run}:most", f"{run}:fences")
    accepted = await db.eval(ENTER, 3, *keys, str(slot), str(fence))
    if not accepted:
        await db.incr(f"{run}:rejected")
    await asyncio.sleep(0.05)  # the call (long enough that a loaded machine fills the limit)
    await db.decr(f"{run}:in-flight")
    await db.incr(f"{run}:calls")


async def worker(db: redis.asyncio.Redis, run: str) -> None:
    api = Semaphore(db, f"{run}:api", limit=LIMIT, ttl=10)
    for _ in range(CALLS):
        async with api as permit:
            assert permit.slot is not None
            await call_api(db, run, permit.slot, permit.fencing_token)


async def process_main(url: str, run: str) -> None:
    db = redis.asyncio.Redis.from_url(url)
    try:
        await asyncio.gather(*(worker(db, run) for _ in range(WORKERS)))
    finally:
        await db.aclose()


def start_process(url: str, run: str) -> None:
    asyncio.run(process_main(url, run))


async def main() -> None:
    run = f"api-{secrets.token_hex(4)}"
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
        calls = int(await db.get(f"{run}:calls") or 0)
        most = int(await db.get(f"{run}:most") or 0)
        rejected = int(await db.get(f"{run}:rejected") or 0)
        await db.aclose()
    print(f"{calls} calls, at most {most} in flight at once (limit {LIMIT})")
    check(all(p.exitcode == 0 for p in processes), "every process finished")
    check(calls == PROCESSES * WORKERS * CALLS, "every call was made")
    check(most == LIMIT, f"never more than {LIMIT} calls in flight, and the limit was used")
    check(rejected == 0, "no permit's fencing token was rejected")


if __name__ == "__main__":
    asyncio.run(main())
