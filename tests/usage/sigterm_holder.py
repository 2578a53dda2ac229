"""A lock holder that is sent SIGTERM, for the shutdown tests.

`python -m tests.usage.sigterm_holder --url URL --name NAME [--no-terminate]` installs
`release_on_signals()`, takes the lock NAME (ttl 30 s) and waits in its body. It prints
JSON lines: `acquired`, then, when the body is cancelled, `cancelled` with whether the key
still existed at that moment (the body must stop while the lock still protects it), and
with `--no-terminate`, `exited` once `async with` has ended and the process goes on.
"""

from __future__ import annotations

import asyncio

import redis.asyncio

from aiolock import Lock, release_on_signals

from ..support import programs
from ..support.programs import emit as report


async def main() -> None:
    parser = programs.parser()
    parser.add_argument("--no-terminate", action="store_true")
    args = parser.parse_args()
    release_on_signals(timeout=5, terminate=not args.no_terminate)
    client = redis.asyncio.Redis.from_url(args.url)
    lock = Lock(client, args.name, ttl=30)
    try:
        async with lock:
            report("acquired")
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                report("cancelled", key_exists=bool(await client.hexists(lock.key, "token")))
                raise
    except asyncio.CancelledError:
        report("exited", key_exists=bool(await client.hexists(lock.key, "token")))
    finally:
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
