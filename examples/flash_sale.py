"""A flash sale: 200 concurrent buyers, 100 units, one unit per customer, no oversell.

    python examples/flash_sale.py

Two rules, two tools:

- "never sell more than the stock" is one step: an atomic decrement that refuses to go
  below zero (a Lua script). No lock needed, and no lock could make a non-atomic
  read-then-write of the stock safe against a holder that lost its lock.
- "one unit per customer" spans several steps (has this customer bought? take the
  payment, reserve a unit, record the purchase): a lock per customer keeps a customer's
  double-clicks from both passing the check. A lock per customer, not one for the whole
  sale, so customers do not wait for each other.
"""

from __future__ import annotations

import asyncio
import random
import secrets

import redis.asyncio
from _server import check, redis_url

from aiolock import AcquireTimeoutError, BackendError, Lock

STOCK = 100
CUSTOMERS = 120
BUYERS = 200  # some customers click more than once

TAKE_ONE = """
-- KEYS[1] stock. Returns 1 and takes a unit if one is left, else 0 (never below zero).
if tonumber(redis.call('GET', KEYS[1]) or '0') > 0 then
  redis.call('DECR', KEYS[1])
  return 1
end
return 0
"""


async def buy(db: redis.asyncio.Redis, sale: str, customer: int) -> str:
    for _ in range(5):
        try:
            async with Lock(db, f"{sale}:customer:{customer}", ttl=5, timeout=0):
                return await checkout(db, sale, customer)
        except AcquireTimeoutError:
            return "busy"  # the same customer's other click is being handled
        except BackendError:
            # No answer in time (a single try gives Redis a second, waiting for a pooled
            # connection included): the request failed, and the customer's page tries
            # again. A checkout that ran is found by its "already bought" check.
            continue
    return "unavailable"


async def checkout(db: redis.asyncio.Redis, sale: str, customer: int) -> str:
    """The steps one customer's lock protects."""
    if await db.sismember(f"{sale}:buyers", str(customer)):
        return "already bought"
    await asyncio.sleep(random.uniform(0, 0.02))  # take the payment
    if not await db.eval(TAKE_ONE, 1, f"{sale}:stock"):
        return "sold out"  # (and refund the payment)
    await db.sadd(f"{sale}:buyers", str(customer))
    await db.rpush(f"{sale}:sold", str(customer))
    return "bought"


async def main() -> None:
    sale = f"sale-{secrets.token_hex(4)}"
    async with redis_url() as url:
        # 200 buyers at once: a pool that makes callers wait for a free connection
        # (the default pool raises "Too many connections" beyond its size instead).
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url, max_connections=50, decode_responses=True
        )
        db = redis.asyncio.Redis(connection_pool=pool)
        try:
            await db.set(f"{sale}:stock", STOCK)
            customers = [i % CUSTOMERS for i in range(BUYERS)]
            random.shuffle(customers)
            outcomes = await asyncio.gather(*(buy(db, sale, c) for c in customers))
            sold = await db.lrange(f"{sale}:sold", 0, -1)
            stock = int(await db.get(f"{sale}:stock") or 0)
        finally:
            await db.aclose()
            await pool.aclose()
    counts = {outcome: outcomes.count(outcome) for outcome in sorted(set(outcomes))}
    print(f"{BUYERS} buyers ({CUSTOMERS} customers) for {STOCK} units: {counts}")
    print(f"sold {len(sold)}, stock left {stock}")
    check(len(sold) == STOCK and stock == 0, "sold exactly the stock, none oversold")
    check(len(set(sold)) == len(sold), "no customer bought twice")


if __name__ == "__main__":
    asyncio.run(main())
