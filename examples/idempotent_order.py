"""An order endpoint with an idempotency key: a retry after a timeout makes no second order.

    python examples/idempotent_order.py

The client sends "place order" with an Idempotency-Key, gives up waiting after 0.2 s
(the server is slow: 0.5 s), and retries with the same key while the first request is
still being handled. The server holds a lock on the key while it works and stores the
response under the key before releasing: the retry waits for the lock, finds the stored
response, and returns it. The lock alone would not do (the retry would run again once the
first finished), nor would the stored response alone (the retry arrives before it exists).
"""

from __future__ import annotations

import asyncio
import json
import secrets

import redis.asyncio
from _server import check, redis_url

from aiolock import Lock


async def place_order(db: redis.asyncio.Redis, idempotency_key: str, cart: str) -> dict[str, str]:
    """The server's handler."""
    async with Lock(db, f"idempotency:{idempotency_key}", ttl=10, timeout=5):
        stored = await db.get(f"idempotency:{idempotency_key}:response")
        if stored is None:
            await asyncio.sleep(0.5)  # the slow part: payment, stock, ...
            order_id = f"order-{secrets.token_hex(3)}"
            await db.rpush(f"orders:{idempotency_key}", order_id)
            stored = json.dumps({"order": order_id, "cart": cart})
            # Stored before the lock is released, so no retry can miss it. Keep it as long
            # as clients may retry (a day here).
            await db.set(f"idempotency:{idempotency_key}:response", stored, ex=86400)
        response: dict[str, str] = json.loads(stored)
    return response


async def main() -> None:
    key = secrets.token_hex(8)  # made by the client, once per order it means to place
    async with redis_url() as url:
        db = redis.asyncio.Redis.from_url(url, decode_responses=True)
        try:
            # Each request is handled by the server whether or not the client waits for it.
            first = asyncio.create_task(place_order(db, key, "cart-7"))
            try:
                await asyncio.wait_for(asyncio.shield(first), timeout=0.2)
            except TimeoutError:
                print("client: no answer after 0.2 s, retrying with the same key")
            retried = await place_order(db, key, "cart-7")
            original = await first
            again = await place_order(db, key, "cart-7")  # a later retry
            orders = await db.lrange(f"orders:{key}", 0, -1)
        finally:
            await db.aclose()
    print(f"first request: {original}\nretry: {retried}\nlater retry: {again}")
    print(f"orders made: {orders}")
    check(len(orders) == 1, "one order for one idempotency key")
    check(original == retried == again, "every retry got the first request's response")


if __name__ == "__main__":
    asyncio.run(main())
