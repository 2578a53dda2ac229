"""Tonight's report, started by cron on three servers, sent once.

    python examples/cron_once.py

Three servers start the same nightly job, each 0.4 s after the one before has finished
with it (their clocks, and start-up times, differ). A lock alone would run it three times:
each server finds the lock free when it starts. `run_once` writes a done marker under the
lock when the job finishes, keyed by the night, and the servers after the first find it.
"""

from __future__ import annotations

import asyncio
import datetime
import secrets

import redis.asyncio
from _server import check, redis_url

from aiolock import Lease, OnceStatus, run_once


async def server(
    url: str, number: int, sent: list[int], tag: str, after: asyncio.Event | None
) -> OnceStatus:
    if after is not None:  # the server before this one is done with tonight's job
        await after.wait()
        await asyncio.sleep(0.4)
    client = redis.asyncio.Redis.from_url(url)
    try:

        async def send_report(lease: Lease) -> None:
            await asyncio.sleep(0.1)  # build and mail the report
            sent.append(number)

        night = datetime.date.today().isoformat()
        result = await run_once(
            client,
            f"nightly-report:{night}:{tag}",
            send_report,
            retention=2 * 86400,  # longer than any spread of the servers' start times
            ttl=60,
        )
    finally:
        await client.aclose()
    print(f"server {number}: {result.status.value}")
    return result.status


async def main() -> None:
    sent: list[int] = []
    tag = secrets.token_hex(4)  # a fresh job key per run of this example
    done = [asyncio.Event() for _ in range(3)]

    async def numbered(n: int) -> OnceStatus:
        try:
            return await server(url, n, sent, tag, done[n - 1] if n else None)
        finally:
            done[n].set()

    async with redis_url() as url:
        statuses = await asyncio.gather(*(numbered(n) for n in range(3)))
    print(f"report sent by server(s) {sent}")
    check(sent == [0], "the report was sent once, by the first server")
    check(
        list(statuses) == [OnceStatus.RAN, OnceStatus.ALREADY_DONE, OnceStatus.ALREADY_DONE],
        "the later servers found it done",
    )


if __name__ == "__main__":
    asyncio.run(main())
