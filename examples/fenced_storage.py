"""Fencing tokens on the storage side: a zombie holder's write is rejected.

    python examples/fenced_storage.py

A lock can be lost without its holder knowing in time (a long pause, a partition), and
a new holder may be working by then. Storage that remembers the highest fencing token it
accepted can refuse the old holder's writes. Two stores:

- SQLite: `UPDATE ... SET ..., fence = :token WHERE id = :id AND fence < :token`; no row
  changed means a newer holder wrote first. (`fence < :token` admits one write per
  lease; use `fence <= :token` if a holder writes several times.)
- Redis: a Lua compare-and-set on a hash holding the value and its fence.

Holder A takes the lock and stalls (a GC pause, say) past its ttl; B takes the lock and
writes; then A wakes up and writes as if it still held the lock: both stores refuse A.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3

import redis.asyncio
from _server import check, redis_url

from aiolock import Lease, Lock

FENCED_SET = """
-- KEYS[1] hash {value, fence}; ARGV[1] fencing token, ARGV[2] new value.
-- Returns 1 if written, 0 if a write with this token or a newer one was accepted before.
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if fence >= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1])
return 1
"""


def sql_write(db: sqlite3.Connection, balance: int, lease: Lease) -> bool:
    cursor = db.execute(
        "UPDATE accounts SET balance = :balance, fence = :token WHERE id = 1 AND fence < :token",
        {"balance": balance, "token": lease.fencing_token},
    )
    db.commit()
    return cursor.rowcount == 1


async def redis_write(client: redis.asyncio.Redis, key: str, value: str, lease: Lease) -> bool:
    return bool(await client.eval(FENCED_SET, 1, key, lease.fencing_token, value))


async def main() -> None:
    sql = sqlite3.connect(":memory:")
    sql.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER, fence INTEGER)")
    sql.execute("INSERT INTO accounts VALUES (1, 100, 0)")
    name = f"accounts:1:{secrets.token_hex(4)}"
    async with redis_url() as url:
        client = redis.asyncio.Redis.from_url(url)
        try:
            # A holds the lock without renewal here, to stand for a holder whose process
            # stops running: its lease runs out while it is not looking.
            a = await Lock(client, name, ttl=0.3, renew=False).acquire()
            await a.wait_lost()  # A is "paused"; it will not notice this
            b = await Lock(client, name, ttl=10).acquire()
            print(f"A holds fencing token {a.fencing_token}, B holds {b.fencing_token}")
            b_sql = sql_write(sql, 90, b)
            b_redis = await redis_write(client, f"{name}:state", "written by B", b)
            await b.release()
            # A wakes up, believes it still holds the lock, and writes.
            a_sql = sql_write(sql, 50, a)
            a_redis = await redis_write(client, f"{name}:state", "written by A", a)
            state = await client.hget(f"{name}:state", "value")
        finally:
            await client.aclose()
    balance, fence = sql.execute("SELECT balance, fence FROM accounts WHERE id = 1").fetchone()
    print(f"B's writes accepted: sqlite {b_sql}, redis {b_redis}")
    print(f"A's writes accepted: sqlite {a_sql}, redis {a_redis}")
    print(f"sqlite: balance {balance}, fence {fence}; redis: {state!r}")
    check(b_sql and b_redis, "the current holder's writes were accepted")
    check(not a_sql and not a_redis, "the zombie holder's writes were rejected")
    check(balance == 90 and state == b"written by B", "the data is B's")


if __name__ == "__main__":
    asyncio.run(main())
