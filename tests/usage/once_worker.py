"""One "server" of the run-once tests, as a process of its own.

`python -m tests.usage.once_worker --url URL --job KEY --log LIST` runs the job KEY with
`run_once`: the job appends this process's pid to the Redis list LIST (after a short
pause, so a later server may find it running). Prints the status as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

import redis.asyncio

from aiolock import run_once


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    client = redis.asyncio.Redis.from_url(args.url)
    try:

        async def job() -> int:
            await client.rpush(args.log, os.getpid())
            await asyncio.sleep(0.1)
            return os.getpid()

        result = await run_once(client, args.job, job, retention=60, ttl=5)
        sys.stdout.write(json.dumps({"status": result.status.value, "pid": os.getpid()}) + "\n")
    finally:
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
