"""Reading the data layout back: which locks exist, their state, and their recorded holds.

Shared by the `aiolock` command line, `Semaphore.info()`, `ReadWriteLock.info()` and the
public `hold_stats()`.
Everything here reads (SCAN, one MULTI/EXEC snapshot per batch of names), except
`force_release`, which runs the ordinary token-guarded RELEASE script with the holder's
token. What the recorded holds say (percentiles, the ttl they suggest) is computed by
`_model.hold_stats`, from the durations read here.

Every primitive keeps the same set of keys, named with an infix of its own (`KINDS`: ""
for a lock, "sem:" for a semaphore, "rw:" for a read-write lock, "el:" for an election,
whose term is a lock's lease and whose leader's record lives beside it); what differs is how its
state hash names its holders, and a read-write lock's second wait queue (its readers'). A
new primitive is read back by adding a `Kind` (its label, its infix, and how to find its
holders in the state) to `KINDS` and its label to `LockState.kind`.

Hold durations come from the `holds` list of the layout, kept for locks created with
`hold_stats=True` (each normal release, ms, marked when the lease was not renewed). Every
lock that is waited for also keeps a typical hold (a moving average over the holds whose
release handed it on, or that refused an acquire) in its state.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, TypeAlias, cast, final

from .._engine.runtime import runtime_for
from .._lua.layout import LockKeys
from .._lua.lock import RELEASE, release_args
from .._model.config import check_prefix
from .._model.hold_stats import HoldStats, parse_hold, summarize_holds
from .._model.holder import LockInfo, text
from .._model.leader import Leader
from .._transport.call_options import CallOptions
from .._transport.clients import AsyncClient, AsyncRedis, check_client, is_cluster, translate_errors
from ..errors import ConfigError

__all__ = (
    "ELECTION",
    "KINDS",
    "LOCK",
    "READER_QUEUE",
    "RESERVED_TASK",
    "RWLOCK",
    "SEMAPHORE",
    "ForceRelease",
    "Holders",
    "Kind",
    "KindLabel",
    "LockState",
    "QueueEntry",
    "Reservation",
    "force_release",
    "hold_stats",
    "kind_named",
    "read_locks",
    "scan_lock_names",
)

READ_TIMEOUT: Final = 5.0
"""Longest wait for one SCAN page or one snapshot batch, seconds."""
_BATCH: Final = 200
"""Locks read in one MULTI/EXEC snapshot."""


# --------------------------------------------------------------------------- snapshots
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class QueueEntry:
    """One waiting process in a lock's queue (a process's waiters share one entry)."""

    queue_id: str
    position: int
    """1 = next in line."""
    host: str
    pid: int
    count: int
    """Waiters of that process queued under this entry."""
    expires_in: float
    """Seconds until the entry expires; ≤ 0: expired (its process stopped refreshing it,
    most likely it died), skipped by the next hand-over."""

    @property
    def expired(self) -> bool:
        return self.expires_in <= 0


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Reservation:
    """A released lock waiting to be claimed by the first queued process."""

    queue_id: str
    expires_in: float


KindLabel: TypeAlias = Literal["lock", "semaphore", "rwlock", "election"]
"""What the command line calls each kind of primitive (`Kind.label`)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Holders:
    """The holders a state hash names, as one kind of primitive writes them."""

    holder: LockInfo | None = None
    """A lock's holder, a read-write lock's writer (None for a semaphore)."""
    holders: tuple[LockInfo, ...] = ()
    """Every holder, by slot where there are slots (a read-write lock: the writer, then the
    readers)."""
    readers: tuple[LockInfo, ...] = ()
    """A read-write lock's readers, by fencing token (the order they came in)."""
    reserved_slots: Mapping[int, str] = field(default_factory=dict)
    """Slots kept for a queued process (a release handed them over): slot -> queue id."""
    leader: Leader | None = None
    """An election's leader, as its record names it (None: nobody leads, or another kind)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Kind:
    """One kind of primitive whose keys the layout names with an infix of its own."""

    label: KindLabel
    infix: str
    """Between the prefix and the name in its keys: `LockKeys.build(prefix, name, infix)`."""
    shared: bool
    """Held by several holders at once (a lock: one)."""
    holders: Callable[[str, Mapping[str, str], int, int], Holders]
    """The holders in a state hash's fields: (name, fields, the key's PTTL, server ms)."""
    sides: bool = False
    """A read side and a write side (a read-write lock): its `holder` is the writer, and its
    readers wait in a queue of their own (`READER_QUEUE`); its `queue` is the writers'."""


def _lock_holders(name: str, fields: Mapping[str, str], pttl: int, now_ms: int) -> Holders:
    holder = LockInfo.from_fields(name, fields, pttl)
    return Holders(holder=holder, holders=(holder,) if holder is not None else ())


RESERVED_TASK: Final = "(reserved)"
"""The task of a semaphore's permit kept for a queued process, in field "p:q<queue id>"."""


def _permit_holders(name: str, fields: Mapping[str, str], pttl: int, now_ms: int) -> Holders:
    holders = LockInfo.from_permits(name, fields, now_ms)
    reserved: dict[int, str] = {}
    for key, value in fields.items():
        if key.startswith("p:q") and value.endswith(" " + RESERVED_TASK):
            slot, _, rest = value.partition(" ")
            expires = rest.partition(" ")[0]
            if slot.isdigit() and _int(expires) > now_ms:
                reserved[int(slot)] = key[3:]
    return Holders(holders=holders, reserved_slots=reserved)


def _rw_holders(name: str, fields: Mapping[str, str], pttl: int, now_ms: int) -> Holders:
    # Its leases are written as a semaphore's permits, with the side (0 read, 1 write) in
    # place of the slot.
    leases = LockInfo.from_permits(name, fields, now_ms)
    writer = next((replace(info, slot=None, slots=()) for info in leases if info.slot == 1), None)
    readers = tuple(
        sorted(
            (replace(info, slot=None, slots=()) for info in leases if info.slot == 0),
            key=lambda info: info.fencing_token,
        )
    )
    return Holders(
        holder=writer,
        holders=(writer, *readers) if writer is not None else readers,
        readers=readers,
    )


def _election_holders(name: str, fields: Mapping[str, str], pttl: int, now_ms: int) -> Holders:
    # Its term is a lock's lease; the leader's record lives beside it (see `_lua.election`).
    term = _lock_holders(name, fields, pttl, now_ms)
    leader = Leader.from_fields(name, fields) if pttl != -2 else None
    return replace(term, leader=leader)


READER_QUEUE: Final = (":rqueue", ":rwaiters")
"""Suffixes of a read-write lock's readers' wait queue (zset, hash) after its state key."""

LOCK: Final = Kind(label="lock", infix="", shared=False, holders=_lock_holders)
SEMAPHORE: Final = Kind(label="semaphore", infix="sem:", shared=True, holders=_permit_holders)
RWLOCK: Final = Kind(label="rwlock", infix="rw:", shared=True, holders=_rw_holders, sides=True)
ELECTION: Final = Kind(label="election", infix="el:", shared=False, holders=_election_holders)
KINDS: Final[tuple[Kind, ...]] = (LOCK, SEMAPHORE, RWLOCK, ELECTION)
"""Every kind of primitive the command line shows, in the order it lists them."""


def kind_named(name: str) -> Kind:
    """The kind whose label or key infix is `name` ("lock" or "", "semaphore" or "sem:",
    "rwlock" or "rw:", "election" or "el:")."""
    for kind in KINDS:
        if name in (kind.label, kind.infix):
            return kind
    raise ValueError(f"unknown kind {name!r}: one of {', '.join(k.label for k in KINDS)}")


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LockState:
    """Everything the data layout says about one lock (or other primitive), read in one
    snapshot."""

    name: str
    holder: LockInfo | None
    """A lock's holder, a read-write lock's writer (None for a semaphore)."""
    age: float | None
    """Seconds since the holder acquired the lock (server clock); for a semaphore or a
    read-write lock, since the oldest permit or lease held was acquired."""
    kind: KindLabel = "lock"
    holders: tuple[LockInfo, ...] = ()
    """Every holder: a lock's one holder, a semaphore's permits by slot, a read-write
    lock's writer or its readers."""
    readers: tuple[LockInfo, ...] = ()
    """A read-write lock's readers, by fencing token (among `holders`)."""
    limit: int | None = None
    """A semaphore's limit in force (None: none stored, or a lock)."""
    reserved_slots: Mapping[int, str] = field(default_factory=dict)
    """A semaphore's permits kept for a queued process (a release handed them over, and
    that process has not claimed them yet): slot -> queue id. They are among `holders`,
    with the task "(reserved)"."""
    reservation: Reservation | None
    last_fencing_token: int | None
    """The last fencing token issued (None: no state kept, see the retention)."""
    typical_hold: float | None
    """Seconds: a moving average over the holds whose release handed the lock on, or that
    refused an acquire (None: none)."""
    queue: tuple[QueueEntry, ...]
    """The wait queue, in order (a read-write lock's writers')."""
    reader_queue: tuple[QueueEntry, ...] = ()
    """A read-write lock's readers' wait queue, in order (empty for the other kinds)."""
    leader: Leader | None = None
    """An election's leader (its term is `holder`'s lease; None: nobody leads, or another
    kind); its candidates waiting are `queue`."""
    holds_ms: tuple[int, ...]
    """Recent hold durations in ms, newest first."""
    fixed_holds_ms: tuple[int, ...] = ()
    """Those of them whose lease was not renewed (`renew=False`), newest first."""
    server_time: float
    """Unix seconds, the server's clock at the snapshot."""

    @property
    def state(self) -> Literal["held", "reserved", "free"]:
        if self.holder is not None or self.holders:
            return "held"
        return "reserved" if self.reservation is not None else "free"

    @property
    def permits_held(self) -> int:
        """A semaphore's permits held: its holders' `permits` summed (a lease of several
        permits is one holder)."""
        return sum(info.permits for info in self.holders)

    @property
    def free(self) -> int | None:
        """A semaphore's permits free now (0 while a lowered limit is still exceeded; None:
        no limit stored, or a lock)."""
        return None if self.limit is None else max(self.limit - self.permits_held, 0)

    @property
    def waiters(self) -> int:
        """Waiting tasks, summed over the queue entries that have not expired (a read-write
        lock's writers and readers)."""
        return self.writers_waiting + self.readers_waiting

    @property
    def writers_waiting(self) -> int:
        """Tasks waiting in `queue` (for a lock or a semaphore: every waiter)."""
        return _waiting(self.queue)

    @property
    def readers_waiting(self) -> int:
        """Tasks waiting in a read-write lock's `reader_queue` (0 for the other kinds)."""
        return _waiting(self.reader_queue)

    @property
    def known(self) -> bool:
        """Whether Redis holds anything at all about this lock."""
        return (
            self.state != "free"
            or self.last_fencing_token is not None
            or bool(self.queue)
            or bool(self.reader_queue)
            or bool(self.holds_ms)
        )

    def hold_stats(self, *, ttl: float | None = None) -> HoldStats:
        """Stats of the recorded holds, judged against the holder's ttl if held (a
        semaphore's or a read-write lock's readers': the longest of their leases'), else
        `ttl`."""
        in_use = self.holder.ttl if self.holder is not None else ttl
        if self.holder is None:
            ttls = [
                info.ttl
                for info in self.holders
                if info.slot not in self.reserved_slots and info.ttl > 0
            ]
            in_use = max(ttls) if ttls else ttl
        return summarize_holds(self.name, self.holds_ms, ttl=in_use, fixed_ms=self.fixed_holds_ms)


def _waiting(queue: Iterable[QueueEntry]) -> int:
    return sum(entry.count for entry in queue if not entry.expired)


def _int(value: object, default: int = 0) -> int:
    try:
        return int(text(value))
    except ValueError:
        return default


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _check_read_name(name: object) -> str:
    """A name to read back or evict: any non-empty `str`. The rules for a new lock's name
    (`check_name`: its length, UTF-8) do not apply: another writer may have made a key that
    breaks them, and it must still be shown and evicted. A name that is not UTF-8 is text
    decoded with `surrogateescape`, read with a client that encodes with it (the command
    line's)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not name:
        raise ConfigError("name must not be empty", argument="name", value=name)
    return name


def _key_name(key: object) -> str:
    """A key from SCAN as text: bytes that are not UTF-8 decoded with `surrogateescape`,
    so that the name encodes back to the same key."""
    return key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else str(key)


def _check_pattern(pattern: str) -> str:
    if not pattern:
        raise ValueError("the pattern must not be empty (use '*' for every lock)")
    return pattern


async def scan_lock_names(
    client: AsyncClient,
    *,
    prefix: str = "aiolock",
    pattern: str = "*",
    with_holds: bool = False,
    kind: str = "",
) -> list[str]:
    """Names of the locks whose state hash exists (held, reserved, or its state retained
    after a release), sorted; of the semaphores with `kind="sem:"`, of the read-write locks
    with `kind="rw:"` (a `Kind.infix`, or its label).

    Uses `SCAN MATCH "<prefix>:<kind>{<pattern>}" TYPE hash`, never KEYS. With
    `with_holds`, also the names that only have recorded holds (`... :holds`, TYPE list).

    Raises:
        BackendError: Redis could not be reached or refused the command.
        ValueError: an empty pattern, or an unknown kind.
    """
    client = check_client(client)
    prefix = check_prefix(prefix)
    pattern = _check_pattern(pattern)
    infix = kind_named(kind).infix
    base = f"{_glob_escape(prefix)}:{_glob_escape(infix)}{{{pattern}}}"
    head = len(prefix) + 1 + len(infix) + 1
    suffix = "}:holds"
    names: set[str] = set()
    # A cluster's keys are spread over its primaries: each is scanned.
    async with runtime_for(client).backend.primary_clients() as nodes:
        for node in nodes:
            names |= await _scan(node, base, "hash", lambda key: key[head:-1])
            if with_holds:
                names |= await _scan(
                    node, f"{base}:holds", "list", lambda key: key[head : -len(suffix)]
                )
    return sorted(name for name in names if name)


async def _scan(
    client: AsyncRedis, match: str, type_: str, name_of: Callable[[str], str]
) -> set[str]:
    names: set[str] = set()
    cursor: Any = 0
    while True:
        with translate_errors("scan", None, READ_TIMEOUT):
            async with asyncio.timeout(READ_TIMEOUT):
                cursor, keys = await client.scan(
                    cursor=cursor, match=match, count=1000, _type=type_
                )
        names.update(name_of(_key_name(key)) for key in keys)
        if int(cursor) == 0:
            return names


async def read_locks(
    client: AsyncClient, names: Sequence[str], *, prefix: str = "aiolock", kind: str = ""
) -> list[LockState]:
    """A snapshot of each named lock (one MULTI/EXEC round trip per 200 locks), in order;
    of semaphores with `kind="sem:"`, of read-write locks with `kind="rw:"` (a
    `Kind.infix`, or its label).

    Raises:
        BackendError: Redis could not be reached or refused the command.
        ValueError: an unknown kind.
    """
    client = check_client(client)
    prefix = check_prefix(prefix)
    names = [_check_read_name(name) for name in names]
    of_kind = kind_named(kind)
    if not is_cluster(client):
        one = cast(AsyncRedis, client)  # redis-py's, or valkey-py's twin
        states: list[LockState] = []
        for start in range(0, len(names), _BATCH):
            batch = names[start : start + _BATCH]
            states.extend(await _read_batch(one, batch, prefix, of_kind))
        return states
    # On a cluster, a MULTI/EXEC may only touch one slot: one snapshot per slot, on the
    # node serving it, all at once.
    backend = runtime_for(client).backend
    by_slot: dict[int, list[str]] = {}
    for name in names:
        by_slot.setdefault(
            backend.slot(LockKeys.build(prefix, name, of_kind.infix).lock), []
        ).append(name)

    async def read_slot(batch: list[str]) -> list[LockState]:
        key = LockKeys.build(prefix, batch[0], of_kind.infix).lock
        async with backend.node_client(key) as node:
            return await _read_batch(node, batch, prefix, of_kind)

    found: dict[str, LockState] = {}
    for batch_states in await asyncio.gather(*(read_slot(b) for b in by_slot.values())):
        found.update((state.name, state) for state in batch_states)
    return [found[name] for name in names]


_PER_LOCK: Final = 5
"""Commands per lock in a snapshot (two more for a read-write lock's readers' queue)."""


async def _read_batch(
    client: AsyncRedis, names: Sequence[str], prefix: str, kind: Kind
) -> list[LockState]:
    with translate_errors("inspect", names[0] if len(names) == 1 else None, READ_TIMEOUT):
        async with asyncio.timeout(READ_TIMEOUT):
            async with client.pipeline(transaction=True) as pipe:
                pipe.time()
                for name in names:
                    keys = LockKeys.build(prefix, name, kind.infix)
                    pipe.pttl(keys.lock)
                    pipe.hgetall(keys.lock)
                    pipe.zrange(keys.queue, 0, -1)
                    pipe.hgetall(keys.waiters)
                    pipe.lrange(keys.holds, 0, 99)
                    if kind.sides:
                        pipe.zrange(keys.lock + READER_QUEUE[0], 0, -1)
                        pipe.hgetall(keys.lock + READER_QUEUE[1])
                replies: list[Any] = await pipe.execute()
    seconds, micros = replies[0]
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    per = _PER_LOCK + (2 if kind.sides else 0)
    return [
        _parse(name, now_ms, replies[1 + i * per : 1 + (i + 1) * per], kind)
        for i, name in enumerate(names)
    ]


def _parse(name: str, now_ms: int, replies: Sequence[Any], kind: Kind = LOCK) -> LockState:
    pttl_raw, holder_raw, queue_raw, waiters_raw, holds_raw, *readers_raw = replies
    holds = [parse_hold(text(value)) for value in holds_raw]
    pttl = int(pttl_raw)
    holder_fields = {text(k): text(v) for k, v in dict(holder_raw).items()}
    found = kind.holders(name, holder_fields, pttl, now_ms)
    holder = found.holder
    reservation: Reservation | None = None
    # The oldest holder's age (a holder from before layout 2 may not say when it came).
    ages = [now_ms - round(info.acquired_at * 1000) for info in found.holders if info.acquired_at]
    age = max(*ages, 0) / 1000 if ages else None
    if holder is None and "reserved" in holder_fields and pttl != -2:
        reservation = Reservation(
            queue_id=holder_fields["reserved"], expires_in=max(pttl, 0) / 1000
        )
    return LockState(
        name=name,
        holder=holder,
        age=age,
        kind=kind.label,
        holders=found.holders,
        readers=found.readers,
        limit=_int(holder_fields["limit"]) if "limit" in holder_fields and pttl != -2 else None,
        reserved_slots=found.reserved_slots,
        leader=found.leader,
        reservation=reservation,
        last_fencing_token=_int(holder_fields["fence"]) if "fence" in holder_fields else None,
        typical_hold=_int(holder_fields["h"]) / 1000 if holder_fields.get("h") else None,
        queue=_queue(queue_raw, waiters_raw, now_ms),
        reader_queue=_queue(readers_raw[0], readers_raw[1], now_ms) if readers_raw else (),
        holds_ms=tuple(ms for ms, _ in holds),
        fixed_holds_ms=tuple(ms for ms, renewed in holds if not renewed),
        server_time=now_ms / 1000,
    )


def _queue(queue_raw: Any, waiters_raw: Any, now_ms: int) -> tuple[QueueEntry, ...]:
    """A wait queue from its zset's members and its hash of entries, in order."""
    entries = {text(k): text(v) for k, v in dict(waiters_raw).items()}
    order = [text(member) for member in queue_raw]
    order += sorted(set(entries) - set(order))  # an entry outside the zset: shown last
    return tuple(
        _queue_entry(queue_id, position, entries.get(queue_id), now_ms)
        for position, queue_id in enumerate(order, start=1)
    )


_GRANT_ENTRY: Final = re.compile(r"(\d+) (\d+) (\S+) (\d+) \d+ \d+ \d+ [0-9a-f]+ ")


def _queue_entry(queue_id: str, position: int, entry: str | None, now_ms: int) -> QueueEntry:
    """Parse "<expires at, Unix ms> <waiters> <host> <pid>[ <grant fields>]" (the grant
    fields, with their secret token, are not read); a missing entry is expired."""
    expires_ms, count, host, pid = 0, 0, "", 0
    if entry is not None:
        match = _GRANT_ENTRY.match(entry)
        if match is not None:
            expires_ms, count, host, pid = (
                _int(match[1]),
                _int(match[2]),
                match[3],
                _int(match[4]),
            )
        else:  # no grant fields: the host is whatever lies between the count and the pid
            parts = entry.split(" ", 2)
            if len(parts) == 3:
                expires_ms, count = _int(parts[0]), _int(parts[1])
                host, _, pid_text = parts[2].rpartition(" ")
                pid = _int(pid_text)
    return QueueEntry(
        queue_id=queue_id,
        position=position,
        host=host,
        pid=pid,
        count=count,
        expires_in=(expires_ms - now_ms) / 1000,
    )


# --------------------------------------------------------------------------- public API
async def hold_stats(
    client: AsyncClient, name: str, *, ttl: float | None = None, prefix: str = "aiolock"
) -> HoldStats:
    """How long the recent holds of lock `name` lasted, and the ttl they suggest.

    ```python
    stats = await aiolock.hold_stats(redis, "orders:42", ttl=10)
    if stats.near_ttl:
        log.warning("holds of %s approach the ttl: use ttl=%s", stats.name, stats.recommended_ttl)
    ```

    One round trip. The holds are the last (up to) 100 that ended in a release, recorded
    by the server; holds that ended by expiry are not among them.

    Args:
        client: a `redis.asyncio.Redis` or `RedisCluster`, or valkey-py's
            `valkey.asyncio.Valkey` or `ValkeyCluster`.
        name: the lock's name.
        ttl: the ttl to judge the holds against (the one your code uses); default: the
            current holder's ttl if the lock is held, else unknown (`near_ttl` is False).
        prefix: the lock's key prefix.

    Raises:
        BackendError: Redis could not be reached or refused the command.

    Cancellation:
        Safe to cancel: it only reads.

    Added in 0.1.
    """
    (state,) = await read_locks(client, [name], prefix=prefix)
    if ttl is not None:
        return summarize_holds(state.name, state.holds_ms, ttl=ttl, fixed_ms=state.fixed_holds_ms)
    return state.hold_stats()


# --------------------------------------------------------------------------- force release
@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ForceRelease:
    """What `force_release` did."""

    outcome: Literal["released", "not_held", "holder_changed", "declined"]
    holder: LockInfo | None
    """The holder that was read (and evicted, if `outcome` is "released")."""
    handed_to: str | None = None
    """Queue id the lock was handed to, or None if nobody was waiting."""


async def force_release(
    client: AsyncClient,
    name: str,
    *,
    prefix: str = "aiolock",
    confirm: Callable[[LockInfo], Awaitable[bool]] | None = None,
) -> ForceRelease:
    """Evict the current holder of `name`: read its token, then RELEASE with that token.

    Running the ordinary release script hands the lock over to the first queued process and
    announces it, as a normal release would. If the holder changed between the
    read and the release (or while `confirm` was asking), nothing is released and the
    outcome is "holder_changed": a new holder is never evicted by mistake. The evicted
    holder's watchdog finds the key gone at its next renewal and loses the lease
    (`LossReason.NOT_OWNER`), cancelling its work; if it releases first, its release
    raises `LeaseLostError` instead. One round trip to read, one MULTI/EXEC to release.

    Raises:
        BackendError: Redis could not be reached or refused the command.
    """
    client = check_client(client)
    keys = LockKeys.build(check_prefix(prefix), _check_read_name(name))
    (state,) = await read_locks(client, [name], prefix=prefix)
    if state.holder is None:
        return ForceRelease(outcome="not_held", holder=None)
    with translate_errors("inspect", name, READ_TIMEOUT):
        async with asyncio.timeout(READ_TIMEOUT):
            token_raw, fence_raw = await client.hmget(keys.lock, ["token", "fence"])
    if token_raw is None or _int(fence_raw, -1) != state.holder.fencing_token:
        return ForceRelease(outcome="holder_changed", holder=state.holder)
    if confirm is not None and not await confirm(state.holder):
        return ForceRelease(outcome="declined", holder=state.holder)
    # Forced: the holder's token is not kept as released (that record is how an owner's
    # retried release is recognised), so the evicted owner's own release reports the loss.
    args = release_args(token=text(token_raw), forced=True)
    reply = await runtime_for(client).backend.run(
        RELEASE,
        keys.scripts,
        args,
        CallOptions(timeout=READ_TIMEOUT, operation="release", name=name),
    )
    if int(reply[0]) != 1:  # 0: someone else holds it now; 2: its holder released it
        return ForceRelease(outcome="holder_changed", holder=state.holder)
    handed_to = text(reply[1])
    return ForceRelease(outcome="released", holder=state.holder, handed_to=handed_to or None)
