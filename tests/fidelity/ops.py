"""The calls a fidelity sequence is made of: one dataclass per kind of call aiolock makes,
each built into a script call by the primitives' own call-builders (`_acquire_call`,
`_release_call`, `_renew_call`, `_resume_call`, `_entry`) or, where the engine builds the
arguments inline (a semaphore's several permits and its limit, an election's record, fenced
storage), with the same arguments in the same order as that code.

An operation is data (printable, shrinkable); `build(ctx)` turns it into a `Step` for one
backend. Only two things differ between backends: a Redlock's proposed token (the client's
clock, read when the call is built: the fake's virtual clock or the real one) and what a
call refers to from earlier replies (a fencing token, per backend in `Context.fences`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio

from aiolock import Election, Lock, ReadWriteLock, Redlock, Semaphore
from aiolock._engine.primitive_base import Call, PrimitiveBase
from aiolock._engine.wait_queue import Registration
from aiolock._lua.election import EL_ANNOUNCE, EL_PROCLAIM, EL_READ, EL_SUCCESSOR
from aiolock._lua.fencing import FENCED_DELETE, FENCED_GET, FENCED_SET, MAX_FENCING_TOKEN
from aiolock._lua.hash_leases import EXPIRE_LEASES
from aiolock._lua.layout import permits_key
from aiolock._lua.lock import INSPECT
from aiolock._lua.redlock import RL_FENCE
from aiolock._lua.semaphore import SEM_ACQUIRE_SEVERAL, SEM_SET_LIMIT
from aiolock._model.holder import HOST, pid
from aiolock._primitives.semaphore import BARRIER_MS

__all__ = (
    "FAMILIES",
    "TOKENS",
    "WIDS",
    "Acquire",
    "Command",
    "Context",
    "Expire",
    "ExpireLeases",
    "Op",
    "Primitives",
    "Release",
    "Step",
)

TTL_MS = 60_000
"""Every lease's ttl: long enough that nothing expires by itself during a sequence (time
passes only by `Expire`)."""

TOKENS = (
    "ab12cd34ef56ab78cd90ef12ab34cd56",
    "ba21dc43fe65ba87dc09fe21ba43dc65",
    "cafe0b0e1dea5eed0badf00d0ddba11a",
    "deadbeefc0ffee0ddfacade0bead5eed",
)
"""The tokens calls use (leases' tokens, grant tokens of queue entries): few, so that calls
collide (the same holder twice, another's token, a released one). No run of 9 digits in
them: the normalisation would take it for a time."""

WIDS = ("p0a1b2c3de4f5a6b7", "p9f8e7d6c5b4a3f2e", "c3d4e5f6a7b8c9d0")
"""Wait queue ids: two of processes whose grants may be told to them alone ("p" and a
channel id, as `WaitQueue` makes them) and one without (a process of an earlier layout)."""

IDENTITIES = ("node-a", "node-b")
"""The election candidates' identities (an `Election` object each)."""

TASK = "Task-7"


@dataclass(frozen=True, slots=True)
class Command:
    """A plain command (the "time passes" steps)."""

    args: tuple[str | int, ...]


Step = Call | Command
"""What one operation sends to one backend."""


class Primitives:
    """The primitives whose call-builders make the calls. Their client is never used: they
    only build arguments."""

    def __init__(self) -> None:
        client = redis.asyncio.Redis()  # never connected: the builders send nothing
        nodes = [redis.asyncio.Redis(port=port) for port in (1, 2, 3)]
        self.lock = Lock(client, "L", ttl=TTL_MS / 1000)
        self.sem = Semaphore(client, "S", limit=2, ttl=TTL_MS / 1000)
        rw = ReadWriteLock(client, "RW", ttl=TTL_MS / 1000)
        self.read: PrimitiveBase = rw.read()
        self.write: PrimitiveBase = rw.write()
        self.redlock = Redlock(nodes, "RL", ttl=TTL_MS / 1000)
        self.elections = tuple(
            Election(client, "E", ttl=TTL_MS / 1000, identity=identity) for identity in IDENTITIES
        )
        self.fenced_key = "F:{fenced}"

    def leased(self, name: str) -> PrimitiveBase:
        """The primitive an `Acquire`/`Release`/`Renew`/`Resume` names."""
        if name.startswith("seat"):
            return self.elections[int(name[-1])]._seat
        prim: PrimitiveBase = getattr(self, name)
        return prim

    def keys(self, family: str) -> tuple[str, ...]:
        """Every key a family's scripts write (what `Expire` may expire)."""
        if family == "lock":
            k = self.lock._keys
            return (k.lock, k.queue, k.waiters, k.holds)
        if family == "sem":
            return tuple(self.sem._script_keys)
        if family == "rw":
            return tuple(dict.fromkeys((*self.read._release_keys, *self.write._release_keys)))
        if family == "redlock":
            return (self.redlock._key,)
        if family == "election":
            seat = self.elections[0]._seat
            return tuple(dict.fromkeys((*seat._transfer_keys, *seat._release_keys)))
        return (self.fenced_key,)


@dataclass(slots=True)
class Context:
    """What building a backend's calls needs: the primitives, and the fencing tokens this
    backend gave each token (by its replies)."""

    prims: Primitives
    fences: dict[int, int] = field(default_factory=dict)
    last_fence: int | None = None
    sent: list[Step] = field(default_factory=list)

    def remember(self, token: int, reply: Any) -> None:
        """Note the fencing token of an acquire's reply (an integer, or {1, token, ...})."""
        fence: Any = None
        if isinstance(reply, int):
            fence = reply
        elif isinstance(reply, list) and len(reply) > 1 and reply[0] == 1:
            fence = reply[1]
        try:
            value = int(fence)
        except (TypeError, ValueError):
            return
        self.fences[token] = value
        self.last_fence = value


class Op:
    """One call of a sequence."""

    def build(self, ctx: Context) -> Step:
        raise NotImplementedError

    def after(self, ctx: Context, reply: Any) -> None:
        """Called with this backend's reply (an acquire notes its fencing token)."""


@dataclass(frozen=True, slots=True)
class Queue:
    """A wait queue's entry, as `PrimitiveBase._entry` writes it: queue `wid`, `behind`
    waiters of the process behind the caller, registration `seq` with grant token `reg`."""

    wid: int
    behind: int
    seq: int
    reg: int

    def entry(self, prim: PrimitiveBase) -> str:
        registration = Registration(self.seq, TOKENS[self.reg], 0.0, prim._grant_ms)
        return prim._entry(registration, TASK)


@dataclass(frozen=True, slots=True)
class Acquire(Op):
    """`_acquire_call` of a lock, a semaphore's permit, a read-write lock's side or an
    election's seat: tried alone (`queue` None) or putting its process's queue in line,
    claiming grants to `claims`."""

    prim: str
    token: int
    queue: Queue | None = None
    claims: tuple[int, ...] = ()

    def build(self, ctx: Context) -> Step:
        prim = ctx.prims.leased(self.prim)
        queue = None
        if self.queue is not None:
            queue = (WIDS[self.queue.wid], self.queue.behind, self.queue.entry(prim))
        return prim._acquire_call(TOKENS[self.token], TASK, queue, [TOKENS[c] for c in self.claims])

    def after(self, ctx: Context, reply: Any) -> None:
        ctx.remember(self.token, reply)


@dataclass(frozen=True, slots=True)
class Release(Op):
    """`_release_call`: a release (`mode` "", "abort", "force" or "look"), with the
    retention and hold the engine sends, withdrawing a queue or putting one in line."""

    prim: str
    token: int | None
    mode: str = ""
    retain_ms: int | None = None
    held_ms: int | None = None
    renewed: bool = True
    withdraw: int | None = None
    join: tuple[Queue, int] | None = None
    claims: tuple[int, ...] = ()

    def build(self, ctx: Context) -> Step:
        prim = ctx.prims.leased(self.prim)
        join = None
        if self.join is not None:
            queue, count = self.join
            join = (WIDS[queue.wid], queue.entry(prim), count)
        return prim._release_call(
            token="" if self.token is None else TOKENS[self.token],
            retain_ms=self.retain_ms,
            held_ms=self.held_ms,
            renewed=self.renewed,
            abort=self.mode == "abort",
            forced=self.mode == "force",
            look_at_queue=self.mode == "look",
            withdraw="" if self.withdraw is None else WIDS[self.withdraw],
            join=join,
            claims=[TOKENS[c] for c in self.claims],
        )


@dataclass(frozen=True, slots=True)
class Renew(Op):
    """`_renew_call` (a semaphore's of `permits` permits; a Redlock's node with its
    fencing token when `fenced`, as the watchdog's `_renewal_kind` makes it)."""

    prim: str
    token: int
    ttl_ms: int = TTL_MS
    permits: int = 1
    fenced: bool = False

    def build(self, ctx: Context) -> Step:
        prim = ctx.prims.leased(self.prim)
        script, keys, args = prim._renew_call(TOKENS[self.token], self.ttl_ms, self.permits)
        if self.fenced:
            fence = ctx.fences.get(self.token, 1)
            args = [args[0], args[1], prim._renewal_kind(fence, self.permits)]
        return script, keys, args


@dataclass(frozen=True, slots=True)
class Resume(Op):
    """`_resume_call`: a lease taken up again by its token."""

    prim: str
    token: int

    def build(self, ctx: Context) -> Step:
        return ctx.prims.leased(self.prim)._resume_call(TOKENS[self.token], TTL_MS)

    def after(self, ctx: Context, reply: Any) -> None:
        ctx.remember(self.token, reply)


@dataclass(frozen=True, slots=True)
class Inspect(Op):
    """INSPECT of the lock (`Lock.info()`)."""

    def build(self, ctx: Context) -> Step:
        k = ctx.prims.lock._keys
        return INSPECT, (k.lock, k.queue, k.waiters), []


@dataclass(frozen=True, slots=True)
class Several(Op):
    """SEM_ACQUIRE_SEVERAL, as `Semaphore._try_several` sends it."""

    token: int
    permits: int
    barrier: bool

    def build(self, ctx: Context) -> Step:
        sem = ctx.prims.sem
        args: list[str | int] = [
            TOKENS[self.token],
            TTL_MS,
            f"{HOST} {pid()} {TASK}",
            sem.limit,
            self.permits,
            BARRIER_MS,
            "1" if self.barrier else "",
        ]
        return SEM_ACQUIRE_SEVERAL, sem._script_keys, args

    def after(self, ctx: Context, reply: Any) -> None:
        ctx.remember(self.token, reply)


@dataclass(frozen=True, slots=True)
class SetLimit(Op):
    """SEM_SET_LIMIT, as `Semaphore.set_limit` sends it."""

    limit: int

    def build(self, ctx: Context) -> Step:
        sem = ctx.prims.sem
        return SEM_SET_LIMIT, sem._script_keys, ["", self.limit, round(sem._config.retain * 1000)]


@dataclass(frozen=True, slots=True)
class RlAcquire(Op):
    """A Redlock's acquire on one node (`Redlock._acquire_call`: the proposed token is the
    client's clock, a little ahead)."""

    token: int

    def build(self, ctx: Context) -> Step:
        return ctx.prims.redlock._acquire_call(TOKENS[self.token], TASK, None, [])

    def after(self, ctx: Context, reply: Any) -> None:
        ctx.remember(self.token, reply)


@dataclass(frozen=True, slots=True)
class RlFence(Op):
    """RL_FENCE: the quorum's agreed token (this node's, plus `ahead`) given to the node."""

    token: int
    ahead: int

    def build(self, ctx: Context) -> Step:
        agreed = ctx.fences.get(self.token, 1) + self.ahead
        return RL_FENCE, (ctx.prims.redlock._key,), [TOKENS[self.token], agreed]


@dataclass(frozen=True, slots=True)
class Announce(Op):
    """EL_ANNOUNCE, as `Election._announce` sends it."""

    seat: int
    token: int
    value: str

    def build(self, ctx: Context) -> Step:
        election = ctx.prims.elections[self.seat]
        return (
            EL_ANNOUNCE,
            election._record_keys,
            [TOKENS[self.token], election.identity, self.value],
        )


@dataclass(frozen=True, slots=True)
class Proclaim(Op):
    """EL_PROCLAIM, as `Term.proclaim` sends it (`number`: the proclamation's)."""

    token: int
    value: str
    number: int

    def build(self, ctx: Context) -> Step:
        election = ctx.prims.elections[0]
        return EL_PROCLAIM, election._record_keys, [TOKENS[self.token], self.value, self.number]


@dataclass(frozen=True, slots=True)
class Read(Op):
    """EL_READ, as `Election._read` sends it: "" (the newest id alone) or "0-1" (the log
    from its start, as an observer's first read after "0-0")."""

    first: str

    def build(self, ctx: Context) -> Step:
        return EL_READ, ctx.prims.elections[0]._record_keys, [self.first]


@dataclass(frozen=True, slots=True)
class Successor(Op):
    """EL_SUCCESSOR, as `Term.transfer` sends it."""

    token: int
    identity: int

    def build(self, ctx: Context) -> Step:
        seat = ctx.prims.elections[0]._seat
        return EL_SUCCESSOR, seat._successor_keys, [TOKENS[self.token], IDENTITIES[self.identity]]


FENCES = ("1", "7", "lease", str(MAX_FENCING_TOKEN))
"""Fenced storage's tokens: constants, and "lease": the last fencing token this backend
issued in the sequence (per backend, as a holder would pass its lease's)."""


def _fence(ctx: Context, choice: str) -> str:
    if choice == "lease":
        return str(ctx.last_fence if ctx.last_fence is not None else 3)
    return choice


@dataclass(frozen=True, slots=True)
class FencedSet(Op):
    """FENCED_SET, as `fenced_set` sends it."""

    fence: str
    value: str
    ttl_ms: int | str
    """ms, or "" for none."""

    def build(self, ctx: Context) -> Step:
        args: list[str | int] = [_fence(ctx, self.fence), self.value, self.ttl_ms]
        return FENCED_SET, (ctx.prims.fenced_key,), args


@dataclass(frozen=True, slots=True)
class FencedDelete(Op):
    """FENCED_DELETE, as `fenced_delete` sends it."""

    fence: str
    keep_ms: int | str
    """ms, or "" for the expiry it had."""

    def build(self, ctx: Context) -> Step:
        args: list[str | int] = [_fence(ctx, self.fence), self.keep_ms]
        return FENCED_DELETE, (ctx.prims.fenced_key,), args


@dataclass(frozen=True, slots=True)
class FencedGet(Op):
    """FENCED_GET, as `fenced_get` sends it."""

    def build(self, ctx: Context) -> Step:
        return FENCED_GET, (ctx.prims.fenced_key,), []


@dataclass(frozen=True, slots=True)
class Expire(Op):
    """Time passes for one key: `PEXPIRE key 0` (it is gone, as if its ttl had run out).
    The only way time passes in a sequence: deterministic on every backend."""

    family: str
    key: int

    def build(self, ctx: Context) -> Step:
        keys = ctx.prims.keys(self.family)
        return Command(("PEXPIRE", keys[self.key % len(keys)], 0))


@dataclass(frozen=True, slots=True)
class ExpireLeases(Op):
    """Time passes for the leases a semaphore or a read-write lock holds in fields:
    EXPIRE_LEASES, as `aiolock.testing.expire_now` sends it (a semaphore's slot, or every
    permit; a read-write lock's side)."""

    family: str
    which: str

    def build(self, ctx: Context) -> Step:
        if self.family == "sem":
            sem = ctx.prims.sem
            return EXPIRE_LEASES, (sem.key, permits_key(sem.key)), [self.which]
        return EXPIRE_LEASES, (ctx.prims.read._key,), [self.which]


@dataclass(frozen=True, slots=True)
class Again(Op):
    """A late copy: the call sent `back` steps ago, sent again as it was (a retry after a
    lost reply, or a copy that arrives after its caller gave up)."""

    back: int

    def build(self, ctx: Context) -> Step:
        sent: Sequence[Step] = ctx.sent
        if not sent:
            return Command(("PING",))
        return sent[-min(self.back, len(sent))]


FAMILIES = ("lock", "sem", "rw", "redlock", "election", "fenced")
"""The families of calls; a sequence draws one (its calls then collide on its keys)."""
