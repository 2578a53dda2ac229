"""Where one lock lives in Redis: key names, fields and the format version.

Format version 1. For a lock named NAME under PREFIX (default "aiolock"):

| key / channel            | type    | holds                                                  |
|--------------------------|---------|--------------------------------------------------------|
| `PREFIX:{NAME}`          | hash    | the holder; exists only while held (or reserved); TTL = the lease's ttl |
| `PREFIX:{NAME}:fence`    | hash    | fencing counter and retry bookkeeping; TTL 1 day, renewed by the first acquire after half of it has passed |
| `PREFIX:{NAME}:queue`    | zset    | waiting processes, first come first served (member: queue id, score: arrival µs) |
| `PREFIX:{NAME}:waiters`  | hash    | queue id -> "<expires at, Unix ms> <waiters> <host> <pid> <seq> <grant ms> <ttl ms> <grant token> <task>" |
| `PREFIX:{NAME}:holds`    | list    | recent hold durations in ms, newest first: 100 to 150 of them (trimmed to 100 every 50 holds, when its 1-day TTL is renewed); readers take the first 100 |
| `PREFIX:{NAME}:released` | channel | one message per release that hands the lock to another process's queue: "<fencing token> <queue id> <granted fencing token> <seq>" |

Fields of the holder hash: `v` (format version, "1"), `token` (128-bit hex secret),
`fence` (fencing token, decimal), `host`, `pid`, `task` (holder's hostname, process id and
asyncio task name), `acquired_ms` (server time of the acquire, Unix ms), `ttl_ms` (lease ttl).
A lock granted to a queued process holds that process's grant token, with an expiry of at
most RESERVATION_MS until the process renews it. For a queue entry without the grant fields
(as written by an older version) the hash instead holds only `reserved` (the queue id the
lock is kept for), for at most RESERVATION_MS, and the channel message has only its first
two fields.

Fields of the fence hash: `n` (last fencing token issued), `x` (server time, Unix ms, when
its expiry was last set; older versions do not write it, and its absence renews the expiry),
`released` (token of the last lease released, so a retried release is recognised and a
stray copy of its acquire is refused), `a:<token>` (one field per acquire abandoned while its
outcome was unknown, numbered by `ac`, so the acquire cannot land after the abort; the
newest ABORTS_KEPT to twice as many are kept). A release renews the expiry only after a
hold of more than a quarter of it, or when it had to make the hash anew.

The hold list records each hold as its holder measured it, from the grant to the release
(local monotonic clock); a forced release records the server's own measure.

Waiting: in each process only the first waiter for a name talks to Redis, for all the
process's waiters of that name, under one random queue id. Its entry carries a fresh grant
token (`seq` numbers them within the process). A release grants the lock to the first live
entry's token and says so on the channel; that process's first waiter holds the lease at
once, without a command (it claims the grant with an acquire if it heard of it too late). A
releasing process that has waiters of its own puts its queue in line in the same call.
Entries expire GRACE_MS after the holder's key would, so a crashed waiter's entry
disappears by itself; a grant to a crashed waiter lapses after RESERVATION_MS.

`{NAME}` is a Redis Cluster hash tag: every key of one lock is in one slot. Names may hold
any text except a leading "}". Match every aiolock key with `SCAN MATCH PREFIX:{*`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

__all__ = (
    "ABORTS_KEPT",
    "FENCE_KEY_TTL_MS",
    "FORMAT_VERSION",
    "GRACE_MS",
    "RESERVATION_MS",
    "LockKeys",
)

FORMAT_VERSION = 1

FENCE_KEY_TTL_MS = 86_400_000
"""Lifetime of the fence hash after the last acquire. Fencing tokens are floored by the
server's clock in microseconds, so a counter that expired (or was lost in a restart)
resumes above every token issued before, as long as the server clock did not step back."""


GRACE_MS = 2000
"""How long a waiter's queue entry outlives the expiry of the key it waits for. The waiter
refreshes it with each attempt; its attempts come at the latest when that key expires."""

RESERVATION_MS = 1000
"""How long a lock handed to the first queued process is held for it before that process
renews it (a grant), or claims it (a reservation). If that process died, the others are
delayed by this much, once."""


ABORTS_KEPT = 32
"""Aborted acquire tokens a lock remembers at least (at most twice as many): an acquire that
arrives after its caller aborted it is refused as long as its token is remembered."""


@dataclass(frozen=True, slots=True)
class LockKeys:
    """The Redis names belonging to one lock."""

    lock: str
    fence: str
    queue: str
    waiters: str
    holds: str
    channel: str
    for_acquire: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """KEYS of the acquire script."""
    for_release: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """KEYS of the release script."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "for_acquire", (self.lock, self.fence, self.queue, self.waiters))
        object.__setattr__(self, "for_release", (*self.for_acquire, self.holds))

    @classmethod
    @functools.lru_cache(maxsize=1024)
    def build(cls, prefix: str, name: str) -> LockKeys:
        """The names of lock `name` under `prefix` (remembered for recently used names)."""
        base = f"{prefix}:{{{name}}}"
        return cls(
            lock=base,
            fence=f"{base}:fence",
            queue=f"{base}:queue",
            waiters=f"{base}:waiters",
            holds=f"{base}:holds",
            channel=f"{base}:released",
        )
