"""`Redlock`: one lease over N independent Redis servers, held while a quorum holds it.

Its keys and scripts (`_lua.redlock`) on each node; the quorum's calls and votes are
`_transport.quorum`'s; the acquisition, the lease, the watchdog and the events are the engine's, as
for every primitive.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Unpack, final

from .._aio.backoff import Backoff
from .._engine.acquisition import MIN_ATTEMPT_TIMEOUT, Call, Primitive
from .._engine.lease import Lease
from .._engine.primitive_base import UNSET, Attempt, Unset
from .._engine.runtime import Runtime, runtime_for
from .._engine.wait_queue import WaitQueue
from .._lua.layout import LockKeys
from .._lua.lease import RENEW, RESUME
from .._lua.lock import INSPECT, Join, Script, release_args
from .._lua.redlock import RL_ACQUIRE, RL_RELEASE
from .._model.config import check_name, check_seconds
from .._model.holder import HOST, LockInfo, pid, text
from .._model.options import LockOptions, lock_config
from .._model.quorum_rules import REDLOCK_VOTES
from .._transport.call_options import CallOptions
from .._transport.clients import AsyncClient, check_client, is_cluster
from .._transport.quorum import Quorum, QuorumBackend, curable, node_name
from ..errors import BackendError, ConfigError, QuorumError

__all__ = ("Redlock", "RedlockInfo", "RedlockNode", "RedlockRelease", "check_clients")

MIN_NODE_TIMEOUT: Final = 0.05
"""The default `node_timeout`'s floor (a tenth of the ttl, but at least this, and at most
half the ttl), seconds: a call that a loaded host answers within it."""
RETRY_BACKOFF: Final = (0.05, 1.0)
"""The first and the longest pause, seconds, before an acquire's attempt that node failures
left undecided is tried again (each in [d/2, d], d doubling)."""
PROPOSAL_LEAD_US: Final = 100_000
"""How far ahead of this machine's clock (us) the fencing token an acquire proposes is:
more than the usual skew between the servers' clocks (at most half the ttl)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RedlockNode:
    """What one node of a `Redlock` says. Added in 0.1."""

    node: str
    """The node, as "host:port"."""
    holder: LockInfo | None
    """Who holds the name on this node (None: nobody, or the node did not answer)."""
    error: str | None = None
    """Why the node could not be read (None: it answered)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RedlockInfo:
    """A `Redlock`'s state on each of its nodes, and the quorum's view. Added in 0.1."""

    name: str
    holder: LockInfo | None
    """The holder of a quorum of the nodes (its fencing token the one agreed), or None if
    no one holds a quorum (a lease being acquired or lost, or a minority left held)."""
    quorum: int
    """How many nodes must agree (N // 2 + 1)."""
    nodes: tuple[RedlockNode, ...]

    @property
    def holders(self) -> tuple[LockInfo, ...]:
        """The holder of a quorum, as a one-element tuple (empty if none)."""
        return () if self.holder is None else (self.holder,)

    @property
    def waiting(self) -> int:
        """Always 0: waiters of a Redlock are not recorded on its nodes."""
        return 0

    @property
    def free(self) -> int:
        """1 if no one holds a quorum, else 0."""
        return 0 if self.holder is not None else 1


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RedlockRelease:
    """What `Redlock.force_release()` deleted, and on which nodes. Added in 0.1."""

    name: str
    holder: LockInfo
    """The holder evicted: the one most nodes held, with the fencing token most of them
    had."""
    released: tuple[str, ...]
    """The nodes ("host:port") its key was deleted from, in the order of the clients."""
    unknown: tuple[str, ...]
    """The nodes that could not be read, or did not answer the release: a key of the
    holder's there, if any, expires by its ttl."""
    quorum: int
    """How many nodes make a majority (N // 2 + 1)."""

    @property
    def majority(self) -> bool:
        """Whether it was deleted from a majority of the nodes: the holder held the lock.
        (On fewer, it did not: an acquire given back or a lease lost meanwhile, or keys
        left behind.)"""
        return len(self.released) >= self.quorum


@final
class Redlock(Primitive):
    """A lock held on a quorum (N // 2 + 1) of N independent Redis servers: it survives the
    loss, the freeze or the restart of a minority of them.

    ```python
    async with Redlock([redis_a, redis_b, redis_c], "orders:42", ttl=10) as lease:
        await db.write(..., fence=lease.fencing_token)
    ```

    Every call goes to every node at once and is decided as soon as a quorum for or
    against is known, so a slow or frozen minority costs nothing. The lease's validity is
    the ttl, minus the time since the acquire was sent, minus `drift`; it is renewed by
    the watchdog (one call per node per batch), and counts as renewed once a quorum
    confirmed it; a node that lost the key (restarted empty) while the quorum holds it
    gets it back at the next renewal. A quorum answering "not the owner" (or no quorum
    before the deadline) is a loss, which cancels the body of `async with`, as for `Lock`.

    Its fencing tokens increase across the quorum: the token is agreed in a second round
    trip (the highest counter of the granting nodes, written back to every node), and the
    lease is handed out only once a quorum acknowledged it. See the documentation's
    Fencing over a quorum.

    Waiters hear releases from every node and try again at once; the tasks of one process
    are served in the order they called, but there is no order across processes.

    Args:
        clients: `redis.asyncio.Redis` clients (or valkey-py's) of independent servers (no
            replication between them), at least one, no server twice (the same host, port
            and database, or socket path: two addresses of one server, such as
            `localhost` and `127.0.0.1` or a proxy, cannot be told apart); 3 or 5 is usual.
        name: the lock's name, as `Lock`'s.
        node_timeout: seconds each node's call may take (0.001 to half the ttl); default
            None: a tenth of the ttl, but at least 50 ms (what a loaded host answers in),
            and at most half the ttl.
        drift: seconds subtracted from a lease's validity for clock drift (0 to half the
            ttl); default None: 1 % of the ttl plus 2 ms.
        options: `LockOptions` (`ttl`, `renew`, `renew_interval`, `timeout`, `max_hold`,
            `prefix`, `retain`); `hold_stats` and `replicas` are not taken.

    Raises:
        TypeError: a wrong type (not a sequence, a cluster client, ...), or an unknown
            keyword.
        ConfigError: a value out of range (the message names the argument and the
            range), no client, or two clients of one server (naming both).

    Not offered: `acquire(token=...)`, a token chosen by the caller (a refused attempt is
    given back on every node with an abort that forbids its token); `resume(token)` and
    `release_token(token)` work as for `Lock`.

    Added in 0.1.
    """

    __slots__ = ("_clients_held", "_keys", "_quorum")

    _release_script = RL_RELEASE
    _votes = REDLOCK_VOTES
    _queued_in_redis = False  # nothing to withdraw: waiters are not queued on the nodes
    _renew_kind = "r"

    def __init__(
        self,
        clients: Sequence[AsyncClient],
        name: str,
        *,
        node_timeout: float | None = None,
        drift: float | None = None,
        **options: Unpack[LockOptions],
    ) -> None:
        checked = check_clients(clients)
        checked_name = check_name(name)
        for refused in ("hold_stats", "replicas", "replica_timeout"):
            if options.get(refused):
                raise ConfigError(
                    f"Redlock() does not take {refused} (a Redlock's safety comes from its "
                    f"quorum of independent servers)",
                    argument=refused,
                    value=options.get(refused),
                )
        config = lock_config("Redlock()", options)
        half = config.ttl / 2
        if drift is not None:
            drift = check_seconds("drift", drift, minimum=0.0, maximum=half)
            config = dataclasses.replace(config, drift=drift)
        if node_timeout is None:
            node_timeout = min(max(config.ttl / 10, MIN_NODE_TIMEOUT), half)
        else:
            node_timeout = check_seconds("node_timeout", node_timeout, minimum=0.001, maximum=half)
        self._clients_held = checked  # the quorum holds them weakly
        quorum = self._quorum = Quorum.of(checked, node_timeout)
        keys = self._keys = LockKeys.build(config.prefix, checked_name, "rl:")
        super().__init__(
            quorum,
            checked_name,
            config,
            key=keys.lock,
            channel=keys.channel,
            release_keys=(keys.lock, keys.channel),
        )

    @property
    def key(self) -> str:
        """The Redis key that exists on each node while the lock is held there."""
        return self._keys.lock

    @property
    def quorum(self) -> int:
        """How many nodes must agree: N // 2 + 1."""
        return self._quorum.quorum

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes, as "host:port", in the order of the clients given."""
        return self._quorum.names

    def __repr__(self) -> str:
        held = len(self._held)
        n = len(self._quorum.clients)
        return f"<Redlock {self._name!r} ttl={self._config.ttl:g}s nodes={n} held_here={held}>"

    # ----------------------------------------------------------------- the engine's calls
    async def acquire(
        self, *, timeout: float | Unset | None = UNSET, token: str | None = None
    ) -> Lease:
        """Wait for a quorum of the nodes and return the `Lease` (see `Lock.acquire`).

        Node failures that leave no majority for either side (no reply within the node
        timeout, a connection refused or reset) are tried again, with a backoff, while the
        acquire waits: up to its timeout (none with 0: `try_acquire()`), or, without one,
        up to a ttl. A node that refuses the command for what it is (a wrong type, a
        permission, a script error), when the others cannot make a majority without it,
        raises at once.

        Raises:
            AcquireTimeoutError: it stayed held by others for the whole timeout.
            QuorumError: too many nodes were unreachable or failed for a quorum, for or
                against, to be known, until the timeout; or at once, naming the node, if a
                refusal that sending again would not cure leaves no majority (its own
                error is the cause, and each node's is in `errors`). What was granted has
                been given back.
            BackendError: Redis refused the command.
            TypeError: a `token` was given (not offered by Redlock).

        Cancellation:
            As for `Lock.acquire`: a cancelled acquire, during an attempt or between two,
            is given back on every node, under a shield.
        """
        if token is not None:
            raise TypeError(
                "Redlock.acquire() does not take a token: a refused attempt is given back "
                "on every node with an abort that forbids its token"
            )
        return await super().acquire(timeout=timeout)

    async def _attempt(
        self,
        runtime: Runtime,
        time_left: float | None,
        *,
        queue: WaitQueue | None = None,
        behind: int = 0,
        token: str | None = None,
        floor: float = MIN_ATTEMPT_TIMEOUT,
    ) -> Attempt:
        """The engine's attempt, tried again after node failures that left it undecided
        (`QuorumError`, each attempt's grants given back), with a backoff, while the caller
        waits: for `time_left` (0: one attempt), or a ttl when it waits for ever; unless the
        failures would be the same again (`curable`). Each attempt has a token of its own.

        Cancellation:
            As for the engine's attempt; between two, nothing is held.
        """
        loop = runtime.loop
        wait = self._config.ttl if time_left is None else time_left
        until = loop.time() + wait
        backoff: Backoff | None = None  # (made at the first failure)
        while True:
            left = None if time_left is None else max(until - loop.time(), 0.0)
            try:
                return await super()._attempt(
                    runtime, left, queue=queue, behind=behind, token=token, floor=floor
                )
            except QuorumError as failed:
                if backoff is None:
                    backoff = Backoff(
                        base=RETRY_BACKOFF[0], cap=RETRY_BACKOFF[1], rng=runtime.notifier.rng
                    )
                pause = backoff.next()
                if not curable(failed) or loop.time() + pause >= until:
                    raise
            await asyncio.sleep(pause)

    def _acquire_call(
        self, token: str, task: str, queue: tuple[str, int, str] | None, claims: Sequence[str]
    ) -> Call:
        config = self._config
        # A proposed token a little ahead of the clocks: the nodes that grant it issue this
        # same token (unless their counters are further ahead), and the quorum then agrees
        # on it without a second round trip. The lead stays within half the ttl, so that
        # a node restarted empty after the ttl (the delayed restart) issues higher tokens.
        lead_us = min(PROPOSAL_LEAD_US, config.ttl_ms * 500)
        proposal = time.time_ns() // 1000 + lead_us
        args: list[str | int] = [token, config.ttl_ms, f"{HOST} {pid()} {task}"]
        args += (config.abort_retain_ms, proposal)
        return RL_ACQUIRE, self._release_keys, args

    def _release_call(
        self,
        *,
        token: str = "",
        retain_ms: int | None = None,
        held_ms: int | None = None,
        renewed: bool = True,
        abort: bool = False,
        forced: bool = False,
        look_at_queue: bool = False,
        withdraw: str = "",
        join: Join | None = None,
        claims: Sequence[str] = (),
    ) -> Call:
        """RL_RELEASE (no queue on the nodes: what concerns one is left out)."""
        args = release_args(token=token, retain_ms=retain_ms, abort=abort, forced=forced)
        return RL_RELEASE, self._release_keys, args

    def _renew_call(self, token: str, ttl_ms: int, permits: int = 1) -> Call:
        return RENEW, (self._key,), [token, ttl_ms, self._renew_kind]

    def _resume_call(self, token: str, ttl_ms: int) -> Call:
        """RESUME of a lock's state (each node holds it as a lock does)."""
        return RESUME, (self._key,), [token, ttl_ms, ""]

    def _renewal_kind(self, fencing_token: int, permits: int = 1) -> str:
        """The renewals' kind carries the fencing token: a node that lost the key gets it
        back, with this token, at the next renewal."""
        return f"{self._renew_kind}{fencing_token}"

    def _granted(self, lease: Lease, waited: float, attempts: int) -> Lease:
        """The engine's, telling this process's waiters of the lease: the nodes'
        announcements of older releases, still on their way, wake none of them."""
        queue = runtime_for(self._client).notifier.queue_for(self._channel)
        if queue is not None:
            queue.lease_taken(lease.fencing_token)
        return super()._granted(lease, waited, attempts)

    # ----------------------------------------------------------------- inspection
    async def locked(self) -> bool:
        """Whether an acquire now would be refused: held (by anyone) on more nodes than
        a quorum allows free. One round trip to each node.

        Raises:
            QuorumError: fewer than a quorum of nodes could be read.
        """
        info = await self._read()
        held = sum(1 for node in info.nodes if node.holder is not None)
        return held > len(info.nodes) - info.quorum

    async def info(self) -> RedlockInfo | None:
        """Each node's holder and the quorum's, or None if no node holds it. One round
        trip to each node, at once.

        Raises:
            QuorumError: fewer than a quorum of nodes could be read.
        """
        info = await self._read()
        if all(node.holder is None for node in info.nodes):
            return None
        return info

    async def force_release(self) -> RedlockRelease | None:
        """Evict the holder of the most nodes (a stuck lock, or keys a lost lease left on a
        minority), token-guarded on each node, as `Lock.force_release`. The evicted
        holder's watchdog finds out at its next renewal.

        Every node is read at once (each within max(`node_timeout`, 1 s)); then the
        holder's key is deleted on the nodes that hold it, token-guarded, each within
        that bound too.

        Returns:
            What was deleted, and on which nodes (`RedlockRelease`; its `majority` says
            whether the holder held a majority of them), or None if nothing was (no node
            held it, or its holder released it meanwhile).

        Raises:
            QuorumError: fewer than a quorum of nodes could be read.

        Cancellation:
            Safe to cancel: a node that received the release has deleted the key, the
            others keep it (token-guarded, it can be sent again).
        """
        info, tokens = await self._read_tokens()
        if not tokens:
            return None
        token = Counter(tokens.values()).most_common(1)[0][0]
        holder = _quorum_holder(list(info.nodes), tokens, 1, token)
        assert holder is not None
        holding = [index for index, held in tokens.items() if held == token]
        args = release_args(token=token, forced=True)
        said = await self._on_nodes(holding, RL_RELEASE, self._release_keys, args, "release")
        deleted = {i for i, reply in said.items() if not _failed(reply) and int(reply[0]) == 1}
        if not deleted:
            return None
        names = self._quorum.names
        unknown = {i for i, node in enumerate(info.nodes) if node.error is not None}
        unknown |= {i for i, reply in said.items() if _failed(reply)}
        return RedlockRelease(
            name=self._name,
            holder=holder,
            released=tuple(names[i] for i in sorted(deleted)),
            unknown=tuple(names[i] for i in sorted(unknown)),
            quorum=self._quorum.quorum,
        )

    async def _read(self) -> RedlockInfo:
        return (await self._read_tokens())[0]

    def _nodes_backend(self) -> QuorumBackend:
        """The backend of the quorum's runtime: a `Backend` per node, and their health."""
        backend = runtime_for(self._client).backend
        assert isinstance(backend, QuorumBackend)
        return backend

    async def _on_nodes(
        self,
        indexes: Sequence[int],
        script: Script,
        keys: Sequence[str],
        args: Sequence[str | int],
        operation: str,
    ) -> dict[int, Any]:
        """`script` on the nodes `indexes`, at once, each bounded by max(`node_timeout`,
        1 s): each node's reply, or its `BackendError`."""
        backend = self._nodes_backend()
        bound = max(self._quorum.node_timeout, 1.0)
        answers = await asyncio.gather(
            *(
                backend.nodes[index].run(
                    script,
                    keys,
                    args,
                    CallOptions(timeout=bound, operation=operation, name=self._name),
                )
                for index in indexes
            ),
            return_exceptions=True,
        )
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, BackendError):
                raise answer
        return dict(zip(indexes, answers, strict=True))

    async def _read_tokens(self) -> tuple[RedlockInfo, dict[int, str]]:
        """Every node's state (read at once), and the token held on each node that holds."""
        keys = self._keys
        everyone = range(len(self._quorum.names))
        read = await self._on_nodes(
            everyone, INSPECT, (keys.lock, keys.queue, keys.waiters), [], "inspect"
        )
        answers = [read[index] for index in everyone]
        nodes: list[RedlockNode] = []
        tokens: dict[int, str] = {}
        for index, (name, answer) in enumerate(zip(self._quorum.names, answers, strict=True)):
            if isinstance(answer, BaseException):
                nodes.append(RedlockNode(node=name, holder=None, error=str(answer)))
                continue
            pttl, raw = answer[0], answer[1]
            fields = {text(k): text(v) for k, v in zip(raw[::2], raw[1::2], strict=True)}
            holder = LockInfo.from_fields(self._name, fields, int(pttl))
            if holder is not None:
                tokens[index] = fields["token"]
            nodes.append(RedlockNode(node=name, holder=holder))
        answered = sum(1 for node in nodes if node.error is None)
        quorum = self._quorum.quorum
        if answered < quorum:
            said = {node.node: node.error or "ok" for node in nodes}
            raise QuorumError(
                f"inspect of {self._name!r}: {answered} of {len(nodes)} nodes answered, "
                f"{quorum} needed",
                operation="inspect",
                name=self._name,
                quorum=quorum,
                nodes=said,
            )
        return RedlockInfo(
            name=self._name,
            holder=_quorum_holder(nodes, tokens, quorum),
            quorum=quorum,
            nodes=tuple(nodes),
        ), tokens


def _failed(reply: Any) -> bool:
    return isinstance(reply, BaseException)


def _quorum_holder(
    nodes: list[RedlockNode], tokens: dict[int, str], quorum: int, token: str | None = None
) -> LockInfo | None:
    """The holder of a quorum of the nodes (of `token`, else of the token most nodes hold),
    with the fencing token most of its nodes hold; None if it holds fewer than `quorum`."""
    if not tokens:
        return None
    counts = Counter(tokens.values())
    token = token or counts.most_common(1)[0][0]
    if counts[token] < quorum:
        return None
    held = [nodes[i].holder for i, t in tokens.items() if t == token]
    fences = Counter(h.fencing_token for h in held if h is not None)
    fence = fences.most_common(1)[0][0]
    return next(h for h in held if h is not None and h.fencing_token == fence)


def check_clients(clients: object) -> tuple[AsyncClient, ...]:
    """The clients of a Redlock: a non-empty sequence of clients of one server each, no
    server addressed twice (see `_address`)."""
    if isinstance(clients, (str, bytes)) or not isinstance(clients, Sequence):
        raise TypeError(
            "clients must be a sequence (a list or tuple) of redis.asyncio.Redis clients of "
            f"independent servers, got {type(clients).__name__}"
        )
    if not clients:
        raise ConfigError(
            "clients must hold at least one client (3 or 5 independent servers is usual)",
            argument="clients",
            value=clients,
        )
    checked = tuple(check_client(client) for client in clients)
    for client in checked:
        if is_cluster(client):
            raise TypeError(
                "clients must be clients of one server each (redis.asyncio.Redis), not "
                "a cluster client: a Redlock's nodes are independent servers"
            )
    seen: dict[object, int] = {}
    for index, client in enumerate(checked):
        address = _address(client)
        first = seen.setdefault(address, index)
        if first != index:
            where = "the same client" if checked[first] is client else "the same server"
            raise ConfigError(
                f"clients[{first}] and clients[{index}] address {where} "
                f"({node_name(client)}{_database(client)}): it would vote twice, and one "
                "empty restart could lose a majority; give each independent server once",
                argument="clients",
                value=clients,
            )
    return checked


def _address(client: AsyncClient) -> object:
    """What tells a client's server: its host (as written: an alias is another address),
    port and database, or its socket path and database; the client itself where its pool
    names no server (Sentinel's, or a pool of the user's making)."""
    kwargs = _pool_kwargs(client)
    db = kwargs.get("db") or 0
    if "path" in kwargs:
        return ("unix", str(kwargs["path"]), db)
    if "host" in kwargs:
        return ("tcp", str(kwargs["host"]).lower(), int(kwargs.get("port") or 6379), db)
    return ("client", id(client))


def _database(client: AsyncClient) -> str:
    return f" database {_pool_kwargs(client).get('db') or 0}"


def _pool_kwargs(client: AsyncClient) -> dict[str, Any]:
    """The connection settings of a client's pool (none for a pool without them)."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    return kwargs if isinstance(kwargs, dict) else {}
