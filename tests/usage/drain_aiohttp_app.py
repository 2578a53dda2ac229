"""An aiohttp app under `web.run_app`, for the drain tests: `python -m
tests.usage.drain_aiohttp_app` with REDIS_URL set. It places orders under `locked_handler`,
each waiting for its payment's confirmation (as `examples/web_shutdown.py`), installs
`release_on_signals(drain=GRACE)` at startup (the runner's SIGTERM handler is in place
then), and writes the port it listens on to stderr."""

from __future__ import annotations

import os
import socket
import sys

import redis.asyncio
from aiohttp import web

from aiolock import Lease, release_on_signals
from aiolock.aiohttp import locked_handler

GRACE = 3.0
REDIS = web.AppKey("redis", redis.asyncio.Redis)


@locked_handler(REDIS, "orders:{order_id}", ttl=30)
async def place(request: web.Request, lease: Lease) -> web.Response:
    client = request.app[REDIS]
    order_id = request.match_info["order_id"]
    await client.rpush("placing", order_id)
    await client.blpop([f"payment:{order_id}"], timeout=0)
    return web.json_response({"order": int(order_id), "fence": lease.fencing_token})


async def on_startup(app: web.Application) -> None:
    # As the example's: BLPOP waits for the payment without redis-py's 5 s read bound.
    app[REDIS] = redis.asyncio.Redis.from_url(os.environ["REDIS_URL"], socket_timeout=None)
    release_on_signals(drain=GRACE)


async def on_cleanup(app: web.Application) -> None:
    await app[REDIS].aclose()


def main() -> None:
    app = web.Application()
    app.router.add_post("/orders/{order_id}/place", place)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sys.stderr.write(f"running on http://127.0.0.1:{sock.getsockname()[1]}\n")
    sys.stderr.flush()
    web.run_app(app, sock=sock, shutdown_timeout=GRACE, print=None)


if __name__ == "__main__":
    main()
