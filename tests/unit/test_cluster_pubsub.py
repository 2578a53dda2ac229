"""`ShardedPubSub` on fake sessions: where each channel is subscribed, and how it moves.

The real clusters are in `tests/faults/test_cluster_pubsub.py`; here, the decisions alone:
a channel on the session of its slot's owner, a MOVED answer followed, a node without
sharded pub/sub sending its channels to the classic session, and nothing started once
the pub/sub is closed.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
import redis.exceptions
from redis.crc import key_slot

from aiolock._transport import cluster_pubsub as _cluster_pubsub
from aiolock._transport.cluster_pubsub import CLASSIC, Placement, ShardedPubSub

from ..support.waits import eventually


class FakeSession:
    """A node's pub/sub session: records what is written, answers as a node would."""

    def __init__(self, address: str | None, owners: dict[str, str], sharded: bool) -> None:
        self.address = address
        self.owners = owners  # channel -> the address that serves it
        self.sharded = sharded
        self.written: list[tuple[str, ...]] = []
        self.replies: asyncio.Queue[Any] = asyncio.Queue()
        self.closed = False

    async def execute_command(self, *command: str) -> None:
        self.written.append(command)
        verb, *channels = command
        if verb == "PING":
            self.replies.put_nowait({"type": "pong", "channel": None, "data": b""})
        elif verb == "SSUBSCRIBE" and not self.sharded:
            self.replies.put_nowait(redis.exceptions.ResponseError("unknown command `SSUBSCRIBE`"))
        elif verb == "SSUBSCRIBE" and self.owners[channels[0]] != self.address:
            error = redis.exceptions.MovedError(f"1 {self.owners[channels[0]]}")
            error.slot_id = _slot(channels[0])
            self.replies.put_nowait(error)
        elif verb in ("SSUBSCRIBE", "SUBSCRIBE"):
            for channel in channels:
                kind = verb.lower()
                self.replies.put_nowait({"type": kind, "channel": channel.encode(), "data": 1})

    async def get_message(self, *, timeout: float) -> Any:
        try:
            async with asyncio.timeout(timeout):
                reply = await self.replies.get()
        except TimeoutError:
            return None
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def aclose(self) -> None:
        self.closed = True


def _slot(channel: str) -> int:
    return int(key_slot(channel.encode()))


class Fakes:
    def __init__(self, owners: dict[str, str], *, sharded: bool = True) -> None:
        self.owners = owners
        self.believed = dict(owners)  # what the cluster client's map says
        self.sharded = sharded
        self.sessions: list[FakeSession] = []
        self.asked = asyncio.Event()
        self.hold_owner = False

    def open(self, address: str | None) -> Any:
        session = FakeSession(address, self.owners, self.sharded)
        self.sessions.append(session)
        return session

    async def owner(self, channel: str) -> str:
        self.asked.set()
        while self.hold_owner:
            await asyncio.sleep(0.01)
        return self.believed[channel]

    async def refresh(self) -> None:
        self.believed = dict(self.owners)

    def pubsub(self, placement: Placement | None = None) -> ShardedPubSub:
        return ShardedPubSub(
            open_session=self.open,
            owner=self.owner,
            refresh=self.refresh,
            placement=placement or Placement(),
            every=2.0,
            rng=random.Random(1),
        )


async def messages(pubsub: ShardedPubSub, count: int) -> list[dict[str, Any]]:
    """The next `count` messages but "lost" (told of a channel sent, then refused)."""
    got: list[dict[str, Any]] = []
    while len(got) < count:
        message = await pubsub.get_message(timeout=2.0)
        assert message is not None, f"only {got}"
        if message["type"] != "lost":
            got.append(message)
    return got


async def test_each_channel_is_subscribed_on_its_owner_with_ssubscribe() -> None:
    fakes = Fakes({"a:{x}:released": "n1:1", "a:{y}:released": "n2:2"})
    pubsub = fakes.pubsub()
    try:
        await pubsub.subscribe("a:{x}:released", "a:{y}:released")
        got = await messages(pubsub, 2)
        assert {(m["type"], m["channel"]) for m in got} == {
            ("subscribe", "a:{x}:released"),
            ("subscribe", "a:{y}:released"),
        }
        assert {(s.address, s.written[0]) for s in fakes.sessions} == {
            ("n1:1", ("SSUBSCRIBE", "a:{x}:released")),
            ("n2:2", ("SSUBSCRIBE", "a:{y}:released")),
        }
    finally:
        await pubsub.aclose()
    assert all(s.closed for s in fakes.sessions)


async def test_a_moved_answer_takes_the_channel_to_the_new_owner() -> None:
    fakes = Fakes({"a:{x}:released": "n2:2"})
    fakes.believed["a:{x}:released"] = "n1:1"  # the client's map is stale
    placement = Placement()
    pubsub = fakes.pubsub(placement)
    try:
        await pubsub.subscribe("a:{x}:released")
        (got,) = await messages(pubsub, 1)
        assert (got["type"], got["channel"]) == ("subscribe", "a:{x}:released")
        assert [s.address for s in fakes.sessions] == ["n1:1", "n2:2"]
        assert placement.moved == {_slot("a:{x}:released"): "n2:2"} and placement.moves == 1
    finally:
        await pubsub.aclose()


async def test_a_node_without_sharded_pub_sub_sends_its_channels_to_the_classic_session() -> None:
    fakes = Fakes({"a:{x}:released": "n1:1"}, sharded=False)
    placement = Placement()
    pubsub = fakes.pubsub(placement)
    try:
        await pubsub.subscribe("a:{x}:released")
        (got,) = await messages(pubsub, 1)
        assert (got["type"], got["channel"]) == ("subscribe", "a:{x}:released")
        assert set(placement.classic) == {"n1:1"}
        classic = fakes.sessions[-1]
        assert classic.address is None and classic.written == [("SUBSCRIBE", "a:{x}:released")]
        await eventually(lambda: set(pubsub._sessions) == {CLASSIC}, what="the classic alone")
    finally:
        await pubsub.aclose()


async def test_nothing_is_started_once_closed() -> None:
    """A subscription that was looking up its owner when the pub/sub was closed (the
    notifier replaced it) starts no session: no task, no connection left behind."""
    fakes = Fakes({"a:{x}:released": "n1:1"})
    fakes.hold_owner = True
    pubsub = fakes.pubsub()
    subscribing = asyncio.ensure_future(pubsub.subscribe("a:{x}:released"))
    await fakes.asked.wait()
    await pubsub.aclose()
    fakes.hold_owner = False
    await subscribing
    assert not pubsub._sessions and not fakes.sessions


async def test_a_node_taken_for_classic_is_asked_again_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node that refused SSUBSCRIBE may be upgraded meanwhile (and then SPUBLISH): once
    CLASSIC_FOR has passed, a channel placed on it tries SSUBSCRIBE again."""
    fakes = Fakes({"a:{x}:released": "n1:1", "a:{y}:released": "n1:1"}, sharded=False)
    placement = Placement()
    pubsub = fakes.pubsub(placement)
    try:
        await pubsub.subscribe("a:{x}:released")
        await messages(pubsub, 1)
        assert set(placement.classic) == {"n1:1"}
        fakes.sharded = True  # upgraded
        for session in fakes.sessions:
            session.sharded = True
        monkeypatch.setattr(_cluster_pubsub, "CLASSIC_FOR", 0.0)
        await pubsub.subscribe("a:{y}:released")
        (got,) = await messages(pubsub, 1)
        assert (got["type"], got["channel"]) == ("subscribe", "a:{y}:released")
        assert pubsub._where["a:{y}:released"].address == "n1:1" and not placement.classic
    finally:
        await pubsub.aclose()
