"""One pub/sub session per node of a quorum, seen by the notifier as one session.

A `Redlock`'s release is announced by every node it is released on, each message tagged
with its node's index (`"node"`): each waiting process counts the nodes it heard, and the
announcement that makes a majority heard wakes its waiter (`WaitQueue.announced`). `QuorumPubSub` keeps a session of its own on each node, in a task per node:
it subscribes to the channels wanted, hands the node's messages to the notifier (an
`Inbox`: dispatched in the node's task, or read as from a redis-py `PubSub`), pings the
node when it has been silent for the health interval and opens a new session when the ping
goes unanswered as long (a dead socket is not always reset), and reconnects a node that
failed, with a backoff. A frozen or dead minority of nodes costs nothing: the others are heard.

A channel counts as subscribed once a majority of nodes confirmed it: a release frees a
majority of nodes, of which the waiter then hears at least one. That confirmation is the
one handed on; a later node's first is not (a wake-up for it would be a try that changes
nothing), and a node's second is (its session was made again: a release may have come
while it was unheard, and the notifier has its waiters check).

The notifier's own health check (a PING when nothing was heard, an answer expected) sees
the whole: it is answered while any node answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from .._aio.backoff import Backoff
from .pubsub import Inbox, PubSubSession

if TYPE_CHECKING:
    from redis.asyncio.client import PubSub

    from .backend import Backend

__all__ = ("QuorumPubSub",)

logger = logging.getLogger("aiolock")

CONNECT_TIMEOUT: Final = 2.0
"""Longest a node's session may take to connect and subscribe before it is tried again."""
SEND_TIMEOUT: Final = 1.0
"""Longest a subscription change or a PING may take to be written to a node's session."""
FORWARDED: Final = frozenset({"message", "pong"})
"""The kinds of messages the notifier reads (and "subscribe", as the module says)."""


class _Node:
    """The session on one node, run by a task of its own."""

    __slots__ = (
        "backend",
        "every",
        "heard",
        "index",
        "pinged",
        "pubsub",
        "subscribed",
        "task",
        "up",
    )

    def __init__(self, index: int, backend: Backend, every: float) -> None:
        self.index = index  # its place among the quorum's nodes
        self.backend = backend
        self.every = every
        self.heard = 0.0  # when its connection last said anything (loop time)
        self.pinged: float | None = None  # when a PING unanswered yet was sent
        self.pubsub: PubSub | None = None
        self.subscribed: set[str] = set()
        self.up = False  # connected, and subscribed to what was wanted when it connected
        self.task: asyncio.Task[None] | None = None

    async def send(self, *command: Any) -> None:
        """Write a subscription change or a PING on the session, if it is up; a failure is
        the reader's to find."""
        pubsub = self.pubsub
        if not self.up or pubsub is None:
            return
        verb, *channels = command
        with contextlib.suppress(Exception):
            async with asyncio.timeout(SEND_TIMEOUT):
                if verb == "subscribe":
                    self.subscribed.update(channels)
                    await pubsub.subscribe(*channels)
                elif verb == "unsubscribe":
                    self.subscribed.difference_update(channels)
                    await pubsub.unsubscribe(*channels)
                else:
                    await pubsub.ping()


class QuorumPubSub:
    """The sessions of a quorum's nodes, read as one `PubSub` by the notifier."""

    def __init__(
        self, backends: Sequence[Backend], every: float, rng: random.Random, *, quorum: int
    ) -> None:
        self._nodes = [_Node(index, backend, every) for index, backend in enumerate(backends)]
        self._quorum = quorum
        self._channels: set[str] = set()
        # The nodes that confirmed each channel (as the server names it) and have not
        # confirmed its unsubscription since.
        self._confirmed: dict[object, set[int]] = {}
        self.inbox = Inbox()  # what the sessions read, for the notifier
        self._wanted = asyncio.Event()
        self._rng = rng
        self.connection: object | None = None  # not None once subscribed (see the notifier)

    async def subscribe(self, *channels: str) -> None:
        self._channels.update(channels)
        self.connection = self
        if self._channels:
            self._wanted.set()
        for node in self._nodes:
            if node.task is None:
                node.task = asyncio.get_running_loop().create_task(
                    self._run(node), name="aiolock-quorum-pubsub"
                )
        await asyncio.gather(*(node.send("subscribe", *channels) for node in self._nodes))

    async def unsubscribe(self, *channels: str) -> None:
        self._channels.difference_update(channels)
        await asyncio.gather(*(node.send("unsubscribe", *channels) for node in self._nodes))

    async def ping(self) -> None:
        await asyncio.gather(*(node.send("ping") for node in self._nodes))

    async def get_message(self, *, timeout: float) -> dict[str, Any] | None:
        """The next item of the nodes not handed to the inbox's `deliver`, or None if none
        came within `timeout`."""
        return await self.inbox.get(timeout)

    async def aclose(self) -> None:
        self.inbox.closed = True
        tasks = [node.task for node in self._nodes if node.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ----------------------------------------------------------------- one node's session
    async def _run(self, node: _Node) -> None:
        backoff = Backoff(base=0.05, cap=2.0, rng=self._rng)
        while True:
            await self._wanted.wait()
            try:
                await self._session(node, backoff)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: a new session, later
                logger.debug("aiolock: pub/sub session to a quorum's node failed: %r", exc)
            await asyncio.sleep(backoff.next())

    def _forwarded(self, node: _Node, message: dict[str, Any]) -> bool:
        """Whether `message`, read from `node`, goes to the notifier (see the module)."""
        kind = message.get("type")
        if kind in FORWARDED:
            return True
        if kind == "unsubscribe":
            self._confirmed.get(message.get("channel"), set()).discard(node.index)
        elif kind == "subscribe":
            nodes = self._confirmed.setdefault(message.get("channel"), set())
            if node.index in nodes:
                return True
            nodes.add(node.index)
            return len(nodes) == self._quorum
        return False

    def _delivered(self, node: _Node, message: dict[str, Any]) -> None:
        """A message of `node`'s connection, handed over as it arrived (in the event loop's
        callback that received it): heard, and forwarded with the node's index."""
        node.heard, node.pinged = asyncio.get_running_loop().time(), None
        self._forward(node, message)

    def _forward(self, node: _Node, message: dict[str, Any]) -> None:
        message["node"] = node.index  # each node announces a release
        self.inbox.put(message)

    async def _session(self, node: _Node, backoff: Backoff) -> None:
        """Connect, subscribe, and read the node's messages until its session fails."""
        loop = asyncio.get_running_loop()
        pubsub = node.pubsub = node.backend.new_pubsub()
        if isinstance(pubsub, PubSubSession):  # (its messages handed over as they arrive)
            pubsub.deliver = functools.partial(self._delivered, node)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                wanted = set(self._channels)
                await pubsub.subscribe(*wanted)
            node.subscribed, node.up = wanted, True
            backoff.reset()
            node.heard, node.pinged = loop.time(), None
            while True:
                missing = self._channels - node.subscribed
                if missing:  # wanted while this session was connecting
                    await node.send("subscribe", *missing)
                now = loop.time()
                if node.pinged is not None and now - node.pinged >= node.every:
                    raise TimeoutError(f"no answer to a PING within {node.every:g}s")
                if node.pinged is None and now - node.heard >= node.every:
                    node.pinged = now
                    await node.send("ping")
                message = await pubsub.get_message(timeout=node.every / 2)
                if message is not None:
                    node.heard, node.pinged = loop.time(), None
                    if self._forwarded(node, message):
                        self._forward(node, message)
        finally:
            node.up, node.pubsub = False, None
            with contextlib.suppress(Exception):
                await asyncio.shield(pubsub.aclose())
