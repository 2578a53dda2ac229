"""Fenced writes in SQL: one conditional statement, the highest token in a column.

    python examples/fenced_sql.py

Each row keeps the fencing token of its last accepted write in a `fence` column (a 64-bit
integer: BIGINT). A write is one statement that changes the row only if its token is at
least that one, so the check and the write are atomic in any SQL database: no row changed
means a newer holder wrote first. An equal token is accepted: the same holder writing
again.

SQLite here (the standard library's `sqlite3`, named `:placeholders`); with PostgreSQL
and psycopg, the same statements with `%(placeholders)s`.

Holder A takes the lock and stalls past its ttl; B takes the lock and writes; then A
wakes up and writes as if it still held the lock: both of its statements change nothing.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3

import redis.asyncio
from _server import check, redis_url

from aiolock import Lock

SCHEMA = "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER, fence BIGINT)"

UPDATE = """
UPDATE accounts
   SET balance = :balance, fence = :token
 WHERE id = :id AND fence <= :token
"""

UPSERT = """
INSERT INTO accounts (id, balance, fence) VALUES (:id, :balance, :token)
ON CONFLICT (id) DO UPDATE
   SET balance = excluded.balance, fence = excluded.fence
 WHERE accounts.fence <= excluded.fence
"""


def fenced_update(db: sqlite3.Connection, account: int, balance: int, token: int) -> bool:
    """Set an existing account's balance; False if a newer holder wrote first."""
    with db:  # one transaction: committed here, rolled back on an error
        cursor = db.execute(UPDATE, {"id": account, "balance": balance, "token": token})
    return cursor.rowcount == 1


def fenced_upsert(db: sqlite3.Connection, account: int, balance: int, token: int) -> bool:
    """Create the account or set its balance; False if a newer holder wrote first."""
    with db:
        cursor = db.execute(UPSERT, {"id": account, "balance": balance, "token": token})
    return cursor.rowcount == 1


async def demo(db: sqlite3.Connection) -> None:
    db.execute(SCHEMA)
    db.execute("INSERT INTO accounts VALUES (1, 100, 0)")
    name = f"accounts:{secrets.token_hex(4)}"
    async with redis_url() as url:
        client = redis.asyncio.Redis.from_url(url)
        try:
            # A holds the lock without renewal here, to stand for a holder whose process
            # stops running: its lease runs out while it is not looking.
            a = await Lock(client, name, ttl=0.3, renew=False).acquire()
            await a.wait_lost()  # A is "paused"; it will not notice this
            async with Lock(client, name, ttl=10) as b:
                print(f"A holds fencing token {a.fencing_token}, B holds {b.fencing_token}")
                b_wrote = fenced_update(db, 1, 90, b.fencing_token)
                b_created = fenced_upsert(db, 2, 10, b.fencing_token)
            # A wakes up, believes it still holds the lock, and writes.
            a_wrote = fenced_update(db, 1, 50, a.fencing_token)
            a_created = fenced_upsert(db, 2, 500, a.fencing_token)
        finally:
            await client.aclose()
    rows = db.execute("SELECT id, balance, fence FROM accounts ORDER BY id").fetchall()
    print(f"B's statements changed a row: {b_wrote}, {b_created}; A's: {a_wrote}, {a_created}")
    print(f"accounts (id, balance, fence): {rows}")
    check(b_wrote and b_created, "the current holder's statements were applied")
    check(not a_wrote and not a_created, "the superseded holder's statements changed nothing")
    check([row[:2] for row in rows] == [(1, 90), (2, 10)], "the data is B's")


async def main() -> None:
    db = sqlite3.connect(":memory:")
    try:
        await demo(db)
    finally:
        db.close()


if __name__ == "__main__":
    asyncio.run(main())
