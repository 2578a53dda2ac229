"""A double-clicked "Place order", sent to two instances of the app at once, fixed.

    pip install "aiolock-redis[fastapi]" httpx
    python examples/fastapi_orders.py

Two instances of one FastAPI app (two processes behind a load balancer, here two app
objects with clients of their own) share Redis. The handler checks that the cart has no
order yet, then takes the payment and writes the order: between the check and the write,
the second click's request passes the same check. With `locked_request` the second click
gets 409 (with Retry-After) while the first one runs, and one order is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator

import httpx
import redis.asyncio
from _server import check, redis_url
from fastapi import FastAPI, HTTPException

from aiolock import Lease
from aiolock.fastapi import locked_request


def create_app(url: str, *, prefix: str = "shop", use_lock: bool = True) -> FastAPI:
    """One instance of the shop's API."""
    clients: dict[str, redis.asyncio.Redis] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        clients["redis"] = redis.asyncio.Redis.from_url(url, decode_responses=True)
        yield
        await clients["redis"].aclose()

    app = FastAPI(lifespan=lifespan)
    lock = locked_request(f"{prefix}:carts:{{cart_id}}", client=lambda: clients["redis"], ttl=10)

    async def place_order(cart_id: str, fencing_token: int) -> dict[str, str | int]:
        db = clients["redis"]
        if await db.hget(f"{prefix}:carts:{cart_id}", "order"):
            raise HTTPException(status_code=409, detail="this cart is already ordered")
        await asyncio.sleep(0.2)  # take the payment: the slow part
        order_id = f"order-{await db.incr(f'{prefix}:order-ids')}"
        await db.rpush(f"{prefix}:orders", order_id)
        await db.hset(f"{prefix}:carts:{cart_id}", "order", order_id)
        return {"order": order_id, "fencing_token": fencing_token}

    if use_lock:

        @app.post("/carts/{cart_id}/place")
        async def place(cart_id: str, lease: Lease = lock) -> dict[str, str | int]:
            return await place_order(cart_id, lease.fencing_token)

    else:

        @app.post("/carts/{cart_id}/place")
        async def place_unlocked(cart_id: str) -> dict[str, str | int]:
            return await place_order(cart_id, 0)

    return app


async def double_click(url: str, *, use_lock: bool) -> tuple[list[int], int]:
    """Two clicks on one cart, one to each instance; the statuses and the orders made."""
    prefix = f"shop-{secrets.token_hex(4)}"
    apps = [create_app(url, prefix=prefix, use_lock=use_lock) for _ in range(2)]
    async with contextlib.AsyncExitStack() as stack:
        browsers = []
        for app in apps:
            await stack.enter_async_context(app.router.lifespan_context(app))
            transport = httpx.ASGITransport(app=app)
            browser = httpx.AsyncClient(transport=transport, base_url="http://shop")
            browsers.append(await stack.enter_async_context(browser))
        clicks = await asyncio.gather(*(b.post("/carts/c42/place") for b in browsers))
        for click in clicks:
            retry = click.headers.get("retry-after")
            print(
                f"  {click.status_code} {click.json()}"
                + (f" Retry-After: {retry}" if retry else "")
            )
        db = redis.asyncio.Redis.from_url(url)
        orders = await db.llen(f"{prefix}:orders")
        await db.aclose()
    return sorted(click.status_code for click in clicks), orders


async def main() -> None:
    async with redis_url() as url:
        print("without a lock, two clicks on two instances:")
        _, orders = await double_click(url, use_lock=False)
        print(f"  -> {orders} orders for one cart")
        print("with locked_request:")
        statuses, orders = await double_click(url, use_lock=True)
        print(f"  -> {orders} order for one cart")
    check(orders == 1 and statuses == [200, 409], "one order; the second click got 409")


if __name__ == "__main__":
    asyncio.run(main())
