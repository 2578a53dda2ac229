"""Where one lock lives in Redis: key names, fields and the format version.

Format version 1. For a lock named NAME under PREFIX (default "aiolock"):

| key / channel            | type    | holds                                                  |
|--------------------------|---------|--------------------------------------------------------|
| `PREFIX:{NAME}`          | hash    | the holder; exists only while held (or reserved); TTL = the lease's ttl |
| `PREFIX:{NAME}:fence`    | hash    | fencing counter and retry bookkeeping; TTL 1 day, refreshed by every acquire |
| `PREFIX:{NAME}:queue`    | zset    | waiting processes, first come first served (member: queue id, score: arrival µs) |
| `PREFIX:{NAME}:waiters`  | hash    | queue id -> "<expires at, Unix ms> <waiters> <host> <pid>" |
| `PREFIX:{NAME}:holds`    | list    | the last 100 hold durations in ms, newest first; TTL 1 day, renewed every 100 holds |
| `PREFIX:{NAME}:released` | channel | one message per release that hands the lock to a queued process: "<fencing token> <queue id>" |

Fields of the holder hash: `v` (format version, "1"), `token` (128-bit hex secret),
`fence` (fencing token, decimal), `host`, `pid`, `task` (holder's hostname, process id and
asyncio task name), `acquired_ms` (server time of the acquire, Unix ms), `ttl_ms` (lease ttl).
Between a release and the next acquire the hash may instead hold only `reserved` (the queue
id the lock is handed to), for at most RESERVATION_MS.

Fields of the fence hash: `n` (last fencing token issued), `released` (token of the last
lease released, so a retried release is recognised), `aborted` (token of the last acquire
abandoned while its outcome was unknown, so the acquire cannot land after the abort).

Waiting: in each process only the first waiter for a name talks to Redis, for all the
process's waiters of that name, under one random queue id. A release hands the lock to the
first live queue (reservation) and says so on the channel; that process's first waiter
claims it with its next acquire. Entries expire GRACE_MS after the holder's key would, so a
crashed waiter's entry disappears by itself.

`{NAME}` is a Redis Cluster hash tag: every key of one lock is in one slot. Names may hold
any text except a leading "}". Match every aiolock key with `SCAN MATCH PREFIX:{*`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("FENCE_KEY_TTL_MS", "FORMAT_VERSION", "GRACE_MS", "RESERVATION_MS", "LockKeys")

FORMAT_VERSION = 1

FENCE_KEY_TTL_MS = 86_400_000
"""Lifetime of the fence hash after the last acquire. Fencing tokens are floored by the
server's clock in microseconds, so a counter that expired (or was lost in a restart)
resumes above every token issued before, as long as the server clock did not step back."""


GRACE_MS = 2000
"""How long a waiter's queue entry outlives the expiry of the key it waits for. The waiter
refreshes it with each attempt; its attempts come at the latest when that key expires."""

RESERVATION_MS = 1000
"""How long a released lock stays reserved for the first queued waiter. If that waiter's
process died, the others are delayed by this much, once."""


@dataclass(frozen=True, slots=True)
class LockKeys:
    """The Redis names belonging to one lock."""

    lock: str
    fence: str
    queue: str
    waiters: str
    holds: str
    channel: str

    @classmethod
    def build(cls, prefix: str, name: str) -> LockKeys:
        base = f"{prefix}:{{{name}}}"
        return cls(
            lock=base,
            fence=f"{base}:fence",
            queue=f"{base}:queue",
            waiters=f"{base}:waiters",
            holds=f"{base}:holds",
            channel=f"{base}:released",
        )

    @property
    def for_acquire(self) -> list[str]:
        return [self.lock, self.fence, self.queue, self.waiters]

    @property
    def for_release(self) -> list[str]:
        return [self.lock, self.fence, self.queue, self.waiters, self.holds]
