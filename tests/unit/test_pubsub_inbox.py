"""The inbox through which a pub/sub made of node sessions (a cluster's, a quorum's) hands
what it reads to the notifier."""

from __future__ import annotations

from typing import Any

import pytest

from aiolock._transport.pubsub import Inbox


def message(kind: str, channel: str = "c") -> dict[str, Any]:
    return {"type": kind, "pattern": None, "channel": channel, "data": b"1"}


async def test_items_are_delivered_at_once_in_order_and_the_rest_is_read() -> None:
    inbox = Inbox()
    delivered: list[dict[str, Any]] = []
    inbox.deliver = delivered.append
    for each in (message("subscribe"), message("message"), message("lost")):
        inbox.put(each)
    inbox.put(message("pong"))  # an answer to the notifier's PING: its listener reads it
    assert [m["type"] for m in delivered] == ["subscribe", "message", "lost"]
    assert await inbox.get(0.01) == message("pong")
    assert await inbox.get(0.01) is None


async def test_without_deliver_everything_is_read_and_a_refusal_raised() -> None:
    inbox = Inbox()
    inbox.put(message("message"))
    inbox.put(RuntimeError("NOPERM"))
    assert await inbox.get(0.01) == message("message")
    with pytest.raises(RuntimeError, match="NOPERM"):
        await inbox.get(0.01)


async def test_a_closed_inbox_hands_nothing_over() -> None:
    """A session still ending after its pub/sub was replaced must not confirm a
    subscription to the notifier, whose new pub/sub has not made it."""
    inbox = Inbox()
    delivered: list[dict[str, Any]] = []
    inbox.deliver = delivered.append
    inbox.closed = True
    inbox.put(message("subscribe"))
    inbox.put(message("pong"))
    assert delivered == []
    assert await inbox.get(0.01) is None
