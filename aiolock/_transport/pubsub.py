"""The pub/sub session aiolock's notifier reads: redis-py's `PubSub`, with the messages of
a plain subscription (or a shard channel's, on a cluster node) read straight from the
connection.

Every release that someone waits for is a message to every process subscribed to the
name, so each waiting process reads one per release. redis-py reads each through its retry
layer (which reconnects and subscribes again without saying so), its observability hooks
and its handler dispatch; here a message is read from the connection and returned as the
same dict, and anything else (subscription answers, PONGs, a handler's channel, a
connection with redis-py's own health check) takes redis-py's path. A read that fails
raises at once: the notifier replaces the session and tells its waiters that a release may
have been missed, which is what a silent reconnection would have hidden.

A pub/sub made of a session per node (a cluster's, a quorum's: `_transport.cluster_pubsub`,
`_transport.quorum_pubsub`) reads each node in a task of its own and hands what it reads to the
notifier through an `Inbox`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from redis.asyncio.client import PubSub

__all__ = ("Inbox", "PubSubSession")

_KINDS = {
    b"message": "message",
    "message": "message",
    b"smessage": "smessage",
    "smessage": "smessage",
}
"""The kind of a plain or shard channel's message, by its first element as bytes or decoded
(`decode_responses=True`)."""

_NONE: Final[Mapping[Any, Any]] = MappingProxyType({})


class PubSubSession(PubSub):
    """redis-py's `PubSub`, reading a plain subscription's messages itself (see above)."""

    async def get_message(
        self, ignore_subscribe_messages: bool = False, timeout: float | None = 0.0
    ) -> dict[str, Any] | None:
        """The next message, or None if none came within `timeout` seconds.

        Cancellation:
            A read cancelled midway closes the connection (nothing half-read is left on
            it); a read that timed out leaves it as it was.
        """
        connection: Any = self.connection  # (None until the first subscription)
        if (
            timeout is None
            or connection is None
            or not connection.is_connected
            or connection.health_check_interval
        ):
            message: dict[str, Any] | None = await super().get_message(
                ignore_subscribe_messages=ignore_subscribe_messages, timeout=timeout
            )
            return message
        response: Any = await connection.read_response(
            timeout=timeout, disconnect_on_error=True, push_request=True
        )
        if response is None:
            return None
        kind = (
            _KINDS.get(response[0])
            if isinstance(response, list)
            and len(response) == 3
            and isinstance(response[0], str | bytes)
            else None
        )
        if kind is not None:
            # (a channel subscribed with a handler of redis-py's: its dispatch calls it)
            handlers = (
                self.channels if kind == "message" else getattr(self, "shard_channels", _NONE)
            )  # (redis-py 5.0's asyncio PubSub keeps no shard channels)
            if handlers.get(response[1]) is None:
                return {"type": kind, "pattern": None, "channel": response[1], "data": response[2]}
        handled: dict[str, Any] | None = await self.handle_message(  # type: ignore[no-untyped-call]
            response, ignore_subscribe_messages
        )
        return handled


class Inbox:
    """What the node sessions of a pub/sub made of several read, for the notifier.

    Messages, subscription confirmations and lost channels go at once to `deliver` (set by
    the notifier), in the session task that read them: each session's items keep their
    order, and a release's message wakes its waiter without a hop through the notifier's
    task (a queue, a timer and a task switch per message). The rest (a PING's answer, a
    refusal to raise) and everything while `deliver` is None is read with `get`. Once
    `closed` (the pub/sub is being closed, or replaced), nothing more is handed over: a
    session still ending must not confirm a subscription to the notifier's new pub/sub.
    """

    __slots__ = ("_queue", "closed", "deliver")

    def __init__(self) -> None:
        self._queue: asyncio.Queue[dict[str, Any] | Exception] = asyncio.Queue()
        self.deliver: Callable[[dict[str, Any]], None] | None = None
        self.closed = False

    def put(self, item: dict[str, Any] | Exception) -> None:
        """Hand `item` over (see above)."""
        if self.closed:
            return
        deliver = self.deliver
        if deliver is not None and isinstance(item, dict) and item["type"] != "pong":
            deliver(item)
        else:
            self._queue.put_nowait(item)

    async def get(self, timeout: float) -> dict[str, Any] | None:
        """The next item not delivered, or None if none came within `timeout` seconds; a
        refusal is raised.

        Cancellation:
            Nothing is taken from the inbox by a cancelled wait.
        """
        queue = self._queue
        if not queue.empty():  # (no timer for an item already there)
            item = queue.get_nowait()
        else:
            try:
                async with asyncio.timeout(timeout):
                    item = await queue.get()
            except TimeoutError:
                return None
        if isinstance(item, Exception):
            raise item
        return item
