"""A Sentinel deployment of throwaway processes: one master, one replica, three Sentinels.

Every process is a `RedisServer` on a free loopback port, owned by the test process (each
dies with it, however it ends) and stopped by `stop()`. The Sentinels watch the master as
`SERVICE` with a quorum of 2, call it down after `down_after_ms` without a reply, and may
fail over again soon after (`failover_timeout_ms`), so that a test's failover takes a
couple of seconds, not the defaults' half a minute. Each Sentinel's configuration names the
replica and the other two Sentinels (with their ids) from the start: found by themselves,
through the master's hello channel, they would take seconds to know each other.

Every wait here is bounded and says what it waited for when it runs out.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, Final, Self

import redis.asyncio
import redis.exceptions
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from aiolock.testing._servers import ServerStartError, free_ports

from ..support.servers import RedisServer, ServerBinary
from ..support.waits import eventually

SERVICE: Final = "m"
"""The name the Sentinels know the master by."""

READY_BOUND: Final = 20.0
"""Longest wait for the Sentinels to know each other and the replica."""

START_TRIES: Final = 5
"""How many sets of ports the Sentinels try: another process may take a port between its
choice and the Sentinel's start."""

FAILOVER_BOUND: Final = 15.0
"""Longest wait for a failover to complete and be seen by every Sentinel."""


async def _ask(port: int, *command: str | int) -> Any:
    """One command to the process on 127.0.0.1:`port`, on a connection of its own."""
    client = redis.asyncio.Redis(port=port, socket_timeout=2.0, decode_responses=True)
    try:
        return await client.execute_command(*command)  # type: ignore[no-untyped-call]
    finally:
        await client.aclose()


async def _quietly(check: Callable[[], Awaitable[bool]]) -> bool:
    """`check()`, false while the process it asks does not answer (it may be restarting)."""
    try:
        return await check()
    except (redis.exceptions.RedisError, OSError):
        return False


class SentinelGroup:
    """One master, one replica (`--replicaof`), three Sentinels watching them."""

    def __init__(
        self,
        binary: ServerBinary,
        *,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 2000,
    ) -> None:
        self.binary = binary
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        # A replica's first sync starts at once, not after the default 5 s (which waits for
        # more replicas to share one transfer).
        self._data_args = ("--repl-diskless-sync-delay", "0")
        self.master = RedisServer(binary, extra_args=self._data_args)
        self.replica: RedisServer | None = None
        self.sentinels: list[RedisServer] = []

    # ------------------------------------------------------------------ life cycle
    def start(self) -> Self:
        try:
            self.master.start()
            self.replica = RedisServer(
                self.binary,
                extra_args=(*self._data_args, "--replicaof", "127.0.0.1", str(self.master.port)),
            ).start()
            self._start_sentinels()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_sentinels(self) -> None:
        """Three Sentinels on ports chosen together (each one's configuration names the
        others'); another process may take one of them before its Sentinel listens: then
        all three start again on new ports, up to `START_TRIES` times."""
        for attempt in range(START_TRIES):
            try:
                for sentinel in self._sentinels(free_ports(3)):
                    self.sentinels.append(sentinel)
                    sentinel.start()
                return
            except ServerStartError as exc:
                for sentinel in self.sentinels:
                    sentinel.stop()
                self.sentinels.clear()
                if attempt == START_TRIES - 1 or not exc.port_taken:
                    raise

    def _sentinels(self, ports: list[int]) -> list[RedisServer]:
        assert self.replica is not None
        ids = [secrets.token_hex(20) for _ in ports]
        sentinels = []
        for me, (myid, port) in enumerate(zip(ids, ports, strict=True)):
            others = "".join(
                f"sentinel known-sentinel {SERVICE} 127.0.0.1 {p} {i}\n"
                for other, (i, p) in enumerate(zip(ids, ports, strict=True))
                if other != me
            )
            config = (
                f"sentinel myid {myid}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
                f"sentinel known-replica {SERVICE} 127.0.0.1 {self.replica.port}\n"
                f"{others}"
            )
            sentinel = RedisServer(self.binary, config=config, extra_args=("--sentinel",))
            sentinel.port = port  # known to the others already
            sentinels.append(sentinel)
        return sentinels

    def stop(self) -> None:
        for server in [*self.sentinels, self.replica, self.master]:
            if server is not None:
                server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ clients
    @property
    def data_servers(self) -> list[RedisServer]:
        assert self.replica is not None
        return [self.master, self.replica]

    def by_port(self, port: int) -> RedisServer:
        for server in self.data_servers:
            if server.port == port:
                return server
        raise AssertionError(f"no data server of this group listens on port {port}")

    def sentinel(self, **kwargs: Any) -> Sentinel:
        """A redis-py `Sentinel` that knows every Sentinel of the group."""
        sentinels = [("127.0.0.1", s.port) for s in self.sentinels]
        return Sentinel(sentinels, **kwargs)

    def master_client(self, **kwargs: Any) -> redis.asyncio.Redis:
        """`Sentinel(...).master_for(SERVICE)`: a client that follows the master."""
        client: redis.asyncio.Redis = self.sentinel().master_for(SERVICE, **kwargs)
        return client

    # ------------------------------------------------------------------ state
    async def master_port(self, sentinel: RedisServer | None = None) -> int:
        """The master's port as a Sentinel (the first by default) reports it."""
        host, port = await _ask(
            (sentinel or self.sentinels[0]).port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE
        )
        assert host == "127.0.0.1", host
        return int(port)

    async def role(self, server: RedisServer) -> str:
        """What `server` says it is: "master" or "slave"."""
        reply = await _ask(server.port, "ROLE")
        return str(reply[0])

    async def ready(self, timeout: float = READY_BOUND) -> None:
        """Wait until every Sentinel knows the master, the replica (in sync) and the two
        other Sentinels: only then can they agree on a failover."""
        assert self.replica is not None
        replica = self.replica

        async def in_sync() -> bool:
            info = await _ask(replica.port, "INFO", "replication")
            return bool(info.get("master_link_status") == "up")

        async def known(sentinel: RedisServer) -> bool:
            master = await _ask(sentinel.port, "SENTINEL", "MASTER", SERVICE)
            replicas = await _ask(sentinel.port, "SENTINEL", "REPLICAS", SERVICE)
            return (
                int(master["port"]) == self.master.port
                and int(master["num-other-sentinels"]) == 2
                and any(
                    int(r["port"]) == replica.port and r.get("master-link-status") == "ok"
                    for r in replicas
                )
            )

        async def everyone() -> bool:
            if not await in_sync():
                return False
            for sentinel in self.sentinels:
                if not await known(sentinel):
                    return False
            return True

        await eventually(
            lambda: _quietly(everyone),
            what="the replica in sync and every Sentinel knowing the master, the replica "
            "and the two other Sentinels",
            timeout=timeout,
            interval=0.05,
        )

    async def wait_for_master(self, port: int, timeout: float = FAILOVER_BOUND) -> None:
        """Wait until every Sentinel names the process on `port` as the master, and that
        process says it is one."""
        server = self.by_port(port)

        async def switched() -> bool:
            for sentinel in self.sentinels:
                if await self.master_port(sentinel) != port:
                    return False
            return await self.role(server) == "master"

        await eventually(
            lambda: _quietly(switched),
            what=f"every Sentinel naming 127.0.0.1:{port} as the master, and it a master",
            timeout=timeout,
            interval=0.02,
        )

    async def wait_for_role(
        self, server: RedisServer, role: str, timeout: float = FAILOVER_BOUND
    ) -> None:
        async def has_role() -> bool:
            return await self.role(server) == role

        await eventually(
            lambda: _quietly(has_role),
            what=f"{server!r} reporting the role {role!r}",
            timeout=timeout,
            interval=0.02,
        )

    async def failover(self, timeout: float = FAILOVER_BOUND) -> RedisServer:
        """`SENTINEL FAILOVER` on the first Sentinel; returns the new master once every
        Sentinel names it and it has taken the role (the old one may still think it is a
        master: the Sentinels demote it later)."""
        old = self.by_port(await self.master_port())
        (new,) = [server for server in self.data_servers if server is not old]
        await _ask(self.sentinels[0].port, "SENTINEL", "FAILOVER", SERVICE)
        await self.wait_for_master(new.port, timeout)
        return new

    async def replicated(self, timeout: float = 5.0) -> None:
        """Wait until the current master's writes so far reached its replica."""
        await replicated(await self.master_port(), timeout)


async def replicated(port: int, timeout: float = 5.0) -> None:
    """Wait until the writes so far of the server on `port` reached a replica: a write, then
    `WAIT 1` on the same connection. (`WAIT` on a connection that wrote nothing counts every
    replica online, even one that has acknowledged nothing yet, as after a full sync.)"""
    client = redis.asyncio.Redis(port=port, socket_timeout=timeout + 2.0)
    try:
        await client.set("aiolock-test:replicated", 1)
        acked = await client.execute_command("WAIT", 1, int(timeout * 1000))  # type: ignore[no-untyped-call]
    finally:
        await client.aclose()
    assert int(acked) >= 1, f"the replica did not acknowledge within {timeout:g}s"


@contextlib.asynccontextmanager
async def closing(*clients: redis.asyncio.Redis) -> AsyncIterator[None]:
    """Close `clients` on the way out, and the connections their `Sentinel` opened to the
    Sentinels (redis-py closes those with neither the client nor the `Sentinel`)."""
    try:
        yield
    finally:
        for client in clients:
            await client.aclose()
            pool = client.connection_pool
            if isinstance(pool, SentinelConnectionPool):
                for sentinel in pool.sentinel_manager.sentinels:
                    await sentinel.aclose()
