"""An aiohttp counter service: 50 concurrent increments, none lost.

    pip install "aiolock-redis[aiohttp]"
    python examples/aiohttp_app.py

`POST /counters/{name}/increment` reads the counter, works a little, and writes it back:
without a lock, concurrent requests read the same value and overwrite each other's
increments. `locked_handler` with `timeout=5` makes each request wait its turn (instead
of failing fast), so every increment counts.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import aiohttp
import redis.asyncio
from _server import check, redis_url
from aiohttp import web

from aiolock import Lease
from aiolock.aiohttp import locked_handler

REDIS = web.AppKey("redis", redis.asyncio.Redis)


@locked_handler("counters:{name}", client=REDIS, ttl=5, timeout=5)
async def increment(request: web.Request, lease: Lease) -> web.Response:
    db = request.app[REDIS]
    key = f"counters:{request.match_info['name']}"
    value = int(await db.get(key) or 0)
    await asyncio.sleep(0.001)  # the work between the read and the write
    await db.set(key, value + 1)
    return web.json_response({"value": value + 1, "fencing_token": lease.fencing_token})


def create_app(url: str) -> web.Application:
    app = web.Application()
    app.router.add_post("/counters/{name}/increment", increment)

    async def redis_client(app: web.Application) -> AsyncIterator[None]:
        app[REDIS] = redis.asyncio.Redis.from_url(url)
        yield
        await app[REDIS].aclose()

    app.cleanup_ctx.append(redis_client)
    return app


async def main() -> None:
    async with redis_url() as url:
        runner = web.AppRunner(create_app(url))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        name = f"visits-{secrets.token_hex(4)}"
        try:
            async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:

                async def one() -> int:
                    async with http.post(f"/counters/{name}/increment") as response:
                        return response.status

                statuses = await asyncio.gather(*(one() for _ in range(50)))
                async with http.post(f"/counters/{name}/increment") as response:
                    final = (await response.json())["value"] - 1
        finally:
            await runner.cleanup()
    print(f"50 concurrent increments: statuses {sorted(set(statuses))}, counter {final}")
    check(final == 50 and set(statuses) == {200}, "every increment counted")


if __name__ == "__main__":
    asyncio.run(main())
