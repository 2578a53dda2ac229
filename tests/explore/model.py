"""A state of the explored system, its moves and its invariants.

A state is the model's time (ms), every node's data (`nodes.Snapshot`), each client's state
machine (`Client`) and the budgets of faults used so far. A client is idle, acquiring,
queued (its entry is in the wait queue in Redis), holding or releasing; it has at most one
call on its main connection per node (an acquire, a release, an abort) and one on its
renewal connection per node (a renewal), each either a request in flight (not run yet) or a
reply in flight (run): the order within a connection is kept by construction, and calls
on different connections, or of different clients, are delivered in any order.

Moves (`Explorer.moves`), each one step of a trace:

- a client sends an acquire (a fresh token, on the name it picks for the acquisition when
  there are several: one move per name; a queued client sends it again with a fresh
  registration and claims its earlier ones), a renewal, or a release;
- a request is delivered: its script runs on its node at the model's time (atomically);
- a reply is delivered: the client reads it with the engine's parser (`acquired`,
  `released`), or is lost after its command ran (the client sends the same call again, as
  redis-py retries; a lost renewal is dropped);
- a client pauses, or resumes: a paused client takes no step (requests already sent are
  still delivered, its replies wait);
- time advances to the next point where something changes: a client's local deadline (or
  one millisecond before it), a key's expiry (or one millisecond after it);
- a node restarts empty (the model's time moves on by 1 ms: a restart takes time); every
  call in flight to it is lost and sent again, a renewal dropped; the leases held then are
  marked stale (a restart without persistence loses them: mutual exclusion is not claimed
  across it, the fencing order is).

The invariants are checked in every state reached (`Explorer.violation`) and at every
script run (`Explorer.deliver`): see `docs/exploration.md`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from typing import Any

from aiolock._engine.wait_queue import Registration
from aiolock._lua.election import EL_ANNOUNCE
from aiolock._lua.lock import acquired, released

from .kinds import Kind
from .nodes import Nodes, Snapshot

__all__ = ("Bounds", "Client", "Explorer", "Op", "State", "Step")


@dataclasses.dataclass(frozen=True, slots=True)
class Bounds:
    """The bounds of a search (besides its depth)."""

    clients: int = 3
    queued: int = 1
    """How many of the clients (the last ones) wait in the queue in Redis when refused."""
    cycles: int = 2
    """Acquisitions each client starts, at most."""
    restarts: int = 1
    losses: int = 1
    pauses: int = 1
    drift_bound: bool = True
    """A client's local clock keeps time during a pause (the clock-drift assumption: its
    deadline is then before the server's expiry). False: a paused client's clock stops
    (its deadline moves on by the pause), as a process frozen by a GC or a VM pause sees it."""
    agreement: bool = True
    """Check that a client that believes it holds is held by (a quorum of) the nodes;
    False: mutual exclusion alone (two believing holders)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Op:
    """One call on one connection of a client, to one node."""

    what: str
    """"acquire", "release", "abort", "renew" or "announce" (an election's)."""
    node: int
    script: str
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    sent_at: int
    ran: bool = False
    reply: Any = None

    def describe(self) -> str:
        args = " ".join(str(a) if a != "" else "''" for a in self.args)
        return f"{self.script.upper()} on node {self.node} KEYS {' '.join(self.keys)} ARGV {args}"


@dataclasses.dataclass(frozen=True, slots=True)
class Client:
    """One client's state machine (see the module docstring)."""

    cid: int
    queues: bool
    phase: str = "idle"
    token: str = ""
    fence: int = 0
    deadline: int = -1
    """The local deadline (model ms) of the lease believed held."""
    main: tuple[Op, ...] = ()
    renewals: tuple[Op, ...] = ()
    registrations: tuple[str, ...] = ()
    """Its registrations in the wait queue in Redis (the tokens a grant may be under)."""
    issued: int = 0
    """Tokens made so far (each token's first digits are the client's and this count)."""
    cycles: int = 0
    paused_at: int = -1
    stale: bool = False
    """Its lease was taken before a restart of the (single) node: left out of the mutual
    exclusion until its next acquire."""
    replies: tuple[tuple[int, Any], ...] = ()
    """A quorum's call: the replies read so far, by node."""
    name: int = 0
    """The name its current (or last) acquisition is on, picked at each cycle's start."""
    announced: bool = False
    """An election's: the term it holds is announced (EL_ANNOUNCE answered 1)."""

    @property
    def task(self) -> str:
        return f"t{self.cid}"

    def believes(self, now: int) -> bool:
        return self.phase == "holding" and now < self.deadline and not self.stale

    def new_token(self) -> tuple[Client, str]:
        token = f"{self.cid + 1:02x}{self.issued + 1:014x}" + "0" * 16
        return dataclasses.replace(self, issued=self.issued + 1), token


@dataclasses.dataclass(frozen=True, slots=True)
class State:
    now: int
    data: Snapshot
    clients: tuple[Client, ...]
    restarts: int = 0
    losses: int = 0
    pauses: int = 0
    top: tuple[tuple[int, str], ...] = ()
    """By name: the highest fencing token issued so far, and the token it was issued to."""
    canon: bytes = b""
    """A digest of the nodes' data in canonical form (`Nodes.canonical`): what stands for
    `data` in the state's key."""


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """A move taken: what it was, the call and its reply (if any), and the state it led to;
    `violation` says what went wrong there, if something did."""

    text: str
    state: State
    violation: str | None = None

    def key(self) -> bytes:
        """The state's key: everything but the pickled data, which `canon` stands for."""
        s = self.state
        seen = (s.now, s.canon, s.clients, s.restarts, s.losses, s.pauses, s.top)
        return _digest(seen)


def _set(c: Client, conn: str, ops: tuple[Op, ...]) -> Client:
    """`c` with the calls of connection `conn` ("main" or "renewals") replaced."""
    if conn == "main":
        return dataclasses.replace(c, main=ops)
    return dataclasses.replace(c, renewals=ops)


def _heads(ops: tuple[Op, ...], *, ran: bool) -> list[int]:
    """The calls first in line on their connection to their node: the first request not
    run yet (`ran` False), or the first reply not read yet (`ran` True)."""
    heads, seen = [], set()
    for k, op in enumerate(ops):
        if op.node in seen:
            continue
        if op.ran is ran:
            heads.append(k)
            seen.add(op.node)
        elif ran:  # a reply is read in order: an earlier call on the node still runs
            seen.add(op.node)
    return heads


def _digest(value: Any) -> bytes:
    return hashlib.blake2b(repr(value).encode(), digest_size=16).digest()


class Explorer:
    """The moves and invariants of one kind under given bounds, on `nodes`."""

    def __init__(self, kind: Kind, bounds: Bounds, nodes: Nodes) -> None:
        self.kind = kind
        self.bounds = bounds
        self.nodes = nodes
        self.scripts = kind.scripts()
        self.validity = kind.validity_ms
        self._loaded: tuple[Snapshot, int] | None = None
        self._runs: dict[tuple[Any, ...], tuple[Any, Snapshot, bytes, bool | None]] = {}
        self._held: dict[tuple[Snapshot, int, int, str, int, int | None], bool] = {}
        self._timed: dict[tuple[Snapshot, int], tuple[Snapshot, bytes]] = {}

    def initial(self) -> State:
        first_queued = self.bounds.clients - self.bounds.queued
        clients = tuple(
            Client(cid, queues=self.kind.queues and self._queues(cid, first_queued))
            for cid in range(self.bounds.clients)
        )
        data, canon = self._settle()
        top = ((0, ""),) * self.kind.names
        return State(0, data, clients, top=top, canon=canon)

    def _queues(self, cid: int, first_queued: int) -> bool:
        """Whether client `cid` waits in the queue in Redis when refused: the last
        `bounds.queued` clients; a read-write lock's writers (the first clients) instead."""
        if self.kind.writers:
            return cid < min(self.bounds.queued, self.kind.writers)
        return cid >= first_queued

    # ------------------------------------------------------------------ moves
    def moves(self, state: State) -> Iterator[Step]:
        """The moves from `state`, reduced: when a client that is not paused has a reply to
        read, only its own moves, time and restarts are taken (see `_reading`)."""
        reader = self._reading(state)
        for i, client in enumerate(state.clients):
            if reader is None or reader == i:
                yield from self._client_moves(state, i, client, reading=reader == i)
        yield from self._advance(state)
        if state.restarts < self.bounds.restarts:
            for node in range(self.kind.nodes):
                yield self._restart(state, node)

    def _load(self, data: Snapshot, now: int) -> None:
        """The nodes hold `data` at time `now` (restored unless they hold it already)."""
        if self._loaded != (data, now):
            self.nodes.now_ms = now
            self.nodes.restore(data)
            self._loaded = (data, now)

    def _settle(self) -> tuple[Snapshot, bytes]:
        """The nodes' data after a change, and its canonical digest."""
        data = self.nodes.snapshot()
        self._loaded = (data, self.nodes.now_ms)
        return data, _digest(self.nodes.canonical())

    def held(self, state: State, node: int, c: Client) -> bool:
        """Whether `node` holds `c`'s lease in `state`, on its side (cached)."""
        side = (1 if self.kind.writes(c.cid) else 0) if self.kind.writers else None
        key = (state.data, state.now, node, c.token, c.name, side)
        found = self._held.get(key)
        if found is None:
            self._load(state.data, state.now)
            primitive_key = self.kind.of(c.cid, c.name)._key
            found = self.kind.holds(self.nodes, node, c.token, primitive_key, side)
            self._held[key] = found
        return found

    def _step(
        self,
        state: State,
        text: str,
        clients: tuple[Client, ...],
        data: tuple[Snapshot, bytes] | None = None,
        **changes: Any,
    ) -> Step:
        if data is not None:
            changes.update(data=data[0], canon=data[1])
        new = dataclasses.replace(state, clients=clients, **changes)
        return Step(f"t={state.now}ms {text}", new, self.violation(new))

    @staticmethod
    def _with(state: State, i: int, client: Client) -> tuple[Client, ...]:
        return (*state.clients[:i], client, *state.clients[i + 1 :])

    def _reading(self, state: State) -> int | None:
        """The first client that is not paused and has a reply to read, if any.

        Reading a reply touches no node and no other client: it commutes with every other
        client's move and with every delivery, and the invariants cannot tell the orders
        apart (a client that reads sooner believes sooner: the states of the other order
        break nothing more). So the reply is read before any of those moves (a partial-order
        reduction); the client may still lose the reply, pause, or let time advance or a
        node restart first, which do not commute with the read.
        """
        for i, c in enumerate(state.clients):
            if c.paused_at < 0 and (_heads(c.main, ran=True) or _heads(c.renewals, ran=True)):
                return i
        return None

    def _client_moves(self, state: State, i: int, c: Client, *, reading: bool) -> Iterator[Step]:
        now = state.now
        # the network: requests delivered (a paused client's too), replies lost
        for conn in ("main", "renewals"):
            if not reading:
                for k in _heads(getattr(c, conn), ran=False):
                    delivered = self.deliver(state, i, conn, k)
                    yield delivered
                    if c.paused_at < 0 and delivered.violation is None:
                        read = self._read_now(delivered, i, conn, k)
                        if read is not None:
                            yield read
            if state.losses < self.bounds.losses:
                for k in _heads(getattr(c, conn), ran=True):
                    yield self._lose(state, i, conn, k)
        if c.paused_at >= 0:
            yield self._resume(state, i)
            return
        for conn in ("main", "renewals"):
            for k in _heads(getattr(c, conn), ran=True):
                yield self._receive(state, i, conn, k)
        if state.pauses < self.bounds.pauses and c.phase in ("acquiring", "holding"):
            yield self._step(
                state,
                f"c{c.cid} pauses",
                self._with(state, i, dataclasses.replace(c, paused_at=now)),
                pauses=state.pauses + 1,
            )
        if reading:
            return
        if c.phase == "idle" and not c.main and c.cycles < self.bounds.cycles:
            for name in range(self.kind.names):  # its name picked for the cycle
                regs = c.registrations if name == c.name else ()  # a queue is per name
                picked = dataclasses.replace(c, cycles=c.cycles + 1, name=name, registrations=regs)
                yield self._send_acquire(state, i, picked)
        elif c.phase == "queued" and not c.main:
            yield self._send_acquire(state, i, c)
        elif c.phase == "holding":
            if not c.renewals and now < c.deadline and self.kind.acquire_votes is None:
                yield self._send_renewal(state, i, c)
            if self.kind.record and not c.announced and not c.main:
                yield self._send_announce(state, i, c)  # a term won is announced first
            elif not c.main:
                yield self._send_release(state, i, c, abort=False)

    def _send_acquire(self, state: State, i: int, c: Client) -> Step:
        c, token = c.new_token()
        primitive = self.kind.of(c.cid, c.name)
        registration = None
        claims = c.registrations
        if c.queues:
            c, reg_token = c.new_token()
            seq = len(c.registrations) + 1
            registration = Registration(seq, reg_token, state.now / 1000, primitive._grant_ms)
            c = dataclasses.replace(c, registrations=(*c.registrations, reg_token))
        script, keys, args = self.kind.acquire(
            primitive=primitive, token=token, task=c.task, registration=registration, claims=claims
        )
        ops = tuple(
            Op("acquire", node, script.name, tuple(keys), tuple(args), state.now)
            for node in range(self.kind.nodes)
        )
        c = dataclasses.replace(
            c, phase="acquiring", token=token, main=ops, replies=(), stale=False, announced=False
        )
        return self._step(state, f"c{c.cid} sends an acquire{self._on(c)}", self._with(state, i, c))

    def _on(self, c: Client) -> str:
        """What a move of `c` is on, when it could be on something else: its name, its side."""
        said = []
        if self.kind.names > 1:
            said.append(f"name {self.kind.of(c.cid, c.name)._name!r}")
        if self.kind.writers:
            said.append("the write side" if self.kind.writes(c.cid) else "the read side")
        return f" ({', '.join(said)})" if said else ""

    def _send_renewal(self, state: State, i: int, c: Client) -> Step:
        script, keys, args = self.kind.of(c.cid, c.name)._renew_call(c.token, self.kind.ttl_ms)
        ops = tuple(
            Op("renew", node, script.name, tuple(keys), tuple(args), state.now)
            for node in range(self.kind.nodes)
        )
        c = dataclasses.replace(c, renewals=ops)
        return self._step(state, f"c{c.cid} sends a renewal", self._with(state, i, c))

    def _send_announce(self, state: State, i: int, c: Client) -> Step:
        """An election's winner writes the leader's record (EL_ANNOUNCE, as `Election`
        does: the term's token, its identity, no value)."""
        record = self.kind.record
        op = Op("announce", 0, EL_ANNOUNCE.name, record, (c.token, f"c{c.cid}", ""), state.now)
        c = dataclasses.replace(c, main=(op,))
        return self._step(state, f"c{c.cid} announces its term", self._with(state, i, c))

    def _release_ops(self, c: Client, now: int, *, abort: bool) -> tuple[Op, ...]:
        primitive = self.kind.of(c.cid, c.name)
        script, keys, args = primitive._release_call(token=c.token, abort=abort)
        what = "abort" if abort else "release"
        return tuple(
            Op(what, node, script.name, tuple(keys), tuple(args), now)
            for node in range(self.kind.nodes)
        )

    def _send_release(self, state: State, i: int, c: Client, *, abort: bool) -> Step:
        c = dataclasses.replace(
            c, phase="releasing", main=self._release_ops(c, state.now, abort=abort), replies=()
        )
        return self._step(state, f"c{c.cid} sends a release", self._with(state, i, c))

    def deliver(self, state: State, i: int, conn: str, k: int) -> Step:
        """A request reaches its node: its script runs there now."""
        c = state.clients[i]
        op: Op = getattr(c, conn)[k]
        run = (state.data, state.now, op.node, op.script, op.keys, op.args)
        cached = self._runs.get(run)
        if cached is None:
            self._load(state.data, state.now)
            held_before = None
            if op.what == "renew":
                key = self.kind.of(c.cid, c.name)._key
                held_before = self.kind.holds(self.nodes, op.node, str(op.args[0]), key)
            reply = self.nodes.run(op.node, self.scripts[op.script].source, op.keys, op.args)
            cached = self._runs[run] = (reply, *self._settle(), held_before)
        reply, data, canon, held_before = cached
        ops = list(getattr(c, conn))
        ops[k] = dataclasses.replace(op, ran=True, reply=reply)
        c = _set(c, conn, tuple(ops))
        text = f"c{c.cid} {op.what} delivered: {op.describe()} -> {reply!r}"
        step = self._step(state, text, self._with(state, i, c), (data, canon))
        violation = step.violation
        top = state.top[c.name]
        if isinstance(reply, str):
            violation = violation or f"the script failed: {reply}"
        elif op.what == "acquire" and self.kind.fenced:
            status, fence = acquired(reply)[:2]
            if int(status) == 1 and op.args[0] != top[1]:
                if int(fence) <= top[0]:
                    violation = violation or (
                        f"fencing token {fence} issued to {op.args[0]} is not above "
                        f"{top[0]}, issued before to {top[1]}"
                    )
                top = (int(fence), str(op.args[0]))
        elif op.what == "announce" and int(reply[0]) == 1 and int(reply[1]) != c.fence:
            violation = violation or (
                f"c{c.cid} announced term {reply[1]}, not its fencing token {c.fence}"
            )
        elif op.what == "renew" and held_before is not None:
            renewed = int(reply[0]) == 1
            if renewed != held_before:
                violation = violation or (
                    f"the renewal answered {reply!r} while the node "
                    f"{'held' if held_before else 'did not hold'} the lease"
                )
        tops = (*state.top[: c.name], top, *state.top[c.name + 1 :])
        return Step(step.text, dataclasses.replace(step.state, top=tops), violation)

    def _lose(self, state: State, i: int, conn: str, k: int) -> Step:
        """A reply lost after its command ran: the call is sent again (a renewal dropped)."""
        c = state.clients[i]
        ops = list(getattr(c, conn))
        op = ops[k]
        if conn == "renewals":
            del ops[k]
        else:
            ops[k] = dataclasses.replace(op, ran=False, reply=None)
        c = _set(c, conn, tuple(ops))
        text = f"c{c.cid} {op.what} reply lost ({op.reply!r}); " + (
            "dropped" if conn == "renewals" else "sent again"
        )
        return self._step(state, text, self._with(state, i, c), losses=state.losses + 1)

    def _resume(self, state: State, i: int) -> Step:
        c = state.clients[i]
        deadline = c.deadline
        if not self.bounds.drift_bound and c.phase == "holding":
            deadline += state.now - c.paused_at  # its clock stood still
        c = dataclasses.replace(c, paused_at=-1, deadline=deadline)
        return self._step(state, f"c{c.cid} resumes", self._with(state, i, c))

    def _read_now(self, delivered: Step, i: int, conn: str, k: int) -> Step | None:
        """The request delivered and its reply read at once, as one move (the same state as
        the two moves, reached in fewer: what the reduction of `_reading` forces costs no
        depth); None if an earlier reply on the connection waits to be read first."""
        if k not in _heads(getattr(delivered.state.clients[i], conn), ran=True):
            return None
        read = self._receive(delivered.state, i, conn, k)
        said = read.text.split(" ", 2)[2]  # without "t=... cN"
        return Step(f"{delivered.text}; {said}", read.state, read.violation)

    def _receive(self, state: State, i: int, conn: str, k: int) -> Step:
        """The client reads a reply."""
        c = state.clients[i]
        ops = list(getattr(c, conn))
        op = ops.pop(k)
        text = f"c{c.cid} reads the {op.what} reply {op.reply!r}"
        c = _set(c, conn, tuple(ops))
        now = state.now
        if op.what == "renew":
            if c.phase == "holding" and op.args[0] == c.token and not isinstance(op.reply, str):
                if int(op.reply[0]) == 1:
                    c = dataclasses.replace(c, deadline=max(c.deadline, op.sent_at + self.validity))
                else:
                    c = dataclasses.replace(c, phase="idle", token="", deadline=-1, renewals=())
                    text += ": the lease is lost"
        elif op.what == "announce":
            if not isinstance(op.reply, str) and int(op.reply[0]) == 1:
                c = dataclasses.replace(c, announced=True)
                text += f": leads term {int(op.reply[1])}"
            else:  # the term ended before it was announced: given up, campaign again
                c = dataclasses.replace(c, phase="idle", token="", deadline=-1, renewals=())
                text += ": the term ended before it was announced"
        elif op.what in ("release", "abort"):
            if not c.main:
                c = dataclasses.replace(c, phase="idle", token="", deadline=-1, replies=())
            if not isinstance(op.reply, str):
                text += f" (status {released(op.reply)[0]})"
        else:
            c, said = self._acquire_reply(c, op, now)
            text += said
        return self._step(state, text, self._with(state, i, c))

    def _acquire_reply(self, c: Client, op: Op, now: int) -> tuple[Client, str]:
        """An acquire's reply read: holding, queued, idle, or (too late) given back."""
        if self.kind.acquire_votes is not None:
            return self._quorum_reply(c, op, now)
        reply = op.reply
        if isinstance(reply, str):
            return dataclasses.replace(c, phase="idle", token=""), ""
        status, value = (int(x) for x in acquired(reply)[:2])
        if status == 1:
            if now >= op.sent_at + self.validity:
                aborts = self._release_ops(c, now, abort=True)
                c = dataclasses.replace(c, phase="releasing", main=(*c.main, *aborts))
                return c, ": too late, given back (an abort sent)"
            c = dataclasses.replace(
                c, phase="holding", fence=value, deadline=op.sent_at + self.validity,
                registrations=(),
            )  # fmt: skip
            return c, f": holds it, fencing token {value}, until t={c.deadline}ms"
        if status == 0 and c.queues:
            return dataclasses.replace(c, phase="queued"), ": busy, queued"
        return dataclasses.replace(c, phase="idle", token="", registrations=()), ": refused"

    def _quorum_reply(self, c: Client, op: Op, now: int) -> tuple[Client, str]:
        """A Redlock node's acquire reply read; once the quorum's rule (`_model.quorum_rules`,
        with the primitive's quorum) decides, the client holds or gives the acquire back on
        every node. The replies of the nodes still to answer are read and ignored (the
        write-back of an agreed fencing token to them is not modelled)."""
        rule = self.kind.acquire_votes
        assert rule is not None
        if c.phase != "acquiring":
            return c, ": read after the decision, ignored"
        replies = (*c.replies, (op.node, op.reply))
        c = dataclasses.replace(c, replies=replies)
        votes = {node: list(r) for node, r in replies if not isinstance(r, str)}
        pending = sum(1 for other in c.main if other.what == "acquire")
        if not rule.decided(votes, pending, self.kind.quorum, 1):
            return c, ""
        verdict = rule.verdict(votes, self.kind.quorum, 1)
        granted = verdict.reply is not None and int(verdict.reply[0]) == 1
        if granted and now < op.sent_at + self.validity:
            fence = int(verdict.reply[1])
            c = dataclasses.replace(
                c, phase="holding", fence=fence, deadline=op.sent_at + self.validity, replies=()
            )
            return c, f": a quorum granted it, fencing token {fence}, until t={c.deadline}ms"
        aborts = self._release_ops(c, now, abort=True)
        c = dataclasses.replace(c, phase="releasing", main=(*c.main, *aborts), replies=())
        return c, ": no quorum (or too late): given back on every node"

    def _advance(self, state: State) -> Iterator[Step]:
        """Time moves on to a later point where something changes (see the module
        docstring): one move per point, the nearest first."""
        points: list[int] = []
        for c in state.clients:
            if c.phase == "holding":
                points += (c.deadline - 1, c.deadline)
            for op in c.main:
                if op.what == "acquire":
                    points += (op.sent_at + self.validity - 1, op.sent_at + self.validity)
        self._load(state.data, state.now)
        for expiry in self.nodes.expiries():
            points += (expiry, expiry + 1)
        for to in sorted({p for p in points if p > state.now}):
            timed = self._timed.get((state.data, to))
            if timed is None:
                self._load(state.data, to)  # the keys expired by then are gone
                timed = self._timed[state.data, to] = self._settle()
            new = dataclasses.replace(state, now=to)
            yield self._step(new, f"time advances to t={to}ms", state.clients, timed)

    def _restart(self, state: State, node: int) -> Step:
        self._load(state.data, state.now)
        self.nodes.restart(node)
        now = state.now + 1
        self.nodes.now_ms = now
        data = self._settle()
        clients = []
        for c in state.clients:
            main = tuple(
                dataclasses.replace(op, ran=False, reply=None) if op.node == node else op
                for op in c.main
            )
            renewals = tuple(op for op in c.renewals if op.node != node)
            # the lease held now is lost with the node; a call in flight is sent again to
            # the restarted node, so what it acquires is a lease of after the restart
            stale = c.stale or (c.phase == "holding" and self.kind.nodes == 1)
            clients.append(dataclasses.replace(c, main=main, renewals=renewals, stale=stale))
        new = dataclasses.replace(state, now=now)
        return self._step(
            new, f"node {node} restarts empty (t={now}ms)", tuple(clients), data,
            restarts=state.restarts + 1,
        )  # fmt: skip

    # ------------------------------------------------------------------ invariants
    def violation(self, state: State) -> str | None:
        """What is wrong in `state` (the nodes hold its data), or None."""
        now = state.now
        for name in range(self.kind.names):  # each name on its own
            believers = [c for c in state.clients if c.believes(now) and c.name == name]
            said = ", ".join(f"c{c.cid} (until t={c.deadline}ms)" for c in believers)
            writing = [c for c in believers if self.kind.writes(c.cid)]
            if self.kind.writers and writing and len(believers) > 1:
                return (
                    f"c{writing[0].cid} believes it writes while others believe they hold: {said}"
                )
            if not self.kind.writers and len(believers) > self.kind.limit:
                on = f" {self.kind.of(0, name)._name!r}" if self.kind.names > 1 else ""
                return f"{len(believers)} clients believe they hold {self.kind.name}{on} (limit {self.kind.limit}): {said}"
        believers = [c for c in state.clients if c.believes(now)]
        for c in believers if self.bounds.agreement else ():
            held = sum(self.held(state, node, c) for node in range(self.kind.nodes))
            if held < self.kind.quorum:
                return f"c{c.cid} believes it holds (until t={c.deadline}ms) but only {held} node(s) hold its lease"
        return None
