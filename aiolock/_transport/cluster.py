"""Cluster routing: every script call of a `RedisCluster` client goes through a cluster client
of aiolock's own: sent by aiolock on that client's connection to the primary its slot map
gives for the call's keys (`send`), or, for what that cannot serve (a redirection, a broken
connection), through the client's own routing, which follows MOVED and ASK.

aiolock's own cluster client has the user's connection settings that a `RedisCluster` takes,
the nodes the user's client knows, no pool limit, and `OWN_REDIRECTIONS` tries per command;
it is closed `OWN_IDLE` seconds after its last call once no lease needs renewing. Several
calls of one script (a renewal batch, one call per slot) go as one cluster pipeline per
node (`run_each`). While a slot migrates, a refused call is waited out by the `Backend`
(`waits_out`), and what fails meanwhile is marked (`during_migration`). The scripts
publish on shard channels where the servers have them (`_lua.cluster`, chosen in
`Backend.run`), and the notifier's pub/sub is a session of aiolock's own per node serving
a channel wanted (`_transport.cluster_pubsub`: `SSUBSCRIBE`, or one classic session to a primary for
nodes without sharded pub/sub, whose `PUBLISH` reaches every node). Readers of many names
get a client of their own per node (`node_clients`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import random
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final, cast

import redis
import redis.asyncio
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from .._lua.lock import Script
from .base import Call, Command, CommandTransport, Sent, Transport
from .clients import Client, ClientLibrary, Errors, migrating_refusal
from .cluster_pubsub import HEALTH_INTERVAL, Placement, ShardedPubSub
from .direct import direct_connections, exchange

__all__ = ("DIRECT_PAUSE", "MIGRATION_MEMORY", "OWN_IDLE", "OWN_REDIRECTIONS", "ClusterTransport")

OWN_REDIRECTIONS: Final = 2
"""Tries aiolock's own cluster client makes of one command before it reports it (redis-py's
default: 16), enough to follow one MOVED or ASK. A migrating slot's refusal (TRYAGAIN) is
then waited out by aiolock, with backoff; redis-py's own quick tries would go on to the
importing node without ASKING, meet MOVED replies, and close every connection of the
client to find the nodes again, other calls' included."""

OWN_IDLE: Final = 2.0
"""Seconds aiolock's own cluster client stays open after its last call, once no lease needs
renewing."""

MIGRATION_MEMORY: Final = 5.0
"""Seconds after a cluster client last met a migrating slot during which a call's failure is
taken for a consequence of the migration."""

_CLUSTER_SETTINGS: Final = frozenset(inspect.signature(RedisCluster.__init__).parameters)
"""What a `RedisCluster` takes: of a user's cluster client's connection settings, those
that aiolock's own cluster client is made with."""

_NOT_COPIED: Final = frozenset(
    {"self", "host", "port", "startup_nodes", "max_connections", "retry", "read_from_replicas"}
)
"""Settings of the user's cluster client that aiolock's own does not take: it is made with
the nodes the user's client knows, without the user's pool limit or retries (its calls are
bounded by aiolock), and reads from primaries only."""


DIRECT_PAUSE: Final = 1.0
"""Seconds after a connection to a node broke under a call sent directly during which
calls go through the cluster client's own routing, which finds the cluster's nodes again."""

_SCRIPT_CALLS: Final = frozenset({"EVALSHA", "EVAL"})


def _some_node(client: RedisCluster) -> ClusterNode:
    """A node of the cluster, to copy connection settings from (known before the client
    first asked the cluster for its nodes: one it was created with)."""
    node: ClusterNode | None = client.get_default_node()
    if node is None:  # not yet asked the cluster for its nodes
        node = next(iter(client.nodes_manager.startup_nodes.values()))
    return node


def _node_for(client: RedisCluster, key: str | None, avoid: str | None = None) -> ClusterNode:
    """The primary serving `key`'s slot as the client knows it, or a random primary (other
    than the one named `avoid`, if there is another)."""
    if key is not None:
        with contextlib.suppress(*Errors.cluster, LookupError):
            node = client.get_node_from_key(key)
            if node is not None:
                return node
    primaries = client.get_primaries()
    others = [node for node in primaries if node.name != avoid]
    return random.choice(others or primaries) if primaries else _some_node(client)


class ClusterTransport(CommandTransport):
    """A cluster client's calls: see the module docstring."""

    sees_writes = True  # a direct send's `on_sent` once written; a routed one's once answered
    cluster = True
    retries_broken = True
    __slots__ = (
        "_direct",
        "_direct_paused",
        "_migration_seen",
        "_own",
        "_own_calls",
        "_own_closer",
        "_own_pinned",
        "_own_used",
        "_placement",
        "_pubsub_node",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._migration_seen = -math.inf  # when a call last met a migrating cluster slot
        # Whether script calls are sent on the nodes' connections directly, and until when
        # they are not (a connection broke).
        self._direct = direct_connections(
            self.library, self.connection_class, self.connection_kwargs
        )
        self._direct_paused = -math.inf
        # aiolock's own cluster client: calls in flight on it, when it was last used,
        # whether leases need it (renewals), and the task that closes it once idle.
        self._own: RedisCluster | None = None
        self._own_calls = 0
        self._own_used = -math.inf
        self._own_pinned = False
        self._own_closer: asyncio.Task[None] | None = None
        self._pubsub_node: str | None = None
        self._placement = Placement()  # what the pub/sub sessions learned of the cluster

    @classmethod
    def for_client(  # type: ignore[override]
        cls, library: ClientLibrary, client: RedisCluster, loop: asyncio.AbstractEventLoop
    ) -> Transport:
        """Script calls go through a cluster client of aiolock's own, made with the
        connection settings of a node of the user's."""
        node = _some_node(client)
        kwargs = {k: v for k, v in node.connection_kwargs.items() if k not in ("host", "port")}
        kwargs["retry"] = library.no_retry()
        return cls(
            library,
            weakref.ref(client),
            connection_class=node.connection_class,
            connection_kwargs=kwargs,
            loop=loop,
        )

    def _cluster_client(self) -> RedisCluster:
        client = self.user_client()
        assert isinstance(client, self.library.cluster)
        return client

    def script_client(self, *, background: bool) -> Client | None:
        """None: every call goes on aiolock's own cluster client, lent for it (`call_on`)."""
        return None

    def call_on(
        self, call: Callable[[Client], Awaitable[Any]], *, background: bool
    ) -> Awaitable[Any]:
        """`call` run on aiolock's own cluster client (see `_own_cluster`)."""
        return self._call_on_own(call, pin=background)

    async def _call_on_own(self, call: Callable[[Client], Awaitable[Any]], *, pin: bool) -> Any:
        """`call` run on aiolock's own cluster client, made if need be; kept open while
        calls use it, while leases need renewing (`pin`: a renewal's call), and for
        OWN_IDLE seconds after the last call, then closed by a task of its own (which the
        event loop's shutdown also ends, closing it)."""
        own = self._own_taken(pin=pin)
        try:
            # Made just now (or closed by an error): the calls wait until it knows which
            # node serves which slot (nothing is sent if it does). redis-py would send them
            # to any node meanwhile, and close every connection at every fifth MOVED.
            await own.initialize()
            return await call(own)
        finally:
            self._own_calls -= 1
            self._own_used = self.loop.time()

    async def send(
        self, client: Client, command: Command, on_sent: Sent, then: Command | None = None
    ) -> Any:
        """A script call, sent on a connection of the node its first key's slot belongs
        to, as aiolock's own cluster client knows it, packed by hiredis (as on one server:
        `exchange`), past the cluster client's routing layers. A call it cannot route so
        (no key, a slot it does not know, a connection class or encoding of another kind,
        a connection that broke within `DIRECT_PAUSE`), and one the node redirects (MOVED,
        ASK, CLUSTERDOWN: not applied), go through the cluster client's own routing, which
        follows the redirection and learns where the slot went."""
        node = self._direct_node(client, command)
        if node is None:
            return await self._routed(client, command, on_sent, then)
        connection = node.acquire_connection()
        try:
            if getattr(connection, "_should_reconnect", False):  # marked by the client
                await connection.disconnect()
            return await exchange(connection, command, on_sent, then, self.batch)
        except Errors.redirected:
            pass
        except (*Errors.connection, *Errors.timeout):
            self._direct_paused = self.loop.time() + DIRECT_PAUSE
            raise
        finally:
            _give_back(node, connection)
        return await self._routed(client, command, None, then)

    async def _routed(
        self, client: Client, command: Command, on_sent: Sent, then: Command | None
    ) -> Any:
        """A call through the cluster client's own routing (`execute_command`); when it
        writes the command is not known here, so `on_sent` is called once the call ended
        (see `Transport.sees_writes`)."""
        try:
            return await super().send(client, command, None, then)
        finally:
            if on_sent is not None:
                on_sent()

    def _direct_node(self, client: Client, command: Command) -> ClusterNode | None:
        """The node a script call goes to directly, if it may (see `send`)."""
        if (
            not self._direct
            or command[0] not in _SCRIPT_CALLS
            or command[2] == 0
            or not isinstance(client, self.library.cluster)
            or self.loop.time() < self._direct_paused
        ):
            return None
        key = str(command[3]).encode("utf-8", "surrogateescape")
        nodes = client.nodes_manager.slots_cache.get(key_slot(key))
        return nodes[0] if nodes else None

    def connection_pool(self, key: str | None = None) -> redis.asyncio.ConnectionPool:
        """A pool of the primary that serves `key` (a random primary without one)."""
        return self.node_pool(_node_for(self._cluster_client(), key))

    def node_pool(self, node: ClusterNode) -> redis.asyncio.ConnectionPool:
        """A new pool of connections to one cluster node, with the user's settings."""
        return self._pool_at(node.host, node.port)

    def _pool_at(
        self, host: str, port: str | int, *, pubsub: bool = False
    ) -> redis.asyncio.ConnectionPool:
        kwargs = self.connection_kwargs
        if pubsub:
            # The sessions check their nodes themselves: redis-py's own check would read
            # its PING's answer as a command's reply, and could take a message for it (it
            # knows nothing of the subscriptions, made by command).
            kwargs = {k: v for k, v in kwargs.items() if k != "health_check_interval"}
        return self.library.connection_pool(
            connection_class=self.connection_class, host=host, port=port, **kwargs
        )

    def new_pubsub(self) -> PubSub:
        """The notifier's pub/sub: a session per node serving a channel wanted, read as one
        (`_transport.cluster_pubsub`); pinged after the client's health interval of silence."""
        every = float(self.connection_kwargs.get("health_check_interval") or 0)
        pubsub = ShardedPubSub(
            open_session=self._open_session,
            owner=self._owner_of,
            refresh=self._refresh_slots,
            placement=self._placement,
            every=every or HEALTH_INTERVAL,
            rng=random.Random(),
        )
        return cast(PubSub, pubsub)

    def _open_session(self, address: str | None) -> PubSub:
        """A pub/sub session on a connection of its own: to the node `address`
        ("host:port"), or for None (classic pub/sub, heard on every node) to a primary
        other than the previous such session's: one is replaced when its node stopped
        answering, which the cluster client may not know yet."""
        if address is None:
            node = _node_for(self._cluster_client(), None, avoid=self._pubsub_node)
            self._pubsub_node = address = str(node.name)
        host, _, port = address.rpartition(":")
        return self.library.pubsub(connection_pool=self._pool_at(host, port, pubsub=True))

    async def _refresh_slots(self) -> None:
        """The user's cluster client asks the cluster which node serves which slot (as it
        does itself after a connection error)."""
        await self._cluster_client().nodes_manager.initialize()

    async def _owner_of(self, channel: str) -> str:
        """The address of the primary serving `channel`'s slot, as the user's cluster
        client knows it (asked for its nodes first, if it never was)."""
        cluster = self._cluster_client()
        with contextlib.suppress(*Errors.any):
            await cluster.initialize()  # nothing is sent if it knows its nodes already
        return str(_node_for(cluster, channel).name)

    async def close_background(self) -> None:
        """No lease needs renewing: aiolock's own cluster client closes once idle."""
        await super().close_background()
        self._own_pinned = False

    def waits_out(self, error: BaseException) -> bool:
        """The slot migrates, a name's keys on both sides: nothing was applied, and it will
        be once the migration ends."""
        if not migrating_refusal(error):
            return False
        self._migration_seen = self.loop.time()
        return True

    def during_migration(self, waiting_out: bool) -> bool:
        """A call that met a migrating slot, or failed while a slot of this cluster was
        migrating (its redirections make redis-py's cluster client close its connections,
        and find the nodes again)."""
        return waiting_out or self.loop.time() - self._migration_seen < MIGRATION_MEMORY

    @contextlib.asynccontextmanager
    async def node_clients(self, key: str | None) -> AsyncIterator[list[redis.asyncio.Redis]]:
        """A client of aiolock's own to the node serving `key`'s slot (None: to each
        primary), asked once the cluster client knows which node serves which slot, closed
        on exit."""
        cluster = self._cluster_client()
        await cluster.initialize()  # nothing is sent if it knows its nodes already
        nodes = cluster.get_primaries() if key is None else [_node_for(cluster, key)]
        own = [self.library.client(connection_pool=self.node_pool(node)) for node in nodes]
        try:
            yield own
        finally:
            for one in own:
                await one.connection_pool.disconnect()

    async def run_each(
        self,
        script: Script,
        calls: Sequence[Call],
        *,
        call: Callable[..., Awaitable[Any]],
        send_once: Callable[..., Awaitable[Any]],
        timeout: float,
        operation: str,
        split: Callable[[Sequence[str], Sequence[str | int]], list[Call]] | None,
    ) -> list[Any]:
        """Several calls of one script in one round trip per node (redis-py's cluster
        pipeline) on aiolock's own cluster client, bounded by `call` (the `Backend`'s
        bounded call) as a whole; `send_once` sends one on its own. See `Backend.run_each`.
        """
        commands = [("EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls]

        async def on(client: Any) -> list[Any]:

            async def pipelined() -> list[Any]:
                pipe = client.pipeline()
                for command in commands:
                    pipe.execute_command(*command)
                try:
                    replies: list[Any] = await pipe.execute(raise_on_error=False)
                except (*Errors.connection, *Errors.timeout) as exc:
                    return [exc] * len(commands)
                return replies

            async def alone(index: int, failed: BaseException) -> Any:
                command = commands[index]
                if isinstance(failed, Errors.noscript):
                    command = ("EVAL", script.source, *command[2:])
                try:
                    return await send_once(client, command, script, None, None)
                except (*Errors.try_again, *Errors.cluster_failure) as exc:
                    keys, args = calls[index]
                    if split is None or len(keys) < 2 or not migrating_refusal(exc):
                        raise
                pieces = split(keys, args)
                answers = await asyncio.gather(
                    *(
                        send_once(
                            client, ("EVALSHA", script.sha, len(k), *k, *a), script, None, None
                        )
                        for k, a in pieces
                    )
                )
                return [reply for answer in answers for reply in answer]

            async def send() -> list[Any]:
                replies = await pipelined()
                again = [i for i, reply in enumerate(replies) if isinstance(reply, BaseException)]
                if again:
                    answers = await asyncio.gather(*(alone(i, replies[i]) for i in again))
                    for i, answer in zip(again, answers, strict=True):
                        replies[i] = answer
                return replies

            result: list[Any] = await call(
                client,
                (),
                script=script,
                timeout=timeout,
                operation=operation,
                name=None,
                send=send,
            )
            return result

        result: list[Any] = await self._call_on_own(on, pin=True)
        return result

    def _own_taken(self, *, pin: bool) -> RedisCluster:
        """aiolock's own cluster client, made if need be, counted as used by one more call
        (see `_call_on_own`)."""
        if self._own is None:
            self._own = self._own_cluster()
        if self._own_closer is None:
            self._own_closer = self.loop.create_task(
                self._close_own_cluster_when_idle(), name="aiolock-cluster-client"
            )
        if pin:
            self._own_pinned = True
        self._own_calls += 1
        return self._own

    async def _close_own_cluster_when_idle(self) -> None:
        try:
            while True:
                await asyncio.sleep(OWN_IDLE)
                idle = self.loop.time() - self._own_used >= OWN_IDLE
                if not self._own_pinned and self._own_calls == 0 and idle:
                    return
        finally:
            own, self._own = self._own, None
            self._own_closer = None
            if own is not None:
                await own.aclose()

    def _own_cluster(self) -> RedisCluster:
        """A cluster client of aiolock's own, for every script call on a cluster: the
        user's connection settings (those a `RedisCluster` takes), connections of its own
        (the user's pool limit is not its own, and a pool exhausted by the user's commands
        does not hold renewals up), and the nodes the user's client knows to start from.
        It routes by slot and follows redirections itself, OWN_REDIRECTIONS at a time."""
        user = self.user_client()
        assert isinstance(user, self.library.cluster)
        settings = {
            key: value
            for key, value in self.connection_kwargs.items()
            if key in _CLUSTER_SETTINGS and key not in _NOT_COPIED
        }
        if issubclass(self.connection_class, self.library.ssl_connection):
            settings["ssl"] = True
        known = user.get_primaries() or list(user.nodes_manager.startup_nodes.values())
        manager = user.nodes_manager
        own = self.library.cluster(
            startup_nodes=[type(node)(node.host, node.port) for node in known],
            require_full_coverage=manager.require_full_coverage,
            address_remap=getattr(manager, "address_remap", None),
            **settings,
        )
        own.RedisClusterRequestTTL = OWN_REDIRECTIONS
        return own


def _give_back(node: ClusterNode, connection: Any) -> None:
    """Return a connection taken from `node` (`acquire_connection`) to its free ones:
    through the node's `release` where it has one (it disconnects a connection marked for
    a reconnect)."""
    release = getattr(node, "release", None)
    if release is not None:
        release(connection)
    else:
        node._free.append(connection)
