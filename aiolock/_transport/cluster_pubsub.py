"""Sharded pub/sub on a cluster: a session per node serving the channels' slots, seen by the
notifier as one session.

On Redis 7 and Valkey, a cluster's scripts publish with `SPUBLISH` (`_lua.cluster`): a
message reaches the subscribers of the node serving its channel's slot only, not every node
over the cluster bus. `ShardedPubSub` keeps one pub/sub session per node that serves a
channel wanted, each in a task of its own, each with `SSUBSCRIBE` (one command per channel:
a command's channels must share a slot). Their messages reach the notifier through one
`Inbox` (a shard message as a message, a confirmation as one), dispatched in the session's
task as they are read.

- **A slot that moves.** The node that loses a slot tells its subscribers of the slot's
  channels (an unrequested `sunsubscribe`); the session subscribes the channel again on the
  same node, which answers `MOVED` with the new owner (remembered per slot, in the
  transport's `Placement`), and the channel goes to that node's session. A `MOVED` answer
  to a new subscription is followed the same way. Meanwhile the notifier is told that the
  channel is not heard ("lost"): its waiters try at once, and again once it is subscribed.
- **A silent node.** Each session pings its node after `every` seconds of silence and, if
  nothing has come `every` seconds later, takes the connection for dead (a socket dropped
  by a NAT without a reset), tells the notifier its channels are lost, and opens a new one.
  A session that failed is opened again with backoff, after the cluster's map of slots is
  asked again: the channels of a node that died go to the node now serving their slots. The notifier's own PING goes to every
  session and is answered while any answers, as with one connection.
- **No sharded pub/sub on a node.** A node that refuses `SSUBSCRIBE` as an unknown command
  (Redis 6.2) or for the user's ACL (no `+ssubscribe`) runs its scripts' `PUBLISH` instead
  (see `_lua.cluster`), which reaches every node: its channels are subscribed the classic
  way, on one classic session for all such nodes (to any primary), as before sharded
  pub/sub. On a cluster of Redis 6.2 that is the only session after the first refusals.
  A node is taken for one without sharded pub/sub for CLASSIC_FOR seconds: a channel
  placed later tries `SSUBSCRIBE` on it again (it may have been upgraded, and then
  publishes with `SPUBLISH`). Other refusals of the classic session (an ACL on the
  channels) are the notifier's to report, as on one connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from redis.crc import key_slot

from .._aio.backoff import Backoff
from .clients import Errors
from .pubsub import Inbox, PubSubSession

if TYPE_CHECKING:
    from redis.asyncio.client import PubSub

__all__ = ("HEALTH_INTERVAL", "Placement", "ShardedPubSub")

logger = logging.getLogger("aiolock")

HEALTH_INTERVAL: Final = 2.0
"""Seconds of silence on a session before its node is asked for a PING, and then for its
answer, unless the client sets redis-py's `health_check_interval` (as the notifier's)."""
CONNECT_TIMEOUT: Final = 2.0
"""Longest a session may take to connect and subscribe before it is tried again."""
SEND_TIMEOUT: Final = 1.0
"""Longest a subscription change or a PING may take to be written to a session."""
CLASSIC: Final = ""
"""The address of the classic session (SUBSCRIBE, on any primary)."""
CLASSIC_FOR: Final = 60.0
"""Seconds a node that refused SSUBSCRIBE is taken for one without sharded pub/sub."""


def _slot(channel: str) -> int:
    return int(key_slot(channel.encode("utf-8", "surrogateescape")))


def _text(value: Any) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def _without_sharding(error: BaseException) -> bool:
    """Whether the node refused SSUBSCRIBE for good: unknown (Redis 6.2) or not allowed."""
    text = str(error).lower()
    return "unknown command" in text or text.startswith("noperm") or "permission" in text


class Placement:
    """What the sessions of one client learned of the cluster, kept across sessions: the
    owner of a slot that moved (from MOVED answers, newer than the cluster client's map),
    and the nodes without sharded pub/sub."""

    __slots__ = ("classic", "moved", "moves", "silent")

    def __init__(self) -> None:
        self.moved: dict[int, str] = {}
        self.classic: dict[str, float] = {}  # address -> when it refused SSUBSCRIBE
        self.silent = 0  # sessions replaced for not answering a PING
        self.moves = 0  # channels subscribed again on another node (their slot moved)


class _Session:
    """The session on one node (or the classic one), run by a task of its own."""

    __slots__ = ("address", "heard", "pinged", "pubsub", "sent", "task", "up", "wanted")

    def __init__(self, address: str) -> None:
        self.address = address
        self.pubsub: PubSub | None = None
        self.heard = 0.0  # when its connection last said anything (loop time)
        self.pinged: float | None = None  # when a PING unanswered yet was sent
        self.wanted: set[str] = set()  # the channels this session is to hold
        self.sent: set[str] = set()  # those subscribed on its current connection
        self.up = False
        self.task: asyncio.Task[None] | None = None

    @property
    def classic(self) -> bool:
        return self.address == CLASSIC


class _Retired(Exception):
    """The node has no sharded pub/sub: its channels went to the classic session."""


class ShardedPubSub:
    """The sessions of a cluster's nodes, read as one `PubSub` by the notifier."""

    def __init__(
        self,
        *,
        open_session: Callable[[str | None], PubSub],
        owner: Callable[[str], Awaitable[str]],
        refresh: Callable[[], Awaitable[None]],
        placement: Placement,
        every: float,
        rng: random.Random,
    ) -> None:
        self._open = open_session  # a PubSub to the node "host:port" (None: any primary)
        self._owner = owner  # the address of the node serving a channel's slot
        self._refresh = refresh  # the cluster's map of slots asked again
        self._placement = placement
        self._every = every
        self._rng = rng
        self._channels: set[str] = set()
        self._sessions: dict[str, _Session] = {}
        self._where: dict[str, _Session] = {}
        self.inbox = Inbox()  # what the sessions read, for the notifier
        self.connection: object | None = None  # not None once subscribed (see the notifier)

    # ----------------------------------------------------------------- the notifier's side
    async def subscribe(self, *channels: str) -> None:
        self.connection = self
        for channel in channels:
            self._channels.add(channel)
            address = self._placement.moved.get(_slot(channel))
            if address is None:  # as the cluster client knows it (a MOVED answer corrects it)
                address = await self._owner(channel)
            if self.inbox.closed:  # closed meanwhile: no session is started any more
                return
            if channel not in self._channels:  # unsubscribed meanwhile
                continue
            session = self._place(channel, address)
            await self._send(session, "subscribe", channel)

    async def unsubscribe(self, *channels: str) -> None:
        for channel in channels:
            self._channels.discard(channel)
            session = self._where.pop(channel, None)
            if session is not None:
                session.wanted.discard(channel)
                await self._send(session, "unsubscribe", channel)

    async def ping(self) -> None:
        await asyncio.gather(*(self._send(s, "ping") for s in list(self._sessions.values())))

    async def get_message(self, *, timeout: float) -> dict[str, Any] | None:
        """The next item of the sessions not handed to the inbox's `deliver` (None if none
        came within `timeout`); a refusal of the classic session is raised."""
        return await self.inbox.get(timeout)

    async def aclose(self) -> None:
        self.inbox.closed = True
        tasks = [s.task for s in self._sessions.values() if s.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._sessions.clear()

    # ----------------------------------------------------------------- placing channels
    def _place(self, channel: str, address: str) -> _Session:
        """The session that is to hold `channel` (started if need be)."""
        refused = self._placement.classic.get(address)
        if refused is not None:
            if asyncio.get_running_loop().time() - refused < CLASSIC_FOR:
                address = CLASSIC
            else:
                del self._placement.classic[address]  # asked again: it may have changed
        previous = self._where.get(channel)
        if previous is not None and previous.address != address:
            previous.wanted.discard(channel)
            previous.sent.discard(channel)
        session = self._sessions.get(address)
        if session is None:
            session = self._sessions[address] = _Session(address)
        session.wanted.add(channel)
        self._where[channel] = session
        if session.task is None:
            session.task = asyncio.get_running_loop().create_task(
                self._run(session), name="aiolock-sharded-pubsub"
            )
        return session

    async def _send(self, session: _Session, verb: str, *channels: str) -> None:
        """Write a subscription change or a PING on the session, if it is up; a failure is
        its reader's to find."""
        pubsub = session.pubsub
        if not session.up or pubsub is None:
            return  # subscribed when it connects
        with contextlib.suppress(Exception):
            async with asyncio.timeout(SEND_TIMEOUT):
                if verb == "ping":
                    await pubsub.execute_command("PING")
                    return
                if verb == "subscribe":
                    session.sent.update(channels)
                else:
                    session.sent.difference_update(channels)
                await self._write(session, pubsub, verb, channels)

    @staticmethod
    async def _write(session: _Session, pubsub: PubSub, verb: str, channels: Any) -> None:
        if session.classic:
            command = "SUBSCRIBE" if verb == "subscribe" else "UNSUBSCRIBE"
            await pubsub.execute_command(command, *channels)
            return
        command = "SSUBSCRIBE" if verb == "subscribe" else "SUNSUBSCRIBE"
        for channel in channels:  # the channels of one command must share a slot
            await pubsub.execute_command(command, channel)

    def _lost(self, channels: set[str]) -> None:
        """Tell the notifier that `channels` are not heard until subscribed again."""
        for channel in channels:
            self.inbox.put({"type": "lost", "channel": channel, "data": None})

    # ----------------------------------------------------------------- one node's session
    async def _run(self, session: _Session) -> None:
        backoff = Backoff(base=0.05, cap=2.0, rng=self._rng)
        try:
            while session.wanted:
                try:
                    await self._session(session, backoff)
                except asyncio.CancelledError:
                    raise
                except _Retired:
                    continue  # ends, unless a channel was placed here meanwhile
                except Exception as exc:  # noqa: BLE001 - any failure: a new session, later
                    logger.debug("aiolock: sharded pub/sub session failed: %r", exc)
                    self._lost(set(session.wanted))
                    await asyncio.sleep(backoff.next())
                    await self._find_owners(session)
        finally:
            session.task = None
            if self._sessions.get(session.address) is session and not session.wanted:
                del self._sessions[session.address]

    async def _find_owners(self, session: _Session) -> None:
        """After a failed session, ask again which node serves each of its channels (the
        node may have died and its replica taken its slots): those served elsewhere go to
        that node's session."""
        if session.classic:
            return  # opened again on another primary
        for slot, address in list(self._placement.moved.items()):
            if address == session.address:
                del self._placement.moved[slot]
        with contextlib.suppress(Exception):
            await self._refresh()
        for channel in list(session.wanted):
            with contextlib.suppress(Exception):
                address = await self._owner(channel)
                if address != session.address and channel in session.wanted:
                    await self._send(self._place(channel, address), "subscribe", channel)

    async def _session(self, session: _Session, backoff: Backoff) -> None:
        """Connect, subscribe, and read the node's messages until the session fails or has
        no channel left."""
        loop = asyncio.get_running_loop()
        pubsub = session.pubsub = self._open(None if session.classic else session.address)
        if isinstance(pubsub, PubSubSession):  # (its messages handed over as they arrive)
            pubsub.deliver = functools.partial(self._delivered, session)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                wanted = set(session.wanted)
                if wanted:
                    await self._write(session, pubsub, "subscribe", wanted)
            session.sent, session.up = wanted, True
            backoff.reset()
            session.heard, session.pinged = loop.time(), None
            while session.wanted:
                missing = session.wanted - session.sent
                if missing:  # wanted while this session was connecting
                    await self._send(session, "subscribe", *missing)
                now = loop.time()
                if session.pinged is not None and now - session.pinged >= self._every:
                    self._placement.silent += 1
                    raise TimeoutError(f"no answer to a PING within {self._every:g}s")
                if session.pinged is None and now - session.heard >= self._every:
                    session.pinged = now
                    await self._send(session, "ping")
                try:
                    message = await pubsub.get_message(timeout=self._every / 2)
                except Errors.response as exc:
                    session.heard, session.pinged = loop.time(), None
                    await self._refused(session, exc)
                    continue
                if message is not None:
                    session.heard, session.pinged = loop.time(), None
                    await self._forward(session, message)
        finally:
            session.up, session.pubsub = False, None
            with contextlib.suppress(Exception):
                await asyncio.shield(pubsub.aclose())

    def _delivered(self, session: _Session, message: dict[str, Any]) -> None:
        """A message of `session`'s connection, handed over as it arrived (in the event
        loop's callback that received it): heard, and forwarded as `_forward` would."""
        session.heard, session.pinged = asyncio.get_running_loop().time(), None
        self._forward_message(session, _text(message.get("channel")), message)

    def _forward_message(self, session: _Session, channel: str, message: dict[str, Any]) -> None:
        """A plain or shard channel's message, to the notifier as a plain one, if `session`
        still holds its channel."""
        if channel in session.wanted:  # (else unsubscribed meanwhile, or moved elsewhere)
            self.inbox.put({"type": "message", "channel": channel, "data": message["data"]})

    async def _forward(self, session: _Session, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "pong":
            self.inbox.put(message)
            return
        channel = _text(message.get("channel"))
        if kind in ("smessage", "message"):
            self._forward_message(session, channel, message)
        elif channel not in session.wanted:
            return  # unsubscribed meanwhile, or moved to another session
        elif kind in ("ssubscribe", "subscribe"):
            self.inbox.put({"type": "subscribe", "channel": channel, "data": None})
        elif kind == "sunsubscribe":
            # Not asked for: the channel's slot moved away from this node. Asked again, the
            # node answers MOVED with the new owner (or subscribes, if the slot came back).
            self._lost({channel})
            session.sent.discard(channel)
            await self._send(session, "subscribe", channel)

    async def _refused(self, session: _Session, error: BaseException) -> None:
        """The node refused a subscription: follow a MOVED, go classic without sharded
        pub/sub; the classic session's refusals are the notifier's."""
        if session.classic:
            assert isinstance(error, Exception)
            self.inbox.put(error)
            return
        slot = getattr(error, "slot_id", None)
        host, port = getattr(error, "host", None), getattr(error, "port", None)
        if type(error).__name__ == "MovedError" and slot is not None and host and port:
            address = f"{host}:{port}"
            self._placement.moved[int(slot)] = address
            for channel in [c for c in session.wanted if _slot(c) == int(slot)]:
                self._placement.moves += 1
                await self._send(self._place(channel, address), "subscribe", channel)
            return
        if _without_sharding(error):
            logger.info("aiolock: %s has no sharded pub/sub (%s)", session.address, error)
            self._placement.classic[session.address] = asyncio.get_running_loop().time()
            moving = set(session.wanted)
            self._lost(moving & session.sent)
            for channel in moving:
                await self._send(self._place(channel, CLASSIC), "subscribe", channel)
            raise _Retired(session.address)
        raise error
