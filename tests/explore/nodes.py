"""Redis servers for the explorer: synchronous fakeredis servers (Lua through lupa) whose
clock is a model variable.

One `Nodes` holds every server of a model (one for a lock, three for a Redlock) and one
clock, in whole milliseconds since `EPOCH` (the simulation's epoch, `tests.simulation.server`).
fakeredis reads the time through the modules of `_TIMED`; `virtual_time` (imported from the
simulation, not copied) puts them on `Nodes.time()` for the length of a search.

A node's data is snapshotted as the pickled `_dict` of its database (every key, field, score
and expiry) and restored from it, its expiry heap rebuilt. Its canonical form (what the
search hashes) has the keys sorted, a hash's fields and a sorted set's members sorted, and
each expiry in milliseconds from the model's time; keys already expired are dropped.
"""

from __future__ import annotations

import heapq
import pickle
from collections.abc import Hashable, Sequence
from typing import Any

import fakeredis
from fakeredis.model import Hash, XStream, ZSet
from redis.exceptions import ResponseError

from tests.simulation.server import EPOCH

__all__ = ("Nodes", "Snapshot", "plain")

Snapshot = tuple[bytes, ...]
"""Every node's pickled data, in node order."""


def plain(reply: Any) -> Any:
    """A script's reply as hashable Python values (lists as tuples)."""
    if isinstance(reply, list | tuple):
        return tuple(plain(item) for item in reply)
    return reply


def _canonical(value: Any) -> Hashable:
    if isinstance(value, Hash):
        return ("hash", tuple(sorted(value._values.items())))
    if isinstance(value, ZSet):
        return ("zset", tuple(sorted(value._bylex.items())))
    if isinstance(value, list):
        return ("list", tuple(value))
    if isinstance(value, set):
        return ("set", tuple(sorted(value)))
    if isinstance(value, bytes):
        return value
    if isinstance(value, XStream):  # an election's change log
        return ("stream", tuple((str(k), tuple(v)) for k, v in value._values_dict.items()))
    raise TypeError(f"a value of type {type(value).__name__} is not modelled")


class Nodes:
    """The model's servers and their clock (see the module docstring)."""

    def __init__(self, count: int) -> None:
        self.now_ms = 0
        self.servers = [fakeredis.FakeServer(version=(7, 2)) for _ in range(count)]
        self.clients = [fakeredis.FakeRedis(server=s, version=(7, 2)) for s in self.servers]
        self.runs = 0
        """Scripts run so far (every state's expansion counts its own)."""

    def time(self) -> float:
        """The clock `virtual_time` reads (seconds from the epoch): the model's."""
        return self.now_ms / 1000

    def _db(self, node: int) -> Any:
        return self.servers[node].dbs[0]

    def _live(self, node: int) -> dict[bytes, Any]:
        """The node's keys not expired at the model's time (the expired ones deleted)."""
        db = self._db(node)
        now = EPOCH + self.now_ms / 1000
        for key in [
            k for k, item in db._dict.items() if item.expireat is not None and item.expireat < now
        ]:
            del db._dict[key]
        return db._dict  # type: ignore[no-any-return]

    def snapshot(self) -> Snapshot:
        return tuple(pickle.dumps(self._live(node)) for node in range(len(self.servers)))

    def restore(self, snapshot: Snapshot) -> None:
        for node, data in enumerate(snapshot):
            db = self._db(node)
            db._dict = pickle.loads(data)
            db._expiry_heap = [
                (item.expireat, key) for key, item in db._dict.items() if item.expireat is not None
            ]
            heapq.heapify(db._expiry_heap)

    def canonical(self) -> Hashable:
        """Every node's live keys, canonical (see the module docstring)."""
        nodes = []
        for node in range(len(self.servers)):
            keys = []
            for key, item in sorted(self._live(node).items()):
                expiry = None
                if item.expireat is not None:
                    expiry = round((item.expireat - EPOCH) * 1000) - self.now_ms
                keys.append((key, _canonical(item.value), expiry))
            nodes.append(tuple(keys))
        return tuple(nodes)

    def expiries(self) -> list[int]:
        """The model times (ms) at which a key expires: it is gone just after them."""
        times: list[int] = []
        for node in range(len(self.servers)):
            times.extend(
                round((item.expireat - EPOCH) * 1000)
                for item in self._live(node).values()
                if item.expireat is not None
            )
        return times

    def run(self, node: int, source: str, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """Run a script on `node` at the model's time (atomically, as Redis does): its reply,
        hashable; a script error is returned as its message."""
        self.runs += 1
        try:
            reply = self.clients[node].eval(source, len(keys), *keys, *args)
        except ResponseError as exc:
            return f"error: {exc}"
        return plain(reply)

    def restart(self, node: int) -> None:
        """The node restarts empty."""
        db = self._db(node)
        db._dict.clear()
        db._expiry_heap.clear()
