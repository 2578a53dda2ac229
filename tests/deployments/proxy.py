"""`FaultProxy`: a TCP proxy between the clients of a test and one server, faulty on demand.

One listener on a free port of 127.0.0.1 forwards every connection to the server. The test
then turns faults on and off at any moment:

- `delay_replies(s)`: every reply chunk read from the server from now on reaches the
  client `s` seconds later (requests still go through at once, in order);
- `lose_reply_to(b"EVALSHA")`: the reply to the next request containing these bytes is
  lost (that request reaches the server); everything else flows. With `reset=True`, its
  connection is reset (RST) when that reply comes from the server instead: the request
  was applied, and the client sees a broken connection;
- `blackhole()`: nothing is forwarded in either direction, and every socket stays open
  (a partition: the peers see silence, not an error). The bytes are held and delivered
  by `restore()`, as TCP would after a partition heals; `blackhole(discard=True)` drops
  them instead;
- `reset_all()`: every open connection is reset now (RST, by SO_LINGER 0);
- `refuse_new()`: the listener is closed, so new connections are refused (ECONNREFUSED);
  open connections are untouched;
- `hold_requests(b"SUBSCRIBE")`: requests containing these bytes are held (on their
  connection, with whatever follows them) until `restore()`, to pin a fault to an exact
  protocol step; the returned event is set when one is held;
- `silence_next(b"SUBSCRIBE")`: the next connection to carry a request containing these
  bytes goes silent for good, from that request on: nothing more is forwarded on it in
  either direction, and its sockets stay open (a connection that a NAT or a load balancer
  dropped without a reset); other connections, and new ones, are untouched. The returned
  event is set when it happens;
- `silence_subscribers()`: the same, now, for every open connection that has carried a
  SUBSCRIBE (the pub/sub connections);
- `restore()`: all of the above undone.

`arrivals` records, for every request chunk, when it reached the proxy (`loop.time()`, the
clients' own clock, as the proxy runs in their event loop) and its bytes: an upper bound on
when the client sent it.

```python
proxy = await FaultProxy(server.port).start()
try:
    client = redis.asyncio.Redis.from_url(proxy.url)
    ...
    proxy.blackhole()
finally:
    await client.aclose()
    await proxy.aclose()
```

Traffic stays on 127.0.0.1. `aclose()` closes every socket and ends every task the proxy
started, so tests running with warnings as errors stay clean. A proxy runs in the event
loop that started it, so it stops forwarding while that loop is blocked: `ThreadedProxy`
runs one in a thread of its own, for tests that block their own loop (a stall).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from typing import Self

__all__ = ("FaultProxy", "ThreadedProxy")

_CHUNK = 65536
_LINGER_ZERO = struct.pack("ii", 1, 0)


def _set_linger_zero(writer: asyncio.StreamWriter) -> None:
    """Make the next close of this socket send a RST instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)


class _Link:
    """One client connection and its upstream connection to the server."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.silent = False  # dropped by a middlebox: nothing goes through, no reset
        self.lose_next_reply = False
        self.reset_on_reply = False  # reset instead of delivering the reply lost
        self.subscribed = False  # has carried a SUBSCRIBE: a pub/sub connection

    def reset(self) -> None:
        for writer in (self.client, self.upstream):
            _set_linger_zero(writer)
            writer.transport.abort()

    def close(self) -> None:
        for writer in (self.client, self.upstream):
            writer.transport.abort()

    async def wait_closed(self) -> None:
        for writer in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class FaultProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`upstream_port`, with faults on demand."""

    def __init__(self, upstream_port: int, *, upstream_host: str = "127.0.0.1") -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.port = 0
        self.connections_accepted = 0
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._delay = 0.0
        self._connect_delay = 0.0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._discard = False
        self._closed = False
        self._holds: list[tuple[bytes, asyncio.Event]] = []
        self._holds_lifted = asyncio.Event()
        self._holds_lifted.set()
        self._silences: list[tuple[bytes, asyncio.Event]] = []
        self._lose_reply_to: list[tuple[bytes, bool]] = []
        self.silenced = 0
        self.arrivals: list[tuple[float, bytes]] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def open_connections(self) -> int:
        return len(self._links)

    def arrived(self, containing: bytes, *, since: float = 0.0) -> list[float]:
        """When requests containing `containing` reached the proxy, after `since`."""
        return [at for at, data in self.arrivals if at >= since and containing in data]

    async def start(self) -> Self:
        await self._listen()
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])

    # ----------------------------------------------------------------- faults
    def delay_replies(self, seconds: float) -> None:
        """Hold every reply chunk read from the server from now on for `seconds`."""
        self._delay = seconds

    def lose_reply_to(self, containing: bytes, *, reset: bool = False) -> None:
        """Lose the reply to the next request containing `containing` (it is applied).

        With `reset`, the connection is reset (RST) as that reply comes from the server,
        instead of going on without it. Each call loses one reply: call it twice to lose
        the reply to a request and to the same request sent again.
        """
        self._lose_reply_to.append((containing, reset))

    def blackhole(self, *, discard: bool = False) -> None:
        """Forward nothing, in either direction; keep every socket open.

        Bytes are held until `restore()` (a partition that heals), or dropped if `discard`.
        """
        self._discard = discard
        self._flowing.clear()

    def delay_connections(self, seconds: float) -> None:
        """Connect each new connection to the server only `seconds` after accepting it
        (until `restore()`): a client that waits for its handshake's replies (redis-py's
        `CLIENT SETINFO`) writes nothing else until then."""
        self._connect_delay = seconds

    def reset_all(self) -> int:
        """Reset (RST) every open connection now; returns how many there were."""
        links = list(self._links)
        for link in links:
            link.reset()
        return len(links)

    def refuse_new(self) -> None:
        """Stop listening: new connections are refused until `restore()`."""
        if self._server is not None:
            self._server.close()
            self._server = None

    def hold_requests(self, containing: bytes) -> asyncio.Event:
        """Hold every request chunk that contains `containing` until `restore()`.

        Returns an event set as soon as such a request is held.
        """
        held = asyncio.Event()
        self._holds.append((containing, held))
        self._holds_lifted.clear()
        return held

    def silence_next(self, containing: bytes) -> asyncio.Event:
        """Silence, for good, the next connection that carries a request containing
        `containing` (that request included). Returns an event set when it happens."""
        done = asyncio.Event()
        self._silences.append((containing, done))
        return done

    def silence_subscribers(self) -> int:
        """Silence, for good, every open pub/sub connection; returns how many there were."""
        links = [link for link in self._links if link.subscribed and not link.silent]
        for link in links:
            link.silent = True
        self.silenced += len(links)
        return len(links)

    async def restore(self) -> None:
        """Forward normally again: no delay, held bytes delivered, listening again."""
        self._delay = 0.0
        self._connect_delay = 0.0
        self._discard = False
        self._lose_reply_to.clear()
        self._flowing.set()
        self._holds.clear()
        self._holds_lifted.set()
        self._silences.clear()
        if self._server is None and not self._closed:
            await self._listen()

    # ----------------------------------------------------------------- forwarding
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._link(reader, writer)
        except asyncio.CancelledError:
            if not self._closed:
                raise
            # Ended by `aclose`: ends as a handler does, not cancelled (on Python 3.11 the
            # stream server logs a cancelled handler as an exception in a callback).

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward one accepted connection to a new one to the upstream server."""
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections_accepted += 1
        link: _Link | None = None
        try:
            if self._connect_delay > 0:
                await asyncio.sleep(self._connect_delay)
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    self.upstream_host, self.upstream_port
                )
            except OSError:
                _set_linger_zero(writer)
                writer.transport.abort()
                return
            link = _Link(writer, up_writer)
            self._links.add(link)
            async with asyncio.TaskGroup() as group:
                group.create_task(self._requests(reader, up_writer, link))
                group.create_task(self._replies(up_reader, writer, link))
        except* (OSError, EOFError):
            pass  # a side went away: the link is closed below
        finally:
            if link is not None:
                self._links.discard(link)
                link.close()
                await link.wait_closed()
            else:
                writer.transport.abort()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            self._handlers.discard(task)

    async def _forward(self, data: bytes, dst: asyncio.StreamWriter, link: _Link) -> None:
        if link.silent:
            return
        if not self._flowing.is_set():
            if self._discard:
                return
            await self._flowing.wait()
        if dst.transport.is_closing():
            return  # its end went away meanwhile (uvloop raises on a write to it; asyncio drops it)
        dst.write(data)
        await dst.drain()

    async def _requests(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, link: _Link
    ) -> None:
        loop = asyncio.get_running_loop()
        while data := await src.read(_CHUNK):
            self.arrivals.append((loop.time(), data))
            if b"$9\r\nSUBSCRIBE\r\n" in data.upper():  # the command, not a script's text
                link.subscribed = True
            for index, (pattern, reset) in enumerate(self._lose_reply_to):
                if pattern in data:
                    del self._lose_reply_to[index]
                    link.lose_next_reply = True
                    link.reset_on_reply = reset
                    break
            for index, (pattern, done) in enumerate(self._silences):
                if pattern in data:
                    del self._silences[index]
                    link.silent = True
                    self.silenced += 1
                    done.set()
                    break
            for pattern, held in self._holds:
                if pattern in data:
                    held.set()
                    await self._holds_lifted.wait()
                    break
            await self._forward(data, dst, link)
        raise EOFError

    async def _replies(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, link: _Link
    ) -> None:
        """Read replies as they come, deliver each `delay` seconds after it arrived, in order."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._forward(data, dst, link)

        async with asyncio.TaskGroup() as group:
            group.create_task(deliver())
            while data := await src.read(_CHUNK):
                if link.lose_next_reply:
                    link.lose_next_reply = False
                    if link.reset_on_reply:
                        link.reset()
                        raise EOFError
                    continue
                queue.put_nowait((loop.time() + self._delay, data))
            raise EOFError

    # ----------------------------------------------------------------- teardown
    async def aclose(self) -> None:
        """Close the listener and every connection, and end every task of the proxy."""
        self._closed = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for link in list(self._links):
            link.close()
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        if handlers:
            await asyncio.gather(*handlers, return_exceptions=True)
        if server is not None:
            await server.wait_closed()


class ThreadedProxy:
    """A `FaultProxy` run by an event loop of its own, in a thread of its own: it goes on
    forwarding (and delaying) while the test's event loop is blocked, as a network does.

    ```python
    proxy = await ThreadedProxy(server.port).start()
    try:
        await proxy.do(lambda p: p.delay_replies(0.1))
    finally:
        await proxy.aclose()
    ```
    """

    def __init__(self, upstream_port: int) -> None:
        self._upstream_port = upstream_port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="threaded-fault-proxy", daemon=True
        )
        self._proxy: FaultProxy | None = None

    @property
    def url(self) -> str:
        assert self._proxy is not None
        return self._proxy.url

    async def start(self) -> Self:
        async def start() -> FaultProxy:
            return await FaultProxy(self._upstream_port).start()

        self._thread.start()
        self._proxy = await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(start(), self._loop)
        )
        return self

    async def do(self, change: Callable[[FaultProxy], object]) -> None:
        """Apply `change` to the proxy in its own event loop, and wait until it is done."""
        proxy = self._proxy
        assert proxy is not None

        async def apply() -> None:
            result = change(proxy)
            if asyncio.iscoroutine(result):
                await result

        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(apply(), self._loop))

    async def aclose(self) -> None:
        """Close the proxy, stop its event loop and thread."""
        if self._proxy is not None:
            await self.do(lambda proxy: proxy.aclose())
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join, 10)
        if not self._thread.is_alive():
            self._loop.close()
