"""`ServerGroup`: N independent throwaway servers for the Redlock tests and the checker.

Each node is a `RedisServer` of the test's own (on a loopback port, nothing on disk), and
some may be reached through a `FaultProxy` (`proxied=`: their clients connect to the proxy,
which forwards to the server). A test, or the checker's nemesis, then acts on one node at a
time by its index:

- `pause(i)` / `resume(i)`: SIGSTOP / SIGCONT (by the PID the group recorded);
- `kill(i)`, then `await start(i)`: the node is gone (SIGKILL, its data with it) until it is
  started again on the same port, empty (the algorithm's delayed restart, when the start is
  later than the ttl);
- `await restart_empty(i)`: killed and started again at once, empty;
- `await delay(indices, seconds)` / `await undelay()`: the replies of proxied nodes reach the
  clients `seconds` late (the requests go through at once).

```python
async with ServerGroup(binary, 5, proxied=(0, 1)) as group:
    clients = group.clients()          # one redis.asyncio.Redis per node, closed at the end
    ...
```

On the way out every client the group made is closed, every proxy closed and every server
stopped, whatever happened in the block (a paused server is resumed first by `stop()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Self

import redis.asyncio

from ..support.servers import RedisServer, ServerBinary, quorum_calls_ended
from .proxy import FaultProxy

__all__ = ("ServerGroup",)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ServerGroup:
    """`count` servers of `binary`; those at the indices `proxied` behind a `FaultProxy`."""

    def __init__(self, binary: ServerBinary, count: int, *, proxied: Iterable[int] = ()) -> None:
        if count < 1:
            raise ValueError("a group needs at least one server")
        self.servers = [RedisServer(binary) for _ in range(count)]
        self.proxied = tuple(sorted(set(proxied)))
        if any(not 0 <= i < count for i in self.proxied):
            raise ValueError(f"proxied indices must be 0 to {count - 1}")
        self.proxies: dict[int, FaultProxy] = {}
        self._clients: list[redis.asyncio.Redis] = []
        self.paused: set[int] = set()
        self.down: set[int] = set()
        self.delayed: set[int] = set()

    def __len__(self) -> int:
        return len(self.servers)

    def __repr__(self) -> str:
        return f"<ServerGroup of {len(self)}: ports {[s.port for s in self.servers]}>"

    # ------------------------------------------------------------------ life cycle
    async def __aenter__(self) -> Self:
        try:
            for server in self.servers:
                server.start()
            for index in self.proxied:
                self.proxies[index] = await FaultProxy(self.servers[index].port).start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Wait for the calls a Redlock left to its slower nodes (each ends within its node
        timeout), then close the group's clients and proxies and stop every server (each
        step bounded by its own helper: a client's close, a proxy's `aclose`, a server's
        `stop`)."""
        clients, self._clients = self._clients, []
        try:
            await quorum_calls_ended(clients)
        finally:
            for client in clients:
                with contextlib.suppress(Exception):
                    await client.aclose()
            proxies, self.proxies = list(self.proxies.values()), {}
            for proxy in proxies:
                await proxy.aclose()
            for server in self.servers:
                server.stop()

    # ------------------------------------------------------------------ addresses, clients
    def url(self, index: int) -> str:
        """Where the clients reach node `index`: its proxy if it has one, else the server."""
        proxy = self.proxies.get(index)
        return proxy.url if proxy is not None else self.servers[index].url

    @property
    def urls(self) -> list[str]:
        return [self.url(i) for i in range(len(self))]

    @property
    def direct_urls(self) -> list[str]:
        """The servers themselves, proxies bypassed (to inspect or sweep the nodes)."""
        return [server.url for server in self.servers]

    def clients(
        self, *, direct: bool = False, retrying: bool = False, **kwargs: Any
    ) -> list[redis.asyncio.Redis]:
        """A new client per node (through the proxies unless `direct`), closed with the group.

        With `retrying`, made as users make them, `Redis(host=..., port=...)`: with
        redis-py's default retries (a command retried up to 10 times on a connection error,
        a refused connection included, with backoff: seconds per call against a dead
        server), which `from_url` does not give."""
        urls = self.direct_urls if direct else self.urls
        if retrying:
            addresses = [urllib.parse.urlsplit(url) for url in urls]
            made = [
                redis.asyncio.Redis(host=address.hostname or "", port=address.port or 0, **kwargs)
                for address in addresses
            ]
        else:
            made = [redis.asyncio.Redis.from_url(url, **kwargs) for url in urls]
        self._clients += made
        return made

    def client(self, index: int, *, direct: bool = True, **kwargs: Any) -> redis.asyncio.Redis:
        """A new client of node `index` (the server itself by default), closed with the group."""
        url = self.servers[index].url if direct else self.url(index)
        made = redis.asyncio.Redis.from_url(url, **kwargs)
        self._clients.append(made)
        return made

    # ------------------------------------------------------------------ faults
    def pause(self, index: int) -> None:
        """SIGSTOP node `index`: it answers nothing until `resume(index)`."""
        self.servers[index].pause()
        self.paused.add(index)

    def resume(self, index: int) -> None:
        self.servers[index].resume()
        self.paused.discard(index)

    def kill(self, index: int) -> None:
        """SIGKILL node `index`: its connections break, its data is gone; `start(index)`
        brings it back, empty, on the same port."""
        self.servers[index].kill()
        self.down.add(index)

    async def start(self, index: int) -> None:
        """Start killed node `index` again on its port (in a thread: the loop goes on)."""
        await asyncio.to_thread(self.servers[index].start)
        self.down.discard(index)

    async def restart_empty(self, index: int) -> None:
        """Kill node `index` and start it again at once, with no data."""
        self.kill(index)
        await self.start(index)

    async def delay(self, indices: Sequence[int], seconds: float) -> None:
        """Delay every reply of the proxied nodes `indices` by `seconds` from now on."""
        for index in indices:
            proxy = self.proxies.get(index)
            if proxy is None:
                raise ValueError(f"node {index} has no proxy (proxied: {self.proxied})")
            proxy.delay_replies(seconds)
            self.delayed.add(index)

    async def undelay(self) -> None:
        """Every proxy forwards normally again; what they recorded is forgotten."""
        for index, proxy in self.proxies.items():
            await proxy.restore()
            proxy.arrivals.clear()
            self.delayed.discard(index)

    @property
    def affected(self) -> set[int]:
        """The nodes under a fault now (paused, down or delayed)."""
        return self.paused | self.down | self.delayed

    # ------------------------------------------------------------------ inspection
    async def fields(self, key: str) -> list[dict[str, str] | None]:
        """The hash `key` on each node, read directly (None: the node is down or paused,
        {} if it has no such key)."""
        found: list[dict[str, str] | None] = []
        for index, server in enumerate(self.servers):
            if index in self.down or index in self.paused:
                found.append(None)
                continue
            client = redis.asyncio.Redis.from_url(server.url)
            try:
                raw = await client.hgetall(key)
                found.append({_text(k): _text(v) for k, v in raw.items()})
            finally:
                await client.aclose()
        return found
