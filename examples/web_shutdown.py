"""A rolling deploy of a FastAPI app under uvicorn: SIGTERM drains, locks are released.

    pip install "aiolock-redis[fastapi]" uvicorn httpx
    python examples/web_shutdown.py

The app places orders under `locked_request`; placing one waits for its payment's
confirmation. `release_on_signals(drain=GRACE)` in the lifespan, with uvicorn's
`--timeout-graceful-shutdown GRACE`: on SIGTERM uvicorn drains as it would without it (it
stops accepting, and a request in flight that ends in time is answered as usual, 200);
an order whose payment never comes is stopped just before the grace period ends, its
lock released, and answered 503 with Retry-After (never 500), so the load balancer sends
the retry to another instance, which can take the lock at once.

Without `drain`, the locks would be released at once by cancelling every request that
holds one (500s, and uvicorn's drain skipped); without `release_on_signals`, the stopped
order's lock would stay taken for its ttl.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import redis.asyncio
from _server import check, redis_url
from fastapi import FastAPI

from aiolock import Lease, Lock, release_on_signals
from aiolock.fastapi import locked_request

GRACE = 3
"""uvicorn's --timeout-graceful-shutdown, and the `drain` given to aiolock."""
HERE = Path(__file__).resolve().parent


def create_app() -> FastAPI:
    """The shop's API on the Redis at REDIS_URL (`uvicorn --factory web_shutdown:create_app`)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # No read bound of redis-py's own (5 s by default since redis-py 8): a handler waits
        # on BLPOP for the payment's confirmation for as long as it takes; the lock's calls
        # are bounded by aiolock.
        app.state.redis = redis.asyncio.Redis.from_url(os.environ["REDIS_URL"], socket_timeout=None)
        release_on_signals(drain=GRACE)  # uvicorn's signal handler is in place now
        try:
            yield
        finally:
            await app.state.redis.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/orders/{order_id}/place")
    async def place(
        order_id: int,
        lease: Lease = locked_request(lambda: app.state.redis, "orders:{order_id}", ttl=30),
    ) -> dict[str, int]:
        client: redis.asyncio.Redis = app.state.redis
        await client.rpush("placing", order_id)
        await client.blpop([f"payment:{order_id}"], timeout=0)  # the payment's confirmation
        return {"order": order_id, "fence": lease.fencing_token}

    return app


async def _lines(stream: asyncio.StreamReader, seen: list[str], event: asyncio.Event) -> None:
    while line := await stream.readline():
        seen.append(line.decode(errors="replace"))
        event.set()


async def _logged(seen: list[str], event: asyncio.Event, pattern: str) -> re.Match[str]:
    """The first line uvicorn logged that matches `pattern` (waited for, 30 s at most)."""
    try:
        async with asyncio.timeout(30):
            while True:
                for line in seen:
                    if found := re.search(pattern, line):
                        return found
                event.clear()
                await event.wait()
    except TimeoutError:
        raise TimeoutError(
            f"uvicorn did not log {pattern!r}; it logged:\n{''.join(seen)}"
        ) from None


async def main() -> None:
    async with redis_url() as url:
        client = redis.asyncio.Redis.from_url(url)
        server = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "uvicorn", "--factory", "web_shutdown:create_app",
            "--app-dir", str(HERE), "--host", "127.0.0.1", "--port", "0",
            "--timeout-graceful-shutdown", str(GRACE),
            env={**os.environ, "REDIS_URL": url}, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert server.stderr is not None
        seen: list[str] = []
        logged = asyncio.Event()
        reader = asyncio.create_task(_lines(server.stderr, seen, logged))
        try:
            port = (await _logged(seen, logged, r"running on http://127.0.0.1:(\d+)")).group(1)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as web:
                paid = asyncio.create_task(web.post("/orders/1/place"))
                unpaid = asyncio.create_task(web.post("/orders/2/place"))
                for _ in range(2):  # both handlers hold their order's lock
                    assert await client.blpop(["placing"], timeout=30) is not None
                signalled = time.monotonic()
                server.send_signal(signal.SIGTERM)  # the deploy replaces this instance
                await _logged(seen, logged, r"Shutting down")
                await client.rpush("payment:1", "ok")  # confirmed during the drain
                first, second = await paid, await unpaid
            async with asyncio.timeout(30):
                await server.wait()
            took = time.monotonic() - signalled
            free = not await Lock(client, "orders:2").locked()
        finally:
            if server.returncode is None:
                server.kill()
                await server.wait()
            await reader
            await client.aclose()
    print(f"order 1 (paid during the drain): {first.status_code} {first.json()}")
    print(
        f"order 2 (never paid): {second.status_code}, Retry-After {second.headers.get('retry-after')}"
    )
    print(f"uvicorn exited {took:.1f}s after SIGTERM (grace {GRACE:g}s), code {server.returncode}")
    check(first.status_code == 200, "the request that ended during the drain was answered 200")
    check(
        second.status_code == 503 and second.headers.get("retry-after") == "1",
        "the request still running at the end of the grace period got 503 with Retry-After",
    )
    check(free, "its lock was released, not left for its ttl")
    check(took < 30, "uvicorn ended after its drain, not at the lock's ttl")


if __name__ == "__main__":
    asyncio.run(main())
