"""Fenced writes in Redis: a superseded holder's late write is refused.

    python examples/fenced_storage.py

A lock can be lost without its holder knowing in time (a long pause, a partition), and a
new holder may be working by then. `fenced_set` writes a value only with a fencing token at
least the highest accepted for its key, so the old holder's write, carrying an older
token, is refused. `fenced_get` reads the value and that token; `fenced_delete` removes
the value under the same rule, and keeps the token.

Holder A takes the lock and stalls (a GC pause, say) past its ttl; B takes the lock and
writes; then A wakes up and writes as if it still held the lock: refused.
"""

from __future__ import annotations

import asyncio
import secrets

import redis.asyncio
from _server import check, redis_url

from aiolock import Lease, Lock, fenced_delete, fenced_get, fenced_set


async def save_balance(
    client: redis.asyncio.Redis, account: str, balance: int, lease: Lease
) -> bool:
    """Write the balance under the lease; False if a newer holder wrote first."""
    return await fenced_set(client, f"accounts:{account}:balance", balance, lease.fencing_token)


async def main() -> None:
    account = secrets.token_hex(4)
    async with redis_url() as url:
        client = redis.asyncio.Redis.from_url(url)
        try:
            # A holds the lock without renewal here, to stand for a holder whose process
            # stops running: its lease runs out while it is not looking.
            a = await Lock(client, f"accounts:{account}", ttl=0.3, renew=False).acquire()
            await a.wait_lost()  # A is "paused"; it will not notice this
            b = await Lock(client, f"accounts:{account}", ttl=10).acquire()
            print(f"A holds fencing token {a.fencing_token}, B holds {b.fencing_token}")
            b_wrote = await save_balance(client, account, 90, b)
            # A wakes up, believes it still holds the lock, and writes.
            a_wrote = await save_balance(client, account, 50, a)
            stored = await fenced_get(client, f"accounts:{account}:balance")
            print(f"B's write accepted: {b_wrote}; A's: {a_wrote}")
            print(f"stored: {stored.value!r} with fencing token {stored.fencing_token}")
            check(b_wrote, "the current holder's write was accepted")
            check(not a_wrote, "the superseded holder's write was refused")
            check(stored.value == b"90" and stored.fencing_token == b.fencing_token, "B's data")
            # B closes the account: the value goes, the token stays, so A is still refused.
            b_deleted = await fenced_delete(client, f"accounts:{account}:balance", b.fencing_token)
            a_again = await save_balance(client, account, 50, a)
            await b.release()
            check(b_deleted and not a_again, "after B's delete, A's write is still refused")
        finally:
            await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
