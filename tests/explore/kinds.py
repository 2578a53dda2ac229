"""What the explorer knows of each primitive: its calls (the primitive's own builders), how
a node holds a lease (to judge a renewal's answer and a believing holder), the invariants
that apply to it, and how many nodes it runs on.

A primitive object is built on fakeredis asynchronous clients that are never used: only
its call builders (`_acquire_call`, `_release_call`, `_renew_call`, `_entry`) and its
configuration (ttl, margin, quorum) are read. The calls are then run by `nodes.Nodes` on
synchronous fakeredis servers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import fakeredis

from aiolock._engine.acquisition import Call, Primitive
from aiolock._engine.wait_queue import Registration
from aiolock._lua.lease import RENEW
from aiolock._lua.lock import Script
from aiolock._model.quorum_rules import Rule
from aiolock._primitives.lock import Lock
from aiolock._primitives.redlock import Redlock
from aiolock._primitives.semaphore import Semaphore

from .nodes import Nodes

__all__ = ("KINDS", "Kind", "make_kind")

NAME = "n"
"""The name every client contends for."""
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
        for call in (
            self.acquire(token="0" * 32, task="t", registration=None, claims=()),
            self.primitive._release_call(token="0" * 32),
            self.primitive._release_call(token="0" * 32, abort=True),
        ):
            found[call[0].name] = call[0]
        return found

    def acquire(
        self, *, token: str, task: str, registration: Registration | None, claims: Sequence[str]
    ) -> Call:
        """The primitive's acquire call; `registration`: the caller queues with it."""
        queue = None
        if registration is not None:
            queue = (_wid(task), 0, self.primitive._entry(registration, task))
        return self.primitive._acquire_call(token, task, queue, claims)

    def holds(self, nodes: Nodes, node: int, token: str) -> bool:
        """Whether `node` holds a lease under `token` at the model's time."""
        client = nodes.clients[node]
        key = self.primitive._key
        if self.name == "semaphore":
            value = client.hget(key, f"p:{token}")
            if value is None:
                return False
            expires = int(value.split()[1])
            return expires > nodes.now_ms + _epoch_ms()
        return bool(client.hget(key, "token") == token.encode())


def _epoch_ms() -> int:
    from tests.simulation.server import EPOCH

    return round(EPOCH * 1000)


def _wid(task: str) -> str:
    """A client's wait queue id (one process per client, one queue per name)."""
    return f"{0xA0 + int(task[1:]):016x}"


def make_kind(name: str) -> Kind:
    """The primitive `name` ("lock", "semaphore", "redlock") on fresh, unused clients."""
    servers = [fakeredis.FakeServer(version=(7, 2)) for _ in range(3)]
    clients: list[Any] = [fakeredis.FakeAsyncRedis(server=s, version=(7, 2)) for s in servers]
    if name == "lock":
        lock = Lock(clients[0], NAME, ttl=TTL)
        return Kind("lock", lock, 1, 1, True, True, 1, None)
    if name == "semaphore":
        semaphore = Semaphore(clients[0], NAME, limit=2, ttl=TTL)
        return Kind("semaphore", semaphore, 1, 2, False, False, 1, None)
    if name == "redlock":
        redlock = Redlock(clients, NAME, ttl=TTL)
        votes = redlock._votes
        assert votes is not None
        return Kind("redlock", redlock, 3, 1, False, False, redlock._quorum.quorum, votes.acquire)
    raise ValueError(f"no kind {name!r}")


KINDS = ("lock", "semaphore", "redlock")
