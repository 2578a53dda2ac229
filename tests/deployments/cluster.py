"""A Redis Cluster of throwaway processes: three primaries, each with one replica.

Every process is a `RedisServer` on a free loopback port, started with cluster mode on and
owned by the test process (each dies with it, however it ends). The cluster is built with
the cluster's own commands (`CLUSTER MEET`, `ADDSLOTS`, `REPLICATE`), as `redis-cli
--cluster create` does, so that every server kind here can build one. A node is called
failing after `node_timeout_ms` without an answer.

Every wait here is bounded and says what it waited for when it runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, Final, Self

import redis.asyncio
import redis.exceptions
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from aiolock.testing._servers import start_on_free_ports

from ..support.servers import RedisServer, ServerBinary, all_closed
from ..support.waits import WaitTimeout, eventually
from .sentinel import _ask, _quietly

SLOTS: Final = 16384

READY_BOUND: Final = 30.0
REMEET_AFTER: Final = 3.0
"""How long the nodes may take to know each other before they are told to meet again."""
"""Longest wait for the cluster to agree on its slots and for the replicas to sync."""

MANUAL_FAILOVER_TRY: Final = 6.0
"""How long one `CLUSTER FAILOVER` is waited for before it is asked again: Redis aborts a
manual failover that has not completed within 5 s (the replica did not catch up with its
primary, or did not win the primaries' vote, on a loaded machine), saying nothing."""


BUS_OFFSET: Final = 10000
"""A cluster node's bus port is its port + 10000 (so its port must be below 55536)."""


class ClusterGroup:
    """Three primaries (slots split in three), three replicas (one per primary)."""

    def __init__(self, binary: ServerBinary, *, node_timeout_ms: int = 1000) -> None:
        args = (
            "--cluster-enabled", "yes",
            "--cluster-node-timeout", str(node_timeout_ms),
            "--repl-diskless-sync-delay", "0",
        )  # fmt: skip
        self.servers = [RedisServer(binary, extra_args=args) for _ in range(6)]
        self.ids: dict[int, str] = {}

    # ------------------------------------------------------------------ life cycle
    def __enter__(self) -> Self:
        start_on_free_ports(self.servers, offset=BUS_OFFSET)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        for server in self.servers:
            server.resume()
            server.stop()

    async def create(self) -> None:
        """Join the nodes, give each primary a third of the slots, make the other three
        their replicas, and wait until every node says the cluster is up and every replica
        is in sync."""
        for server in self.servers:
            self.ids[server.port] = str(await _ask(server.port, "CLUSTER", "MYID"))
        first = self.servers[0]
        for server in self.servers[1:]:
            await _ask(server.port, "CLUSTER", "MEET", "127.0.0.1", first.port)
        bounds = [0, SLOTS // 3, 2 * SLOTS // 3, SLOTS]
        for index, primary in enumerate(self.servers[:3]):
            await _ask(
                primary.port, "CLUSTER", "ADDSLOTS", *range(bounds[index], bounds[index + 1])
            )

        loop = asyncio.get_running_loop()
        met = loop.time()

        async def everyone_known() -> bool:
            nonlocal met
            known = True
            for server in self.servers:
                # Known by its own ID: a node still in its handshake is listed under a
                # random one (a CLUSTER REPLICATE naming it would be refused).
                nodes = str(await _ask(server.port, "CLUSTER", "NODES"))
                listed = {line.split()[0] for line in nodes.strip().splitlines()}
                known = known and "handshake" not in nodes and listed == set(self.ids.values())
            if not known and loop.time() - met >= REMEET_AFTER:
                # A handshake not done within the node timeout (a loaded machine) is
                # forgotten, never tried again: meet again (a handshake in progress, or
                # a node known, makes it a no-op).
                met = loop.time()
                for server in self.servers[1:]:
                    await _ask(server.port, "CLUSTER", "MEET", "127.0.0.1", first.port)
            return known

        await eventually(
            lambda: _quietly(everyone_known), what="every node knowing the other five",
            timeout=READY_BOUND, interval=0.05,
        )  # fmt: skip
        for primary, replica in zip(self.servers[:3], self.servers[3:], strict=True):
            await _ask(replica.port, "CLUSTER", "REPLICATE", self.ids[primary.port])
        await self.ready()

    async def ready(self, timeout: float = READY_BOUND) -> None:
        async def up() -> bool:
            for server in self.servers:
                info = str(await _ask(server.port, "CLUSTER", "INFO"))
                if "cluster_state:ok" not in info:
                    return False
            for server in self.servers:
                replication = await _ask(server.port, "INFO", "replication")
                if replication.get("role") == "slave" and (
                    replication.get("master_link_status") != "up"
                ):
                    return False
            return True

        await eventually(
            lambda: _quietly(up), what="the cluster up and every replica in sync",
            timeout=timeout, interval=0.05,
        )  # fmt: skip

    # ------------------------------------------------------------------ clients and facts
    def client(self, **kwargs: Any) -> RedisCluster:
        """A `RedisCluster` client that knows every node to start from (one that was
        killed is skipped)."""
        nodes = [ClusterNode("127.0.0.1", server.port) for server in self.servers]
        return RedisCluster(startup_nodes=nodes, **kwargs)

    def clients(self, count: int) -> contextlib.AbstractAsyncContextManager[list[RedisCluster]]:
        """`count` clients (`client()`), as `count` processes would have, closed at the end."""
        return all_closed([self.client() for _ in range(count)])

    async def owner(self, slot: int) -> RedisServer:
        """The primary serving `slot`, as the first node that answers says."""
        for server in self.servers:
            try:
                shards = await _ask(server.port, "CLUSTER", "SLOTS")
            except (redis.exceptions.RedisError, OSError):
                continue
            for start, end, primary, *_ in shards:
                if int(start) <= slot <= int(end):
                    return self.by_port(int(primary[1]))
        raise AssertionError(f"no node answered who serves slot {slot}")

    async def migration_of(self, slot: int) -> tuple[RedisServer, RedisServer]:
        """Where `slot` would migrate: the primary serving it, and another primary."""
        source = await self.owner(slot)
        return source, next(s for s in self.servers[:3] if s is not source)

    def by_port(self, port: int) -> RedisServer:
        for server in self.servers:
            if server.port == port:
                return server
        raise AssertionError(f"no node of this cluster listens on port {port}")

    async def fail_over(self, slot: int, timeout: float = READY_BOUND) -> RedisServer:
        """A coordinated failover of the primary serving `slot` to its replica (`CLUSTER
        FAILOVER` on the replica, asked again each `MANUAL_FAILOVER_TRY` seconds until the
        replica serves the slot, within `timeout`); returns the new primary."""
        primary = await self.owner(slot)
        replica = await self.replica_of(primary)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            with contextlib.suppress(redis.exceptions.RedisError, OSError):
                await _ask(replica.port, "CLUSTER", "FAILOVER")
            left = deadline - loop.time()
            try:
                await _switched(self, slot, replica, max(min(MANUAL_FAILOVER_TRY, left), 0.0))
            except WaitTimeout:
                if loop.time() >= deadline:
                    raise
                continue
            return replica

    async def replica_of(self, primary: RedisServer) -> RedisServer:
        for server in self.servers:
            replication = await _ask(server.port, "INFO", "replication")
            if (
                replication.get("role") == "slave"
                and int(replication.get("master_port", 0)) == primary.port
            ):
                return server
        raise AssertionError(f"no replica of {primary!r}")

    async def commands(self, server: RedisServer, name: str) -> int:
        """How many times `server` has run the command `name` (INFO commandstats)."""
        stats = await _ask(server.port, "INFO", "commandstats")
        entry = stats.get(f"cmdstat_{name.lower()}")
        return int(entry["calls"]) if entry else 0

    async def inject(self, kind: str, name: str, length: float = 0.0) -> str:
        """One fault on the primary serving lock `name` (the checker's nemesis): "pause"
        it for `length` seconds (shorter than the node timeout: no failover), "failover"
        to its replica (`CLUSTER FAILOVER`, waited for), "reshard" the name's slot to
        another primary, or "slow-reshard" it: the migration held open for `length`
        seconds with half of the slot's keys moved (every script naming several keys of a
        name is answered TRYAGAIN meanwhile). Returns what was done."""
        slot = int(key_slot(f"aiolock:{{{name}}}".encode()))
        primary = await self.owner(slot)
        if kind == "pause":
            primary.pause()
            try:
                await asyncio.sleep(length)
            finally:
                primary.resume()
            return f"primary :{primary.port} of slot {slot} paused"
        if kind == "failover":
            replica = await self.fail_over(slot)
            return f"slot {slot} failed over to :{replica.port}"
        if kind in ("reshard", "slow-reshard"):
            primaries = [s for s in self.servers if s is not primary and await _is_primary(s)]
            target = primaries[0]
            if kind == "reshard":
                await self.move_slot(slot, target)
                return f"slot {slot} moved to :{target.port}"
            moved: list[tuple[int, int]] = []

            def half(keys: list[str]) -> list[str]:
                picked = keys[: max(len(keys) // 2, 1)]
                moved.append((len(picked), len(keys)))
                return picked

            await self.move_slot(slot, target, first=half, midway=lambda: asyncio.sleep(length))
            first, of = moved[0]
            return f"slot {slot} moved to :{target.port}, {first} of {of} keys first, {length:g}s"
        raise ValueError(f"no such cluster fault: {kind!r}")

    async def move_slot(
        self,
        slot: int,
        target: RedisServer,
        *,
        midway: Callable[[], Awaitable[None]] | None = None,
        first: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        """Migrate `slot` (with its keys) to the primary `target`, as a resharding does:
        IMPORTING on the target, MIGRATING on the source, MIGRATE of the keys, then the
        new owner told to every primary. `midway` is awaited once the keys have moved and
        before the owner changes: the source then answers ASK for them. With `first`, only
        the keys it picks (of those in the slot) move before `midway`, the others after
        it: the migration is held open with a name's keys on both sides, where every
        command naming several of them is answered TRYAGAIN."""
        source = await self.owner(slot)
        assert source is not target, "the slot is on the target already"
        await _ask(target.port, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.ids[source.port])
        await _ask(source.port, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.ids[target.port])

        async def migrate(pick: Callable[[list[str]], list[str]] | None) -> None:
            while True:
                keys = await _ask(source.port, "CLUSTER", "GETKEYSINSLOT", slot, 100)
                if pick is not None:
                    keys = pick(keys)
                if not keys:
                    return
                await _ask(
                    source.port, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys
                )
                if pick is not None:
                    return

        await migrate(first)
        if midway is not None:
            await midway()
        if first is not None:
            await migrate(None)
        for server in (target, source, *[s for s in self.servers[:6] if s not in (target, source)]):
            # A replica refuses SETSLOT: it learns the owner from its primary.
            with contextlib.suppress(redis.exceptions.ResponseError):
                await _ask(server.port, "CLUSTER", "SETSLOT", slot, "NODE", self.ids[target.port])


async def _switched(group: ClusterGroup, slot: int, to: RedisServer, timeout: float) -> None:
    async def serving() -> bool:
        return await group.owner(slot) is to

    await eventually(lambda: _quietly(serving), what=f"{to!r} serving slot {slot}", timeout=timeout)


async def _is_primary(server: RedisServer) -> bool:
    replication = await _ask(server.port, "INFO", "replication")
    return bool(replication.get("role") == "master")


async def on_replica(replica: RedisServer, key: str) -> bool:
    """Whether the cluster replica `replica` has `key` (READONLY, then EXISTS, on one
    connection: without READONLY a replica answers MOVED)."""
    client = redis.asyncio.Redis(port=replica.port, single_connection_client=True)
    try:
        await client.execute_command("READONLY")  # type: ignore[no-untyped-call]
        return bool(await client.exists(key))
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def cluster_of(binary: ServerBinary) -> AsyncIterator[ClusterGroup]:
    """A cluster of `binary`'s servers, created, for the block (every process stopped after)."""
    with ClusterGroup(binary) as group:
        await group.create()
        yield group
