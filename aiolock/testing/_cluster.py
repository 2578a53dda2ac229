"""A throwaway Redis Cluster: `ClusterServers`, primaries only, each a `RedisServer`."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, Final, Self

import redis
import redis.asyncio
import redis.exceptions

from ._servers import RedisServer, ServerBinary, ServerStartError, start_on_free_ports

__all__ = ("ClusterServers",)

SLOTS: Final = 16384
BUS_OFFSET: Final = 10000
"""A cluster node's bus port is its port + 10000."""
READY_TIMEOUT: Final = 30.0
"""Longest wait for the nodes to agree that the cluster is up, seconds."""


class ClusterServers:
    """A Redis Cluster of `primaries` throwaway servers (3 to 16; no replicas), the slots
    split evenly between them, built with the cluster's own commands (`CLUSTER MEET`,
    `ADDSLOTS`), so any server binary with cluster support builds one.

    ```python
    with ClusterServers(find_binaries()[0]) as cluster:
        client = cluster.client()          # a redis.asyncio.RedisCluster
        ...
    ```

    Each node is a `RedisServer` (on 127.0.0.1, nothing on disk, dying with this process);
    `start()` returns once every node says the cluster is up.

    Added in 0.1.
    """

    def __init__(self, binary: ServerBinary, *, primaries: int = 3) -> None:
        if isinstance(primaries, bool) or not isinstance(primaries, int):
            raise TypeError(f"primaries must be an int, got {type(primaries).__name__}")
        if not 3 <= primaries <= 16:
            raise ValueError(f"primaries must be from 3 to 16, got {primaries}")
        args = ("--cluster-enabled", "yes", "--cluster-node-timeout", "5000")
        self.servers = [RedisServer(binary, extra_args=args) for _ in range(primaries)]

    @property
    def ports(self) -> list[int]:
        return [server.port for server in self.servers]

    def __repr__(self) -> str:
        return f"<ClusterServers ports={self.ports}>"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Self:
        """Start the nodes on free ports (their bus ports free too), join them, give each
        its share of the slots, and wait until the cluster is up.

        Raises:
            ServerStartError: a node did not start, or the cluster was not up within
                30 s (every node started is stopped first).
        """
        start_on_free_ports(self.servers, offset=BUS_OFFSET, then=self._create)
        return self

    def stop(self) -> None:
        """Stop every node (those not running are skipped)."""
        for server in self.servers:
            server.stop()
            server.port = 0

    def client(self, **kwargs: Any) -> redis.asyncio.RedisCluster:
        """A `redis.asyncio.RedisCluster` that knows every node to start from."""
        nodes = [redis.asyncio.cluster.ClusterNode("127.0.0.1", port) for port in self.ports]
        return redis.asyncio.RedisCluster(startup_nodes=nodes, **kwargs)

    def _create(self) -> None:
        first = self.ports[0]
        share = -(-SLOTS // len(self.servers))
        for index, port in enumerate(self.ports):
            with _node(port) as node:
                if port != first:
                    node.execute_command("CLUSTER", "MEET", "127.0.0.1", first)
                slots = range(index * share, min((index + 1) * share, SLOTS))
                node.execute_command("CLUSTER", "ADDSLOTS", *slots)
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._up():
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{self!r}: the cluster was not up within {READY_TIMEOUT:g}s"
                )
            time.sleep(0.05)  # the nodes gossip in the background: nothing to wait on

    def _up(self) -> bool:
        for port in self.ports:
            try:
                with _node(port) as node:
                    info = str(node.execute_command("CLUSTER", "INFO"))
                    known = str(node.execute_command("CLUSTER", "NODES")).strip().splitlines()
            except (redis.exceptions.RedisError, OSError):
                return False
            if "cluster_state:ok" not in info or len(known) != len(self.ports):
                return False
        return True


def _node(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=5.0, decode_responses=True)
