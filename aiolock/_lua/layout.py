"""Where one lock lives in Redis: key names, fields and the format version.

Format version 3 (version 2 with a semaphore's leases of several permits: see the end). For
a lock named NAME under PREFIX (default "aiolock"):

| key / channel            | type    | holds                                                  |
|--------------------------|---------|--------------------------------------------------------|
| `PREFIX:{NAME}`          | hash    | the state: the holder while held, and what outlives a hold (see below); TTL = the lease's ttl while held, then the retention |
| `PREFIX:{NAME}:queue`    | zset    | waiting processes, first come first served (member: queue id, score: arrival µs) |
| `PREFIX:{NAME}:waiters`  | hash    | queue id -> "<expires at, Unix ms> <waiters> <host> <pid> <seq> <grant ms> <ttl ms> <grant token> <task>" |
| `PREFIX:{NAME}:holds`    | list    | only for locks with `hold_stats=True`: recent hold durations in ms, newest first, followed by "f" for a lease that was not renewed (`renew=False`), 100 to 150 of them (trimmed to 100 every 50 holds, when its 1-day TTL is renewed) |
| `PREFIX:{NAME}:released` | channel | a release that hands the lock to another process's queue: "<fencing token> <queue id> <granted fencing token> <seq>" (a grant to a queue whose id starts with "p": only if none was told here for TOLD_EVERY_MS) |
| `PREFIX:{NAME}:released:p<8 hex>` | channel | the same, for a grant to a queue of the process whose channel id this is (the first 9 characters of its queue id), told to it alone |

The state hash. While held: `token` (128-bit hex secret), `fence` (the holder's fencing
token), `m` ("<host> <pid> <task>": the holder's hostname, process id and asyncio task
name), `a` (server time of the acquisition, Unix ms), `t` (the lease's ttl, ms). Always,
while the key lives: `fence` (the last fencing token issued), `k` (the first 16 hex digits
of the last holder's token), and when they apply `r` (the same of the last token whose
release handed the lock on), `h` (the typical hold, ms: a moving average over the holds whose
release handed the lock on or that refused an acquire, 1/8 each), `b` (while held: the first
16 hex digits of the holder's token once an acquire that does not queue was refused, so that
its release measures the hold into `h`; ignored by releases of other holders and of earlier
versions, cleared by the holder's release), `q` (set while the wait queue may have entries, so that a
release with nobody waiting does not look), `g` (server ms of the last grant to a "p" queue
told on the name's channel), `reserved` (a queue the lock is kept for, as
layout 1 wrote it), `a:<token>` and `ac` (acquires aborted while their outcome was unknown,
numbered; the newest ABORTS_KEPT to twice as many are kept).

Why each command of an uncontended cycle (ACQUIRE: HMGET, TIME, HSET, PEXPIRE; RELEASE:
HMGET, HDEL): the HMGETs read the whole state in one call; TIME floors the fencing token by
the server clock, which keeps tokens increasing when the state was lost or restored from an
older copy; one HSET writes the holder, PEXPIRE gives it its ttl (so a crashed holder frees
the lock); the release deletes the holder's fields in one HDEL and leaves the rest, which
expires with the key.

What stays after a release (about 190 bytes per name, key and fields; `benchmarks/`
measures it): `fence`,
`k` and, for locks that were waited for, `r`, `h` and `q`. It lives until the released
lease's key would have expired (at most its ttl after its last renewal), or, for a lock
whose ttl is shorter than its `retain` (default RETAIN_DEFAULT) or longer than RETAIN_CAP,
exactly `retain` (one more command per release). While it lives, a late copy of a command
is recognised: an acquire with a token already used or aborted is refused, a release
retried after its answer was lost reports success. After it, such a late copy is not
recognised: an acquire can then take the lock under a token nobody owns, for at most its
ttl. Fencing tokens stay strictly increasing whatever the retention (they are floored by
the server clock), as long as that clock does not step back by more than the time since
the state expired.

Waiting: in each process only the first waiter for a name talks to Redis, for all the
process's waiters of that name, under one random queue id. Its entry carries a fresh grant
token (`seq` numbers them within the process). A release grants the lock to the first live
entry's token and says so on a channel; that process's first waiter holds the lease at
once, without a command (it claims the grant with an acquire if it heard of it too late). A
releasing process that has waiters of its own puts its queue in line in the same call.
Entries expire GRACE_MS after the holder's key would, so a crashed waiter's entry
disappears by itself; a grant to a crashed waiter lapses after RESERVATION_MS.

Grants told to one process: a lock's queue id of this version starts with "p" and the
8 hex digits of its process's channel id, and its process listens on the name's channel
and on `PREFIX:{NAME}:released:p<8 hex>`. A grant to it is told on the latter alone,
unless the name's channel told of no such grant for TOLD_EVERY_MS (then there, with `g` set
to now): a busy name's releases reach the process they serve, not every waiting one. Such a
grant lapses after GRANT_MS (RESERVATION_MS - TOLD_EVERY_MS) unless renewed, so every grant
not told to all lapses within RESERVATION_MS of the last one that was; a process that heard
that one checks the lock by then, and an acquire refused while `g` is younger than
TOLD_EVERY_MS answers when to check (ACQUIRE's `check`). A crashed grantee so delays the
others by RESERVATION_MS at most, as before. A queue id without the "p" (a process of the
version before) is told on the name's channel alone, and its grants lapse after
RESERVATION_MS as before; those processes do not read `check`, so while versions mix, a
waiter of the older version may miss a grant told to one process alone and, if that
process crashed, wait until its own timer (at most the holder's ttl after its last try).

Layout 1 compatibility (a rolling upgrade): layout-1 processes read only `token`,
`reserved` and `fence` of the state hash, write their holder with their own field names
(`v`, `host`, `pid`, `task`, `acquired_ms`, `ttl_ms`), delete the whole hash on release, and
keep their fencing counter in `PREFIX:{NAME}:fence`. Both layouts share the queue keys and
the channel, so each serves the other's waiters, except that a layout-2 release whose
state has no `q` (a layout-1 waiter queued while a layout-2 process held the lock) leaves
layout-1 waiters to their own checks, at the holder's ttl at the latest.

A semaphore's keys are the same under `PREFIX:sem:{NAME}`, a read-write lock's under
`PREFIX:rw:{NAME}` (with a second wait queue, `:rqueue` and `:rwaiters`, and a second
channel, `:rreleased`, for readers); their state hash holds every lease as a field
`p:<token>` (see `_lua.hash_leases`, `_lua.semaphore`, `_lua.rwlock`). A semaphore's
permits are also indexed by expiry in `PREFIX:sem:{NAME}:permits` (a sorted set of its
slots, living as long as the state; `permits_key`), so that no script of it reads every
permit (see `_lua.permit_index`, which also says how it stays right beside processes of the
version before it, which do not know the index). An election's
are a lock's under `PREFIX:el:{NAME}`, its state hash also holding the leader's record,
with a change log `:log` and a channel `:changed` (see `_lua.election`).

Layout 3 (a semaphore's leases of several permits, `Semaphore.acquire(permits=n)`): such a
lease is n permits, each a field of its own with a slot of its own, as every permit is:
`p:<token>` and `p:<token>~2` to `p:<token>~n` (one expiry, renewed together: RENEW's kind
"ps<n>"). A request for several permits that is refused and waits sets `w` = "<token>
<permits> <until, ms> <since, µs>" in the state (no later request gets a permit freed
until it has its own), parks the permits free meanwhile in `p:<token>~w<k>` (fencing token
0, lapsing with `w`), and has an entry without a grant token in the wait queue, under the
id "w" and the token's first 15 characters. Processes of layout 2 count every one of
those fields as a permit (their scripts read permits by field and by slot), reap and
rebuild them as their own, and do not know `w`: they serve their queue first, where a
release of theirs reserves a permit for the request's entry in its turn (`p:q<queue id>`),
which the request's next try parks. So mixed versions never hold more than the limit.

`{NAME}` is a Redis Cluster hash tag: every key of one lock is in one slot. Names may hold
any text except a leading "}". Match every aiolock lock's key with `SCAN MATCH PREFIX:{*`
(semaphores: `PREFIX:sem:{*`, read-write locks: `PREFIX:rw:{*`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

__all__ = (
    "ABORTS_KEPT",
    "ABORT_RETAIN_MS",
    "DIRECT_PREFIX",
    "FORMAT_VERSION",
    "GRACE_MS",
    "GRANT_MS",
    "KEPT_PREFIX",
    "RESERVATION_MS",
    "RETAIN_CAP",
    "RETAIN_DEFAULT",
    "RETAIN_MIN",
    "TOLD_EVERY_MS",
    "LockKeys",
    "permits_key",
)

FORMAT_VERSION = 3

GRACE_MS = 2000
"""How long a waiter's queue entry outlives the expiry of the key it waits for. The waiter
refreshes it with each attempt; its attempts come at the latest when that key expires."""

RESERVATION_MS = 1000
"""How long a lock handed to the first queued process is held for it before that process
renews it (a grant), or claims it (a reservation). If that process died, the others are
delayed by this much, once."""

TOLD_EVERY_MS = 100
"""How often, at most, a grant to a queue listening on its process's channel is also told on
the name's channel (to every waiting process). Between those, grants are told on the
grantee's process's channel alone, and each lapses within RESERVATION_MS - TOLD_EVERY_MS
unless renewed: a process that heard of the last grant told to all, or that was told by
its acquire to check again (ACQUIRE's `check`), checks by the time any of them lapsed."""

GRANT_MS = RESERVATION_MS - TOLD_EVERY_MS
"""How long a grant to a waiting process of this version is held before that process
renews it (its entry's `grant ms`, the ttl if shorter): a grant told to it alone lapses
by the time the other processes check (see TOLD_EVERY_MS)."""

DIRECT_PREFIX = 9
"""Characters of a queue id that name its process's channel: "p" and 8 hex digits, the
same for all of that process's queues (of one client). A queue id without the "p" (16 hex
digits, from the version before) is told of grants on the name's channel alone."""

ABORTS_KEPT = 32
"""Aborted acquire tokens a lock remembers at least (at most twice as many): an acquire that
arrives after its caller aborted it is refused as long as its token is remembered."""

ABORT_RETAIN_MS = 600_000
"""Longest the state of a lock that is not held lives after an abort was recorded in it
(`LockConfig.abort_retain_ms`: twice the ttl, at least `retain`, at most this); what an
abort that names no retention sets."""

KEPT_PREFIX = 16
"""Hex digits of a token the state keeps after its lease (64 bits)."""

HOLD_FIXED = "f"
"""Written after a recorded hold (ms) of a lease that was not renewed: its ttl had to cover
the whole hold, where a renewed lease's holds may outlive its ttl by design."""

RETAIN_DEFAULT = 10.0
"""Default retention of a released lock's state, seconds (see the module docstring)."""

RETAIN_MIN = 5.0
"""Shortest accepted retention: longer than a release is retried (a retry after a lost
answer must still find the record of the first attempt)."""

RETAIN_CAP = 3600.0
"""A ttl above this makes the release set the retention: a released state never lives
longer than max(retain, this)."""


@dataclass(frozen=True, slots=True)
class LockKeys:
    """The Redis names belonging to one lock."""

    lock: str
    queue: str
    waiters: str
    holds: str
    channel: str
    scripts: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """KEYS of the acquire and release scripts."""
    state: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """KEYS of an acquire that does not queue: the state alone."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "scripts", (self.lock, self.queue, self.waiters, self.holds))
        object.__setattr__(self, "state", (self.lock,))

    @classmethod
    @functools.lru_cache(maxsize=1024)
    def build(cls, prefix: str, name: str, kind: str = "") -> LockKeys:
        """The names of lock `name` under `prefix` (remembered for recently used names);
        `kind` is "sem:" for a semaphore's, "rw:" for a read-write lock's."""
        base = f"{prefix}:{kind}{{{name}}}"
        return cls(
            lock=base,
            queue=f"{base}:queue",
            waiters=f"{base}:waiters",
            holds=f"{base}:holds",
            channel=f"{base}:released",
        )


def permits_key(state: str) -> str:
    """The index of a semaphore's permits (a sorted set of slots by expiry, in the same
    cluster slot as its state hash `state`: see `_lua.permit_index`)."""
    return f"{state}:permits"
