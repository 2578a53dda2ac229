"""What the explorer knows of each primitive: its calls (the primitive's own builders), how
a node holds a lease (to judge a renewal's answer and a believing holder), the invariants
that apply to it, and how many nodes it runs on.

A primitive object is built on fakeredis asynchronous clients that are never used: only
its call builders (`_acquire_call`, `_release_call`, `_renew_call`, `_entry`) and its
configuration (ttl, margin, quorum) are read. A read-write lock's clients each call one
side (`Kind.of`); a lock on two names has one primitive per name; an election's winner
also announces its term with EL_ANNOUNCE on `Kind.record`. The calls are then run by `nodes.Nodes` on
synchronous fakeredis servers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import fakeredis

from aiolock._engine.acquisition import Call, Primitive
from aiolock._engine.wait_queue import Registration
from aiolock._lua.election import EL_ACQUIRE, EL_ANNOUNCE
from aiolock._lua.lease import RENEW
from aiolock._lua.lock import Script
from aiolock._model.quorum_rules import Rule
from aiolock._primitives.election import Election
from aiolock._primitives.lock import Lock
from aiolock._primitives.redlock import Redlock
from aiolock._primitives.rwlock import ReadWriteLock
from aiolock._primitives.semaphore import Semaphore

from .nodes import Nodes

__all__ = ("KINDS", "Kind", "make_kind")

NAME = "n"
"""The name every client contends for (the first name, with several)."""
NAMES = ("n", "m")
"""The names clients may pick from (`--names`)."""
TTL = 1.0
"""The leases' ttl (s): 1000 ms of model time."""


@dataclasses.dataclass(frozen=True, slots=True)
class Kind:
    """One primitive under exploration (see the module docstring)."""

    name: str
    primitive: Primitive
    nodes: int
    limit: int
    """Most holders that may believe they hold at once."""
    fenced: bool
    """Fencing tokens issued strictly increasing (checked at each grant)."""
    queues: bool
    """Its clients may wait in the queue in Redis (a lock's: the grant path)."""
    quorum: int
    acquire_votes: Rule | None
    """A Redlock's acquire rule (`_model.quorum_rules`), else None."""
    table: tuple[tuple[Primitive, ...], ...] = ()
    """The primitives by name, then by side: `[name][0]` the read side (or the only one),
    `[name][1]` the write side of a read-write lock. Empty: `primitive` alone."""
    writers: int = 0
    """A read-write lock's: how many clients (the first ones) write; the others read."""
    record: tuple[str, ...] = ()
    """An election's: the KEYS of EL_ANNOUNCE (the leader's record and the change log);
    a candidate that wins a term announces it there. Empty: nothing is announced."""

    @property
    def names(self) -> int:
        """How many names the clients pick from."""
        return max(1, len(self.table))

    def writes(self, cid: int) -> bool:
        """Whether client `cid` takes the write side (of a read-write lock)."""
        return cid < self.writers

    def of(self, cid: int, name: int = 0) -> Primitive:
        """The primitive client `cid` calls on name `name` (its side of a read-write lock)."""
        if not self.table:
            return self.primitive
        sides = self.table[name]
        return sides[1] if len(sides) > 1 and self.writes(cid) else sides[0]

    @property
    def validity_ms(self) -> int:
        """How long a lease is believed held from the send of its acquire or renewal: the
        engine's own `ttl - margin` (`_engine.acquisition`)."""
        config = self.primitive._config
        return round((config.ttl - config.margin) * 1000)

    @property
    def ttl_ms(self) -> int:
        return self.primitive._config.ttl_ms

    def scripts(self) -> dict[str, Script]:
        """Every script its calls name, by name."""
        found: dict[str, Script] = {RENEW.name: RENEW}
        if self.record:
            found.update({EL_ACQUIRE.name: EL_ACQUIRE, EL_ANNOUNCE.name: EL_ANNOUNCE})
        every = [p for sides in self.table for p in sides] or [self.primitive]
        for primitive in every:
            for call in (
                primitive._acquire_call("0" * 32, "t", None, ()),
                primitive._release_call(token="0" * 32),
                primitive._release_call(token="0" * 32, abort=True),
                primitive._renew_call("0" * 32, 1000),
            ):
                found[call[0].name] = call[0]
        return found

    def acquire(
        self,
        *,
        primitive: Primitive,
        token: str,
        task: str,
        registration: Registration | None,
        claims: Sequence[str],
    ) -> Call:
        """`primitive`'s acquire call; `registration`: the caller queues with it."""
        queue = None
        if registration is not None:
            queue = (_wid(task), 0, primitive._entry(registration, task))
        return primitive._acquire_call(token, task, queue, claims)

    def holds(self, nodes: Nodes, node: int, token: str, key: str, side: int | None = None) -> bool:
        """Whether `node` holds a lease under `token` in the primitive's `key` at the
        model's time; a read-write lock's, on `side` (0 read, 1 write) unless None."""
        client = nodes.clients[node]
        if self.name in ("semaphore", "rwlock"):
            value = client.hget(key, f"p:{token}")
            if value is None:
                return False
            slot, expires = (int(x) for x in value.split()[:2])
            if side is not None and slot != side:
                return False
            return expires > nodes.now_ms + _epoch_ms()
        return bool(client.hget(key, "token") == token.encode())


def _epoch_ms() -> int:
    from tests.simulation.server import EPOCH

    return round(EPOCH * 1000)


def _wid(task: str) -> str:
    """A client's wait queue id (one process per client, one queue per name)."""
    return f"{0xA0 + int(task[1:]):016x}"


def make_kind(name: str, *, names: int = 1, writers: int = 1) -> Kind:
    """The primitive `name` ("lock", "semaphore", "redlock", "rwlock") on fresh, unused
    clients; a lock on `names` names (1 or 2); a read-write lock whose first `writers`
    clients write."""
    servers = [fakeredis.FakeServer(version=(7, 2)) for _ in range(3)]
    clients: list[Any] = [fakeredis.FakeAsyncRedis(server=s, version=(7, 2)) for s in servers]
    if names != 1 and (name != "lock" or not 1 <= names <= len(NAMES)):
        raise ValueError(f"several names are explored for a lock only, at most {len(NAMES)}")
    if name == "lock":
        locks = tuple((Lock(clients[0], n, ttl=TTL),) for n in NAMES[:names])
        return Kind("lock", locks[0][0], 1, 1, True, True, 1, None, locks if names > 1 else ())
    if name == "election":
        election = Election(clients[0], NAME, ttl=TTL, identity="candidate")
        seat = election._seat
        record = election._record_keys
        return Kind("election", seat, 1, 1, True, True, 1, None, record=record)
    if name == "rwlock":
        rw = ReadWriteLock(clients[0], NAME, ttl=TTL)
        sides = ((rw.read(), rw.write()),)
        return Kind("rwlock", rw.write(), 1, 1, False, True, 1, None, sides, writers)
    if name == "semaphore":
        semaphore = Semaphore(clients[0], NAME, limit=2, ttl=TTL)
        return Kind("semaphore", semaphore, 1, 2, False, False, 1, None)
    if name == "redlock":
        redlock = Redlock(clients, NAME, ttl=TTL)
        votes = redlock._votes
        assert votes is not None
        return Kind("redlock", redlock, 3, 1, False, False, redlock._quorum.quorum, votes.acquire)
    raise ValueError(f"no kind {name!r}")


KINDS = ("lock", "semaphore", "redlock", "rwlock", "election")
