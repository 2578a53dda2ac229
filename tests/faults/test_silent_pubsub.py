"""A pub/sub connection that died without a reset (a NAT or load balancer dropped it).

To the client it looks like silence. The listener pings after 2 s of silence and replaces a
connection that does not answer within 2 s more, so a dead subscription is found within
4 s: the waiters of that process get their turn again, and grants to it stop lapsing (which
would cost every other process a second each time).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import redis.asyncio

from aiolock import Lock
from aiolock._engine import notifier as _notifier
from aiolock._engine.notifier import HEALTH_INTERVAL
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys

from ..conftest import CommandLog, make_client
from ..support.servers import RedisServer, all_closed
from .test_network_faults import Proxied, proxied, until

__all__ = ("proxied",)  # the fixture, used by name

pytestmark = [pytest.mark.real_only, pytest.mark.slow]

DETECTION = 2 * HEALTH_INTERVAL
"""The longest a dead pub/sub connection goes unnoticed."""


async def test_a_waiter_behind_a_dead_subscription_still_gets_the_lock(
    proxied: Proxied, name: str
) -> None:
    keys = LockKeys.build("aiolock", name)
    loop = asyncio.get_running_loop()
    holder = await Lock(proxied.direct, name, ttl=30).acquire()
    waiting = asyncio.create_task(Lock(proxied.client, name, ttl=30).acquire())
    try:
        notifier = runtime_for(proxied.client).notifier
        await until(lambda: notifier.is_subscribed(keys.channel), "subscribed", timeout=10)

        async def queued() -> bool:
            return int(await proxied.direct.zcard(keys.queue)) == 1

        await until(queued, "the waiter queued in Redis", timeout=10)
        assert proxied.proxy.silence_subscribers() == 1
        silenced = loop.time()
        await holder.release()  # the grant's message is lost in the dead connection
        lease = await asyncio.wait_for(waiting, DETECTION + 5)
        took = loop.time() - silenced
        assert took <= DETECTION + 1.0, f"the waiter got the lock {took:.1f}s after (ttl 30)"
        assert notifier.silent_connections == 1
        await lease.release()
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await holder.release()


async def test_a_pub_sub_connection_that_answers_its_pings_is_kept(
    server: RedisServer, name: str, commands: CommandLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter waits through several health intervals on a connection that answers
    every PING: the notifier keeps that one connection (one SUBSCRIBE, the same client id
    on the server), replacing none."""
    interval = 0.3
    monkeypatch.setattr(_notifier, "HEALTH_INTERVAL", interval)
    keys = LockKeys.build("aiolock", name)
    direct = make_client(server.url)
    client = make_client(server.url, commands)
    holder = await Lock(direct, name, ttl=30).acquire()  # the waiter's next try: in 30 s
    waiting = asyncio.create_task(Lock(client, name, ttl=30).acquire())
    try:
        notifier = runtime_for(client).notifier
        await until(lambda: notifier.is_subscribed(keys.channel), "subscribed", timeout=10)

        async def subscribers() -> list[int]:
            return [int(c["id"]) for c in await direct.client_list(_type="pubsub")]

        first = await subscribers()
        assert len(first) == 1, first
        mark = commands.mark()
        await until(
            lambda: commands.since(mark)["PING"] >= 5,
            what="five PINGs, one per interval of silence",
            timeout=10 * interval + 10,
        )
        assert notifier.silent_connections == 0
        assert commands.since(0)["SUBSCRIBE"] == 1, commands.since(0)
        assert await subscribers() == first, "the pub/sub connection was replaced"
        assert not waiting.done()
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await holder.release()
        await client.aclose()
        await direct.aclose()


@dataclass
class Turns:
    """When each process got the lock, and how long it waited each time."""

    at: dict[str, list[float]] = field(default_factory=dict)
    waits: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


@pytest.fixture
async def others(server: RedisServer) -> AsyncIterator[list[redis.asyncio.Redis]]:
    """Two more processes' clients, on the proxied server (directly)."""
    async with all_closed([make_client(server.url) for _ in range(2)]) as clients:
        yield clients


async def test_a_deaf_process_gets_its_turns_and_does_not_slow_the_others(
    proxied: Proxied, name: str, others: list[redis.asyncio.Redis]
) -> None:
    """Three processes take turns on one lock; one's pub/sub connection dies silently."""
    loop = asyncio.get_running_loop()
    turns = Turns()
    stop = asyncio.Event()
    processes = {"deaf": proxied.client, "p2": others[0], "p3": others[1]}

    async def worker(label: str, client: redis.asyncio.Redis) -> None:
        turns.at[label], turns.waits[label] = [], []
        lock = Lock(client, name, ttl=10, timeout=30)
        while not stop.is_set():
            asked = loop.time()
            async with lock:
                now = loop.time()
                turns.at[label].append(now)
                turns.waits[label].append((now, now - asked))
                await asyncio.sleep(0.03)
            await asyncio.sleep(0.005)

    tasks = [asyncio.create_task(worker(label, c)) for label, c in processes.items()]
    try:
        await until(
            lambda: all(len(turns.at.get(label, ())) >= 3 for label in processes),
            "every process had turns",
            timeout=20,
        )
        channel = LockKeys.build("aiolock", name).channel
        notifier = runtime_for(proxied.client).notifier
        await until(
            lambda: notifier.is_subscribed(channel) and proxied.proxy.silence_subscribers() == 1,
            "the deaf process's pub/sub connection silenced",
            timeout=10,
        )
        silenced = loop.time()
        await asyncio.sleep(DETECTION + 4.0)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    deaf_turns = [t for t in turns.at["deaf"] if t > silenced]
    assert len(deaf_turns) >= 5, f"the deaf process had {len(deaf_turns)} turns"
    assert deaf_turns[0] - silenced <= DETECTION + 1.5
    # Once the dead connection is replaced, nobody waits for grants that lapse unheard.
    settled = silenced + DETECTION + 1.0
    for label in ("p2", "p3"):
        worst = max(wait for at, wait in turns.waits[label] if at > settled)
        assert worst < 0.8, f"{label} waited {worst:.2f}s once the connection was replaced"
