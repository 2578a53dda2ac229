"""aiolock's pub/sub session (`_transport.pubsub.PubSubSession`) with `deliver` set, as the
notifier sets it: a message goes to `deliver` in the event loop's callback that received
it, with nobody reading; everything else, and a message with something unread before it, is
read by `get_message`, in the order it came. Both protocols, where the connection is read
straight from its hiredis reader (RESP3 only with redis-py 6 and later).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions

from aiolock._transport.pubsub import PubSubSession
from aiolock._transport.replies import direct_reader

from ..conftest import make_client
from ..support.waits import eventually, within

pytestmark = pytest.mark.real_only


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def protocol(request: pytest.FixtureRequest) -> int:
    return int(request.param)


class Delivered:
    """What `deliver` was given, and an event set at each message."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.came = asyncio.Event()

    def __call__(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self.came.set()


@contextlib.asynccontextmanager
async def tapped(
    url: str, protocol: int, channel: str, *, confirmed: bool = True
) -> AsyncIterator[tuple[PubSubSession, Delivered, redis.asyncio.Redis]]:
    """A session subscribed to `channel`, its confirmation read (the tap is on; not if
    `confirmed` is False: nothing read yet), with a `Delivered` as its `deliver`; and a
    client to publish with. Skipped where the connection is not read straight from
    hiredis."""
    client = make_client(url, protocol=protocol)
    publisher = make_client(url)
    session = PubSubSession(connection_pool=client.connection_pool)
    delivered = Delivered()
    session.deliver = delivered
    try:
        await session.subscribe(channel)
        if direct_reader(session.connection) is None:
            pytest.skip("this redis-py reads this protocol its own way")
        if confirmed:
            answer = await within(session.get_message(timeout=5), what="the confirmation")
            assert answer is not None and answer["type"] == "subscribe"
        yield session, delivered, publisher
    finally:
        await session.aclose()
        await publisher.aclose()
        await client.aclose()


async def test_a_message_goes_to_deliver_with_nobody_reading(
    server_url: str, name: str, protocol: int
) -> None:
    async with tapped(server_url, protocol, name) as (session, delivered, publisher):
        assert await publisher.publish(name, "released") == 1
        await within(delivered.came.wait(), what="the message delivered")
        assert delivered.messages == [
            {"type": "message", "pattern": None, "channel": name.encode(), "data": b"released"}
        ]
        # (delivered once: nothing is left for a read)
        assert await session.get_message(timeout=0.05) is None


async def test_a_message_after_something_unread_is_read_in_its_order(
    server_url: str, name: str, protocol: int
) -> None:
    async with tapped(server_url, protocol, name) as (session, delivered, publisher):
        other = f"{name}:other"
        await session.subscribe(other)
        # Published once the server has the subscription: its confirmation comes first,
        # and both are in before anything is read.
        assert await publisher.publish(other, "after") == 1
        tap: Any = session._tap
        await eventually(lambda: len(tap._frames) == 2, what="both in, unread")
        first = await within(session.get_message(timeout=5), what="the second confirmation")
        second = await within(session.get_message(timeout=5), what="the message")
        assert first is not None and (first["type"], first["channel"]) == (
            "subscribe",
            other.encode(),
        )
        assert second is not None and (second["type"], second["data"]) == ("message", b"after")
        assert delivered.messages == []
        # Nothing unread before it: the next message goes to deliver again.
        assert await publisher.publish(name, "now") == 1
        await within(delivered.came.wait(), what="the next message delivered")
        assert [message["data"] for message in delivered.messages] == [b"now"]


async def test_what_came_before_the_tap_is_read_first_and_once(
    server_url: str, name: str, protocol: int
) -> None:
    async with tapped(server_url, protocol, name, confirmed=False) as tap:
        session, delivered, publisher = tap
        # The confirmation and a message, both sent before anything was read.
        assert await publisher.publish(name, "early") == 1
        read: list[dict[str, Any]] = []

        async def until_the_message() -> None:
            # (the tap may deliver it as it is put on, with the read under way)
            while not delivered.messages and not any(m["type"] == "message" for m in read):
                message = await session.get_message(timeout=0.05)
                if message is not None:
                    read.append(message)

        await within(until_the_message(), what="the message, read or delivered")
        assert read[0]["type"] == "subscribe"
        messages = [m["data"] for m in read if m["type"] == "message"]
        messages += [m["data"] for m in delivered.messages]
        assert messages == [b"early"]


async def test_an_error_of_deliver_is_raised_by_the_next_read(
    server_url: str, name: str, protocol: int
) -> None:
    async with tapped(server_url, protocol, name) as (session, _, publisher):

        def fails(message: dict[str, Any]) -> None:
            raise RuntimeError("the dispatch failed")

        session.deliver = fails
        connection: Any = session.connection
        assert await publisher.publish(name, "released") == 1
        with pytest.raises(RuntimeError, match="the dispatch failed"):
            await within(session.get_message(timeout=5), what="the error")
        assert not connection.is_connected


async def test_the_connection_closed_by_the_server_is_raised_by_the_next_read(
    server_url: str, name: str, protocol: int
) -> None:
    async with tapped(server_url, protocol, name) as (session, delivered, publisher):
        connection: Any = session.connection
        host, port = connection._writer.get_extra_info("sockname")[:2]
        assert await publisher.client_kill(f"{host}:{port}") is True
        with pytest.raises(redis.exceptions.ConnectionError):
            # (at once: not at the read's own timer)
            await within(session.get_message(timeout=300), what="the end of the connection")
        assert not connection.is_connected
        assert delivered.messages == []


async def test_a_read_that_times_out_leaves_the_tap_as_it_was(
    server_url: str, name: str, protocol: int
) -> None:
    async with tapped(server_url, protocol, name) as (session, delivered, publisher):
        reading = asyncio.create_task(session.get_message(timeout=30))
        await asyncio.sleep(0)
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        assert await session.get_message(timeout=0.01) is None
        assert await publisher.publish(name, "released") == 1
        await within(delivered.came.wait(), what="the message delivered")
        await session.ping()
        pong = await within(session.get_message(timeout=5), what="the PONG")
        assert pong is not None and pong["type"] == "pong"
        await eventually(lambda: len(delivered.messages) == 1, what="one message")
