"""Simulated Redis servers at the transport seam: fakeredis (its Lua through lupa runs the
project's own scripts) on the simulated loop's virtual clock, with the faults a network and
a server can cause.

A process's client is a `fakeredis.FakeAsyncRedis` whose connections are `SimConnection`s on
one `SimServer`: what a connection writes runs on the server at once (atomically, as Redis
runs a script), and its reply is put on the connection's queue by `SimSocket.put_response`,
where the faults act:

- a reply delayed (each connection's replies stay in order, as on TCP; connections' replies
  overtake each other);
- a reply lost after the command ran: the connection is reset (its reader gets a connection
  error, as on a dropped TCP connection);
- a pub/sub message lost, or a whole subscription (its connection reset);
- the server restarted empty (every key, script and connection gone) or failed over to a
  replica that lags (the writes of the last `lag` seconds lost, every connection reset).

`virtual_time(loop)` puts fakeredis's clock (key expiry, the scripts' `TIME`) on the loop's
clock for the length of a run, and puts it back after: fakeredis's behaviour outside the
simulator is unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import hashlib
import heapq
import importlib
import os
import random
import time
import weakref
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fakeredis
import redis.asyncio
from fakeredis._clients._async import FakeAsyncRedisConnection, FakeReader, FakeWriter
from fakeredis._core import CommandItem, delete_keys
from fakeredis._socket import AsyncFakeSocket

from .loop import PROCESS, SimLoop

__all__ = ("EPOCH", "NetworkFaults", "SimServer", "virtual_time")

EPOCH = 1_800_000_000.0
"""The servers' wall clock at the loop's time 0 (seconds since 1970)."""

_PUSHED = (b"message", b"smessage", b"pmessage")


def _script_names() -> dict[bytes, str]:
    """Every script aiolock sends, by its SHA1 (to name an EVALSHA in the trace)."""
    from aiolock._lua.lock import Script

    names: dict[bytes, str] = {}
    for module in (
        "lock",
        "lease",
        "hash_leases",
        "semaphore",
        "rwlock",
        "redlock",
        "election",
        "fencing",
        "cluster",
    ):
        for value in vars(importlib.import_module(f"aiolock._lua.{module}")).values():
            if isinstance(value, Script):
                names[value.sha.encode()] = value.name
    return names


_SCRIPTS: dict[bytes, str] = {}


def _shown(value: Any, limit: int = 12) -> str:
    """A command's argument or a reply, short (for the trace), the same from one run of a
    seed to the next."""
    if isinstance(value, bytes):
        # this process's id, which a holder's description carries, as <pid>
        text = value.decode(errors="replace").replace(f" {os.getpid()} ", " <pid> ")
        return text if len(text) <= 48 else text[:45] + "..."
    if isinstance(value, list):
        inner = " ".join(_shown(v) for v in value[:limit])
        return f"[{inner}{' ...' if len(value) > limit else ''}]"
    return repr(value) if not isinstance(value, str) else value


def _command(fields: list[bytes]) -> str:
    """A command as the trace shows it: a script by its name."""
    if not _SCRIPTS:
        _SCRIPTS.update(_script_names())
    if fields and fields[0].upper() in (b"EVALSHA", b"EVAL") and len(fields) > 1:
        if fields[0].upper() == b"EVAL":
            sha = hashlib.sha1(fields[1]).hexdigest().encode()
        else:
            sha = fields[1].lower()
        name = _SCRIPTS.get(sha, sha[:8].decode())
        return f"script {name} {_shown(fields[2:], 16)}"
    return _shown(fields, 16)


class _Reset:
    """Put on a connection's reply queue: the connection was reset."""


RESET = _Reset()


@dataclass(slots=True)
class NetworkFaults:
    """How often each fault of the seam strikes (probabilities per reply or message)."""

    latency: float = 0.0
    """Every request, reply and pushed message takes up to this long (not a fault)."""
    delay: float = 0.0
    """A reply (or pushed message) delayed by up to `max_delay`."""
    max_delay: float = 0.0
    loss: float = 0.0
    """A reply lost after its command ran: the connection is reset."""
    message_loss: float = 0.0
    """A pub/sub message lost (the subscription stays)."""


class _OrderedWeakSet:
    """fakeredis's set of a channel's subscribers, iterated in the order they subscribed
    (a `WeakSet` iterates in the order of memory addresses: not the same from one run to
    the next)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Any]] = {}

    def add(self, item: Any) -> None:
        self._refs.setdefault(id(item), weakref.ref(item))

    def discard(self, item: Any) -> None:
        ref = self._refs.get(id(item))
        if ref is not None and ref() is item:
            del self._refs[id(item)]

    def remove(self, item: Any) -> None:
        if item not in self:
            raise KeyError(item)
        self.discard(item)

    def _live(self) -> list[Any]:
        live = [(key, ref()) for key, ref in self._refs.items()]
        for key, item in live:
            if item is None:
                del self._refs[key]
        return [item for _, item in live if item is not None]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._live())

    def __len__(self) -> int:
        return len(self._live())

    def __bool__(self) -> bool:
        return bool(self._live())

    def __contains__(self, item: Any) -> bool:
        ref = self._refs.get(id(item))
        return ref is not None and ref() is item


class SimSocket(AsyncFakeSocket):
    """A fakeredis socket whose replies go through the simulated network."""

    sim: SimServer
    owner: str
    """The process whose connection this is (for the trace)."""
    dead: bool
    clean: bool
    """The simulator's own connection (the final sweep's): no fault strikes it."""
    free_at: float
    sent_at: float

    def put_response(self, msg: Any) -> None:
        sim = self.sim
        faults = sim.faults
        rng = sim.rng
        if self.dead:
            return
        if self.clean:
            super().put_response(msg)
            return
        pushed = isinstance(msg, list) and bool(msg) and msg[0] in _PUSHED
        if pushed and faults.message_loss and rng.random() < faults.message_loss:
            sim.note("message lost")
            return
        if not pushed and faults.loss and rng.random() < faults.loss:
            sim.note("reply lost")
            self.reset()
            return
        delay = rng.uniform(0, faults.latency) if faults.latency else 0.0
        if faults.delay and rng.random() < faults.delay:
            delay += rng.uniform(0, faults.max_delay)
        loop = sim.loop
        when = max(loop.time() + delay, self.free_at)
        self.free_at = when
        if loop.tracing:
            late = f" (arrives at {when:.6f})" if when > loop.time() else ""
            sim.note(f"{self.owner} <- {_shown(msg)}{late}")
        if when <= loop.time():
            super().put_response(msg)
        else:
            # the simulator's own context: a paused process's replies still arrive
            loop.call_at(when, self._deliver, msg, context=sim.context)

    def _expireat(
        self, key: CommandItem, timestamp: float, *args: bytes, invalid_in: str | None = None
    ) -> int:
        """As Redis (and Valkey) do, an expiry set at or before now deletes the key at once
        (fakeredis keeps it until its clock moves past; found by `tests/fidelity`)."""
        done: int = super()._expireat(key, timestamp, *args, invalid_in=invalid_in)
        if done and timestamp <= self._db.time:
            delete_keys(key)
        return done

    def _keyspace_notifications(self, command_items: list[CommandItem], event: bytes) -> None:
        """None unless `notify-keyspace-events` is set, as in Redis (whose default is ""):
        fakeredis publishes every key's events to any pattern subscriber otherwise (found
        by `tests/fidelity`)."""
        if self._server.config.get(b"notify-keyspace-events", b""):
            super()._keyspace_notifications(command_items, event)

    def _deliver(self, msg: Any) -> None:
        if not self.dead:
            AsyncFakeSocket.put_response(self, msg)

    def sendall(self, data: Any) -> None:
        """A request reaches the server after the route's latency (and a delay fault), in
        order on its connection; there it runs at once."""
        if self.dead:
            return
        sim = self.sim
        delay = 0.0
        if not self.clean:
            delay = sim.rng.uniform(0, sim.faults.latency) if sim.faults.latency else 0.0
            if sim.faults.delay and sim.rng.random() < sim.faults.delay:
                delay += sim.rng.uniform(0, sim.faults.max_delay)
        loop = sim.loop
        when = max(loop.time() + delay, self.sent_at)
        self.sent_at = when
        if when <= loop.time():
            super().sendall(data)
        else:
            loop.call_at(when, self._arrive, data, context=sim.context)

    def _arrive(self, data: Any) -> None:
        if not self.dead:
            AsyncFakeSocket.sendall(self, data)

    def _process_command(self, fields: list[bytes]) -> None:
        if not self.clean:
            if fields and fields[0].upper() in (b"EVALSHA", b"EVAL"):
                self.sim.last_script = self.sim.loop.time()
            if self.sim.loop.tracing:
                self.sim.note(f"{self.owner} -> {_command(fields)}")
        super()._process_command(fields)

    def reset(self) -> None:
        """The connection drops: no more replies, its reader told, its subscriptions gone."""
        if self.dead:
            return
        self.dead = True
        server = self._server
        if server is not None:
            if server.lock.locked():  # inside a command of this server (one thread)
                self.kill()
            else:
                with server.lock:
                    self.kill()
        AsyncFakeSocket.put_response(self, RESET)


class SimConnection(FakeAsyncRedisConnection):
    """A connection to a `SimServer` (set on the subclass `SimServer.client` makes)."""

    sim: SimServer
    clean: bool = False

    async def _connect(self) -> None:
        if not self.sim.up:
            raise redis.asyncio.ConnectionError("connection refused (simulated server down)")
        sock = SimSocket(
            self.sim.fake,
            self.db,
            client_class=self._client_class,
            lua_modules=self._lua_modules,
            client_info=self._client_info,
        )
        sock.sim = self.sim
        sock.owner = PROCESS.get("") or "-"
        sock.dead = False
        sock.clean = self.clean
        sock.free_at = 0.0
        sock.sent_at = 0.0
        self._sock = sock
        self._reader = FakeReader(sock)
        self._writer = FakeWriter(sock)

    async def _read_response(self, **kwargs: Any) -> Any:
        response = await super()._read_response(**kwargs)
        if response is RESET:
            await self.disconnect()
            raise redis.asyncio.ConnectionError("connection reset (simulated)")
        return response


class SimServer:
    """One simulated Redis server (see the module docstring)."""

    def __init__(self, name: str, loop: SimLoop, rng: random.Random, faults: NetworkFaults):
        self.name = name
        self.loop = loop
        self.rng = rng
        self.faults = faults
        self.fake = fakeredis.FakeServer(version=(7, 2))
        self.fake.subscribers = defaultdict(_OrderedWeakSet)  # type: ignore[arg-type]
        self.fake.psubscribers = defaultdict(_OrderedWeakSet)  # type: ignore[arg-type]
        self.fake.ssubscribers = defaultdict(_OrderedWeakSet)  # type: ignore[arg-type]
        self.up = True
        self.last_script = 0.0
        """When a process's script last ran here (the loop's time)."""
        self.notes: list[str] = []
        self.context = contextvars.Context()
        self._replica: tuple[dict[bytes, Any], float] | None = None
        self._connection = type(f"SimConnection_{name}", (SimConnection,), {"sim": self})
        self._clean = type(
            f"CleanConnection_{name}", (SimConnection,), {"sim": self, "clean": True}
        )

    def note(self, what: str) -> None:
        self.notes.append(f"{self.loop.time():.6f} {self.name}: {what}")

    def client(self, *, clean: bool = False) -> redis.asyncio.Redis:
        """A new client (a pool of its own): one simulated process's; `clean`: the
        simulator's own, which no fault strikes."""
        return fakeredis.FakeAsyncRedis(
            server=self.fake,
            connection_class=self._clean if clean else self._connection,
            version=(7, 2),
        )

    def _sockets(self) -> list[SimSocket]:
        return [s for s in list(self.fake.sockets) if isinstance(s, SimSocket)]

    def reset_all(self) -> None:
        for sock in self._sockets():
            sock.reset()

    def drop_subscription(self) -> bool:
        """One pub/sub connection reset (its subscriptions lost); False if there is none."""
        subscribed = [s for s in self._sockets() if getattr(s, "_pubsub", 0) and not s.dead]
        if not subscribed:
            return False
        self.rng.choice(subscribed).reset()
        self.note("subscription lost")
        return True

    def restart_empty(self) -> None:
        """The server restarts with nothing: every key, script and connection gone."""
        self.reset_all()
        self._forget()
        self.note("restarted empty")

    def stop(self) -> None:
        """The server goes down: every connection reset, new ones refused until `start`."""
        self.up = False
        self.reset_all()
        self.note("down")

    def start_empty(self) -> None:
        """The server comes back (after `stop`) with nothing: no key, no script."""
        self._forget()
        self.up = True
        self.note("up again, empty")

    def _forget(self) -> None:
        with self.fake.lock:
            for db in self.fake.dbs.values():
                db._dict.clear()
                db._expiry_heap.clear()
            self.fake.script_cache.clear()

    def replicate(self) -> None:
        """The replica catches up now (what `fail_over` falls back to)."""
        with self.fake.lock:
            db = self.fake.dbs[0]
            self._replica = (copy.deepcopy(db._dict), self.loop.time())

    def fail_over(self) -> None:
        """The replica, as of its last `replicate`, takes over: later writes are lost."""
        self.reset_all()
        data, since = self._replica if self._replica is not None else ({}, 0.0)
        with self.fake.lock:
            db = self.fake.dbs[0]
            db._dict = copy.deepcopy(data)
            db._expiry_heap = [
                (item.expireat, key) for key, item in db._dict.items() if item.expireat is not None
            ]
            heapq.heapify(db._expiry_heap)
            self.fake.script_cache.clear()
        self.note(f"failed over (writes since {since:.6f} lost)")


class _Clock:
    """A `time` module whose `time()` is the loop's clock (everything else the real one's)."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop

    def time(self) -> float:
        return EPOCH + self._loop.time()

    def time_ns(self) -> int:
        return round((EPOCH + self._loop.time()) * 1e9)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)  # the real module, for what is not virtual


_TIMED = (
    "fakeredis._socket._base",
    "fakeredis._helpers",
    "fakeredis.commands_mixins.server_mixin",
    "aiolock._primitives.redlock",
    "aiolock._engine.primitive_base",
)
"""The modules whose `time.time()` is the servers' clock (and, for a Redlock's proposal
and a lease's hold time, the client's wall clock) in a run."""


@contextlib.contextmanager
def virtual_time(loop: SimLoop) -> Iterator[None]:
    """fakeredis's clock, and the wall clock aiolock reads, on `loop`'s for the block."""
    clock = _Clock(loop)
    saved: list[tuple[Any, Any]] = []
    for name in _TIMED:
        module = importlib.import_module(name)
        saved.append((module, module.time))
        module.time = clock  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module, original in saved:
            module.time = original
