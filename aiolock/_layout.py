"""Where one lock lives in Redis: key names, fields and the format version.

Format version 1. For a lock named NAME under PREFIX (default "aiolock"):

| key / channel                 | type    | holds                                              |
|-------------------------------|---------|----------------------------------------------------|
| `PREFIX:{NAME}`               | hash    | the current holder; exists only while held; TTL = the lease's ttl |
| `PREFIX:{NAME}:fence`         | hash    | fencing counter and retry bookkeeping; TTL 1 day, refreshed by every acquire |
| `PREFIX:{NAME}:released`      | channel | pub/sub: one message per release, payload = the released fencing token |

Fields of the holder hash: `v` (format version, "1"), `token` (128-bit hex secret),
`fence` (fencing token, decimal), `host`, `pid`, `task` (holder's hostname, process id and
asyncio task name), `acquired_ms` (server time of the acquire, Unix ms), `ttl_ms` (lease ttl).

Fields of the fence hash: `n` (last fencing token issued), `released` (token of the last
lease released, so a retried release is recognised), `aborted` (token of the last acquire
abandoned while its outcome was unknown, so the acquire cannot land after the abort).

`{NAME}` is a Redis Cluster hash tag: every key of one lock is in one slot. Names may hold
any text except a leading "}". Match every aiolock key with `SCAN MATCH PREFIX:{*`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("FENCE_KEY_TTL_MS", "FORMAT_VERSION", "LockKeys")

FORMAT_VERSION = 1

FENCE_KEY_TTL_MS = 86_400_000
"""Lifetime of the fence hash after the last acquire. Fencing tokens are floored by the
server's clock in microseconds, so a counter that expired (or was lost in a restart)
resumes above every token issued before, as long as the server clock did not step back."""


@dataclass(frozen=True, slots=True)
class LockKeys:
    """The Redis names belonging to one lock."""

    lock: str
    fence: str
    channel: str

    @classmethod
    def build(cls, prefix: str, name: str) -> LockKeys:
        base = f"{prefix}:{{{name}}}"
        return cls(lock=base, fence=f"{base}:fence", channel=f"{base}:released")
