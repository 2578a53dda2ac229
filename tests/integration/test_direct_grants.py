"""Grants told to their process alone: a release that grants the lock to a waiting process
of this version tells it on that process's own channel of the name, and on the name's
channel (to every waiting process) at most every TOLD_EVERY_MS; every other waiting
process still checks by the time such a grant to a crashed process lapses.

The releases are run as raw scripts, two in one MULTI where the second must come within
TOLD_EVERY_MS of the first: Redis runs them back to back, so the test does not depend on
how fast this machine is.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio

from aiolock import Lock
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import GRANT_MS, RESERVATION_MS, TOLD_EVERY_MS, LockKeys
from aiolock._lua.lease import RENEW
from aiolock._lua.lock import ACQUIRE, RELEASE, acquire_args, release_args

from ..support.waits import eventually, within

pytestmark = pytest.mark.real_only

TTL_MS = 30_000


class Raw:
    """A lock's scripts run by hand on one client, and fake processes' queue entries."""

    def __init__(self, client: redis.asyncio.Redis, name: str) -> None:
        self.client = client
        self.keys = LockKeys.build("aiolock", name)

    async def hold(self) -> str:
        token = secrets.token_hex(16)
        reply = await self.client.evalsha(
            ACQUIRE.sha, 1, self.keys.lock, *acquire_args(token, TTL_MS, "h 1 t")
        )
        assert isinstance(reply, int), reply
        return token

    async def queue(self, wid: str, *, grant_ms: int = GRANT_MS) -> str:
        """An entry of a process that is not there (so never renews a grant): its grant
        token."""
        token = secrets.token_hex(16)
        seconds, _ = await self.client.time()
        await self.client.zadd(self.keys.queue, {wid: await self.client.zcard(self.keys.queue)})
        entry = f"{int(seconds) * 1000 + 60_000} 1 gone 1 1 {grant_ms} {TTL_MS} {token} t"
        await self.client.hset(self.keys.waiters, wid, entry)
        await self.client.hset(self.keys.lock, "q", 1)
        return token

    def release(self, pipe: Any, token: str) -> None:
        pipe.evalsha(RELEASE.sha, 4, *self.keys.scripts, *release_args(token=token, held_ms=1))

    def renew(self, pipe: Any, token: str) -> None:
        pipe.evalsha(RENEW.sha, 1, self.keys.lock, token, TTL_MS, "")

    def attempt(self, pipe: Any, wid: str) -> None:
        token = secrets.token_hex(16)
        entry = f"h 1 1 {GRANT_MS} {TTL_MS} {token} t"
        args = acquire_args(token, TTL_MS, "h 1 t", queue=(wid, 0, entry))
        pipe.evalsha(ACQUIRE.sha, 3, *self.keys.scripts[:3], *args)


class Heard:
    """What a pub/sub session subscribed to the name's channel and to every process's
    channel of it hears."""

    def __init__(self, client: redis.asyncio.Redis, keys: LockKeys) -> None:
        self.pubsub = client.pubsub()
        self.keys = keys
        self.messages: list[tuple[str, str]] = []  # (channel, data)

    async def start(self) -> None:
        await self.pubsub.subscribe(self.keys.channel)
        literal = "".join(f"\\{c}" if c in "[]*?\\" else c for c in self.keys.channel)
        await self.pubsub.psubscribe(literal + ":p*")

    async def read(self, count: int) -> list[tuple[str, str]]:
        """Wait until `count` messages were heard (bounded), and a little longer for more."""
        async with asyncio.timeout(10):
            while len(self.messages) < count:
                await self._one(1.0)
        while await self._one(0.2):
            pass
        return self.messages

    async def _one(self, timeout: float) -> bool:
        message = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout)
        if message is None:
            return False
        self.messages.append((message["channel"].decode(), message["data"].decode()))
        return True

    async def aclose(self) -> None:
        await self.pubsub.aclose()


@pytest.fixture
async def scripts(client: redis.asyncio.Redis) -> redis.asyncio.Redis:
    for script in (ACQUIRE, RELEASE, RENEW):
        await client.script_load(script.source)
    return client


@pytest.fixture
async def heard(client: redis.asyncio.Redis, name: str) -> AsyncIterator[Heard]:
    heard = Heard(client, LockKeys.build("aiolock", name))
    await heard.start()
    try:
        yield heard
    finally:
        await heard.aclose()


def process_channel(keys: LockKeys, wid: str) -> str:
    return f"{keys.channel}:{wid[:9]}"


async def test_a_grant_soon_after_one_told_to_all_is_told_to_its_process_alone(
    scripts: redis.asyncio.Redis, name: str, heard: Heard
) -> None:
    raw = Raw(scripts, name)
    holder = await raw.hold()
    first, second = "p1111aaaa0000aaaa", "p2222bbbb0000bbbb"
    first_token = await raw.queue(first)
    await raw.queue(second)
    async with scripts.pipeline(transaction=True) as pipe:
        raw.release(pipe, holder)  # grants to `first`: nothing told to all yet
        raw.release(pipe, first_token)  # grants to `second` at once
        replies = await pipe.execute()
    assert [reply[1] for reply in replies] == [first.encode(), second.encode()]
    messages = await heard.read(2)
    assert [channel for channel, _ in messages] == [
        raw.keys.channel,
        process_channel(raw.keys, second),
    ], messages
    # Both held for at most GRANT_MS unless renewed (a crashed grantee lapses in time).
    assert [int(reply[4]) for reply in replies] == [GRANT_MS, GRANT_MS]
    assert 0 < await scripts.pttl(raw.keys.lock) <= GRANT_MS


async def test_a_queue_of_the_version_before_is_always_told_on_the_names_channel(
    scripts: redis.asyncio.Redis, name: str, heard: Heard
) -> None:
    """A queue id without the "p" (16 hex digits) is a process that listens on the name's
    channel alone: told there, its grant held for up to RESERVATION_MS as before."""
    raw = Raw(scripts, name)
    holder = await raw.hold()
    new, old = "p3333cccc0000cccc", "0123456789abcdef"
    new_token = await raw.queue(new)
    await raw.queue(old, grant_ms=RESERVATION_MS)
    async with scripts.pipeline(transaction=True) as pipe:
        raw.release(pipe, holder)
        raw.release(pipe, new_token)
        replies = await pipe.execute()
    assert int(replies[1][4]) == RESERVATION_MS
    messages = await heard.read(2)
    assert [channel for channel, _ in messages] == [raw.keys.channel] * 2, messages
    assert messages[1][1].split()[1] == old


async def test_a_waiter_that_attempts_meanwhile_is_told_to_check_once_such_grants_lapsed(
    scripts: redis.asyncio.Redis, name: str
) -> None:
    """An acquire refused while grants go to their processes alone says when to check
    again (the last grant told to all, plus RESERVATION_MS), though the holder's key lives
    longer; once TOLD_EVERY_MS passed, it says nothing of the kind."""
    raw = Raw(scripts, name)
    holder = await raw.hold()
    grantee = "p4444dddd0000dddd"
    granted = await raw.queue(grantee)
    async with scripts.pipeline(transaction=True) as pipe:
        raw.release(pipe, holder)  # told to all
        raw.renew(pipe, granted)  # the grantee renews to the full ttl
        raw.attempt(pipe, "p5555eeee0000eeee")
        *_, busy = await pipe.execute()
    assert busy[0] == 0 and busy[1] > GRANT_MS, busy
    assert TOLD_EVERY_MS <= int(busy[7]) <= RESERVATION_MS, busy

    async def window_closed() -> bool:
        async with scripts.pipeline(transaction=True) as pipe:
            raw.attempt(pipe, "p5555eeee0000eeee")
            (reply,) = await pipe.execute()
        return bool(reply[0] == 0 and reply[7] == b"")

    await eventually(window_closed, what="no check once TOLD_EVERY_MS passed", timeout=10)


async def test_a_grant_to_a_crashed_process_told_to_it_alone_delays_the_others_once(
    scripts: redis.asyncio.Redis, clients: list[redis.asyncio.Redis], name: str, heard: Heard
) -> None:
    """A waiter of another process sleeps on a holder's long ttl; the holder's release is
    told to all (a grant to a live process), and that process's release at once grants to
    a crashed one, told to it alone. The waiter does not hear of it, yet takes the lock
    once that grant lapsed, as it would have had it heard (not after the holder's 30 s)."""
    raw = Raw(scripts, name)
    holder = await raw.hold()
    relay, crashed = "p6666ffff0000ffff", "p7777aaaa0000aaaa"
    relay_token = await raw.queue(relay)
    await raw.queue(crashed)
    waiter = clients[1]
    waiting = asyncio.create_task(Lock(waiter, name, ttl=10).acquire(timeout=20))
    try:

        async def queued() -> bool:
            return await scripts.zcard(raw.keys.queue) == 3

        await eventually(queued, what="the live waiter queued behind both", timeout=10)
        loop = asyncio.get_running_loop()
        heard_before = runtime_for(waiter).notifier.messages_received
        released_at = loop.time()
        async with scripts.pipeline(transaction=True) as pipe:
            raw.release(pipe, holder)
            raw.release(pipe, relay_token)
            await pipe.execute()
        lease = await within(waiting, what="the waiter to take the lock", timeout=10)
        waited = loop.time() - released_at
        messages = await heard.read(2)
        assert [channel for channel, _ in messages] == [
            raw.keys.channel,
            process_channel(raw.keys, crashed),
        ], messages
        assert runtime_for(waiter).notifier.messages_received - heard_before == 1
        assert waited < RESERVATION_MS / 1000 + 1.0, "one lapsed grant, then the live waiter"
        await lease.release()
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


async def test_processes_hear_grants_to_others_only_now_and_then(
    clients: list[redis.asyncio.Redis], name: str, heard: Heard
) -> None:
    """Three processes hand one lock round as fast as they can: each grant reaches its
    grantee (every section runs), each is told once, and a process hears fewer grants to
    others than were made (each told on the name's channel at most every TOLD_EVERY_MS)."""
    rounds = 30
    done = 0

    async def worker(client: redis.asyncio.Redis) -> None:
        nonlocal done
        lock = Lock(client, name, ttl=10)
        for _ in range(rounds):
            async with lock:
                done += 1

    notifiers = [runtime_for(client).notifier for client in clients[:3]]
    before = [notifier.messages_received for notifier in notifiers]
    async with asyncio.timeout(60):
        await asyncio.gather(*(worker(client) for client in clients[:3]))
    assert done == 3 * rounds
    await heard.read(1)
    told = heard.messages
    to_all = [data for channel, data in told if channel == heard.keys.channel]
    to_one = [data for channel, data in told if channel != heard.keys.channel]
    assert len({data.split()[2] for _, data in told}) == len(told), "each grant told once"
    assert to_one, "some grants came within TOLD_EVERY_MS of one told to all"
    for notifier, count in zip(notifiers, before, strict=True):
        own = [data for channel, data in told if channel.endswith(notifier._direct_id)]
        # What it heard: the grants told to all (those after its last section, maybe not),
        # and its own.
        assert notifier.messages_received - count <= len(to_all) + len(own) < len(told)
