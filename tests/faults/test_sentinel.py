"""Sentinel: locks over `Sentinel(...).master_for(...)`, through a real failover.

Each test owns a `SentinelGroup` (one master, one replica, three Sentinels; see
`sentinel.py`). A failover is `SENTINEL FAILOVER`, which promotes the replica at once. The
former master keeps the master role, and takes writes, until the Sentinels demote it, about
ten seconds later: aiolock's connections (the user's pool as aiolock uses it, the renewal
connection, the pub/sub connection) must follow the Sentinels to the new master meanwhile.
What each test shows is listed in docs/guarantees.md ("Sentinel").
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.sentinel import Sentinel

from aiolock import (
    AcquireTimeoutError,
    EventKind,
    Lease,
    LeaseLostError,
    Lock,
    LockEvent,
    LossReason,
    Semaphore,
)
from aiolock._engine.notifier import Notifier
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys
from aiolock.testing._servers import free_ports

from ..deployments.sentinel import SERVICE, SentinelGroup, _ask, closing
from ..support.load import scaled
from ..support.recorded import recorded
from ..support.servers import RedisServer, ServerBinary
from ..support.waits import eventually, within

pytestmark = pytest.mark.real_only

NOTIFIED_BOUND = 0.5
"""Longest a waiter may take to get a released lock when a notification wakes it; without
one it would sleep until its fallback timer (the holder's ttl, several times longer)."""


@pytest.fixture
async def group(binaries: list[ServerBinary]) -> AsyncIterator[SentinelGroup]:
    with SentinelGroup(binaries[0]) as group:
        await group.ready()
        yield group


def events_of(lease_token: list[int]) -> contextlib.AbstractContextManager[list[LockEvent]]:
    """The events of the lease whose fencing token is `lease_token[0]` (set once known)."""
    return recorded(where=lambda event: bool(lease_token) and event.fencing_token == lease_token[0])


def count(events: list[LockEvent], kind: EventKind) -> int:
    return sum(1 for event in events if event.kind is kind)


def pubsub_port(client: redis.asyncio.Redis) -> int | None:
    """The port aiolock's pub/sub connection for `client` is open to (None: none open)."""
    pubsub = runtime_for(client).notifier._pubsub
    connection: Any = getattr(pubsub, "connection", None)
    if connection is None or not connection.is_connected:
        return None
    return int(connection.port)


async def waiting(group: SentinelGroup, notifier: Notifier, keys: LockKeys) -> None:
    """Wait until a waiter of `notifier`'s client is subscribed and has tried once: its
    process is in the lock's queue on the master."""

    async def queued() -> bool:
        if not notifier.is_subscribed(keys.channel):
            return False
        return int(await _ask(await group.master_port(), "ZCARD", keys.queue)) == 1

    await eventually(queued, what="the waiter subscribed and queued in Redis", timeout=5.0)


async def pttl(server: RedisServer, key: str) -> int:
    return int(await _ask(server.port, "PTTL", key))


async def client_list(server: RedisServer) -> list[dict[str, Any]]:
    """`CLIENT LIST` of `server`, one dict per connection (asked on a connection of its own)."""
    client = redis.asyncio.Redis(port=server.port, socket_timeout=2.0, decode_responses=True)
    try:
        return await client.client_list()
    finally:
        await client.aclose()


async def connections_named(server: RedisServer, client_name: str) -> list[int]:
    """The ids of the connections to `server` of the clients named `client_name`."""
    listed = await client_list(server)
    return sorted(int(entry["id"]) for entry in listed if entry.get("name") == client_name)


async def script_calls(server: RedisServer, *, refused: bool = False) -> int:
    """How many script calls (EVALSHA, EVAL) `server` has run (and, with `refused`, those
    it refused or that failed)."""
    stats = await _ask(server.port, "INFO", "commandstats")
    fields = ("calls", "rejected_calls", "failed_calls") if refused else ("calls",)
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get(field, 0))
        for name in ("evalsha", "eval")
        for field in fields
    )


async def holder_on(server: RedisServer, name: str) -> int | None:
    """The fencing token of the holder of lock `name` on `server`, or None."""
    client = redis.asyncio.Redis(port=server.port)
    try:
        holder = await Lock(client, name).info()
    finally:
        await client.aclose()
    return None if holder is None else holder.fencing_token


# ------------------------------------------------------------------- the deployment
async def test_a_sentinel_port_taken_before_its_start_moves_the_three(
    binaries: list[ServerBinary], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program that does not choose ports as the tests do listens on a port chosen for
    the third Sentinel before it starts: the three Sentinels start again, together, on
    new ports (each one's configuration names the others'), and the group is ready.

    Break seen failing: the group's start raised "port ... is taken"."""
    real = free_ports
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = int(squatter.getsockname()[1])
        calls: list[int] = []

        def choose(count: int, *, offset: int = 0) -> list[int]:
            calls.append(count)
            ports = real(count, offset=offset)
            return [*ports[:-1], taken] if len(calls) == 1 else ports

        monkeypatch.setattr(f"{SentinelGroup.__module__}.free_ports", choose)
        with SentinelGroup(binaries[0]) as group:
            await group.ready()
            assert len(calls) == 2
            assert taken not in [sentinel.port for sentinel in group.sentinels]
            assert all(sentinel.running for sentinel in group.sentinels)


# ------------------------------------------------------------------- steady state
async def test_lock_and_semaphore_over_master_for_acquire_renew_wait_and_release(
    group: SentinelGroup, name: str
) -> None:
    """Over `master_for` clients: a lease is renewed past its ttl by the watchdog; a waiter
    of another client is woken by the release's notification (well before its fallback
    timer), for a lock and a semaphore; every connection aiolock opens is Sentinel-managed
    and open to the master."""
    holder, other = group.master_client(), group.master_client()
    loop = asyncio.get_running_loop()
    async with closing(holder, other):
        # Renewal: a 0.6 s ttl held for 1.5 s.
        token: list[int] = []
        with events_of(token) as events:
            async with Lock(holder, f"{name}:short", ttl=scaled(0.6)) as lease:
                token.append(lease.fencing_token)
                await eventually(
                    lambda: count(events, EventKind.RENEWED) >= 2,
                    what="two renewals of a 0.6 s lease",
                    timeout=5.0,
                )
                assert not lease.lost
                renewals = runtime_for(holder).backend.transport._renew_client
                assert renewals is not None
                for connection in renewals.connection_pool._available_connections:
                    assert getattr(connection, "port", None) == group.master.port
            # A renewal may go unanswered within its bound when the machine stalls (the
            # lease stays held: renewals are retried within its validity); any other
            # failure would be the Sentinel routing's.
            failures = [e.error for e in events if e.kind is EventKind.RENEWAL_FAILED]
            assert all("no reply from Redis within" in str(e) for e in failures), failures

        # Waiting by notification, for a lock and for a semaphore (ttl 5 s: a waiter not
        # notified would sleep for seconds).
        primitives: list[tuple[Any, Any, LockKeys]] = [
            (
                Lock(holder, name, ttl=5.0),
                Lock(other, name, ttl=5.0),
                LockKeys.build("aiolock", name),
            ),
            (
                Semaphore(holder, name, limit=1, ttl=5.0),
                Semaphore(other, name, limit=1, ttl=5.0),
                LockKeys.build("aiolock", name, "sem:"),
            ),
        ]
        notifier = runtime_for(other).notifier
        for held, waited, keys in primitives:
            lease = await held.acquire()
            waiter = asyncio.create_task(waited.acquire(timeout=10.0))
            await waiting(group, notifier, keys)
            assert pubsub_port(other) == group.master.port
            received = notifier.messages_received
            released_at = loop.time()
            await lease.release()
            second: Lease = await within(waiter, what="the waiter's acquire", timeout=10.0)
            assert loop.time() - released_at < NOTIFIED_BOUND, "the waiter was not notified"
            assert notifier.messages_received > received
            await second.release()


async def test_calls_over_master_for_reuse_the_pooled_connection(
    group: SentinelGroup, name: str
) -> None:
    """Thirty acquire/release cycles over a `master_for` client, no failover: each call
    asks the Sentinels where the master is, finds the pooled connection open to it, and
    sends on it. No call opens a connection (the master sees the same client all along)."""
    client_name = f"aiolock-reuse-{secrets.token_hex(4)}"
    client = group.master_client(client_name=client_name)
    async with closing(client):
        lock = Lock(client, name, ttl=10)
        await (await lock.acquire()).release()  # the pool's connection is open
        before = await connections_named(group.master, client_name)
        assert len(before) == 1, before
        for _ in range(30):
            lease = await lock.acquire()
            await lease.release()
        assert await connections_named(group.master, client_name) == before


# ------------------------------------------------------------------- failover
async def test_a_failover_keeps_a_replicated_lease_and_aiolock_follows_the_new_master(
    group: SentinelGroup, name: str
) -> None:
    """`SENTINEL FAILOVER` while a lease is held and renewed, its key replicated: the lease
    is kept. Its renewals go to the new master (the key's expiry there keeps moving, so a
    second client cannot take the lock), although the former master is still a master
    that would take them. A waiter subscribed on the former master moves its pub/sub
    connection to the new one and is woken by the release's notification there."""
    holder, other = group.master_client(), group.master_client()
    loop = asyncio.get_running_loop()
    # Renewed every 0.5 s, with 3 s to spare: the failover (about 1 s, during which renewals
    # still go to the former master) fits in it many times over.
    ttl, every = 3.0, 0.5
    keys = LockKeys.build("aiolock", name)
    key, channel = keys.lock, keys.channel
    old = group.master
    async with closing(holder, other):
        token: list[int] = []
        with events_of(token) as events:
            lease = await Lock(holder, name, ttl=ttl, renew_interval=every).acquire()
            token.append(lease.fencing_token)
            waiter = asyncio.create_task(Lock(other, name, ttl=ttl).acquire(timeout=30.0))
            notifier = runtime_for(other).notifier
            await waiting(group, notifier, keys)
            assert pubsub_port(other) == old.port
            await group.replicated()

            started = loop.time()
            new = await group.failover()
            switched = loop.time()
            # The former master has not been demoted yet: it would take every write.
            assert await group.role(old) == "master"

            # Renewals reach the new master: the key there outlives its first ttl after
            # the switch, and is renewed again and again.
            renewed = count(events, EventKind.RENEWED)
            await eventually(
                lambda: (
                    count(events, EventKind.RENEWED) >= renewed + 3 and loop.time() - switched > ttl
                ),
                what="three renewals after the failover, and its ttl passed",
                timeout=5.0,
            )
            assert await pttl(new, key) > (ttl - every - 0.5) * 1000
            assert not lease.lost
            assert count(events, EventKind.LOST) == 0
            assert not waiter.done(), "the waiter got a lock that is still held"
            third = group.master_client()
            async with closing(third):
                with pytest.raises(AcquireTimeoutError):
                    await Lock(third, name, ttl=ttl).acquire(timeout=0)

            # The waiter's pub/sub connection moved to the new master.
            await eventually(
                lambda: pubsub_port(other) == new.port and notifier.is_subscribed(channel),
                what="the waiter's pub/sub connection moved to the new master",
                timeout=5.0,
            )
            received = notifier.messages_received
            released_at = loop.time()
            await lease.release()
            second: Lease = await within(waiter, what="the waiter's acquire", timeout=10.0)
            assert loop.time() - released_at < NOTIFIED_BOUND, "the waiter was not notified"
            assert notifier.messages_received > received
            assert second.fencing_token > lease.fencing_token
            await second.release()
            print(  # noqa: T201 - the timings, with -s
                f"failover in {switched - started:.2f}s; lease kept, "
                f"{count(events, EventKind.RENEWED) - renewed} renewals on the new master"
            )


async def test_a_connection_in_use_during_a_failover_never_sends_to_the_former_master(
    group: SentinelGroup, name: str
) -> None:
    """A connection of the user's pool is busy with a command of the user's (a BLPOP) on
    the master when a failover happens. aiolock's next call asks the Sentinels, and the
    pool drops its idle connections, but not that busy one: when the BLPOP ends, it goes
    back to the pool still open to the former master (which takes writes until the
    Sentinels demote it). aiolock's calls on it are sent to the new master instead."""
    client = group.master_client()
    old = group.master
    blocked_key = f"{name}:blocked"
    async with closing(client):
        lock = Lock(client, name, ttl=10)
        await (await lock.acquire()).release()
        blocked: asyncio.Future[Any] = asyncio.ensure_future(
            client.blpop([blocked_key], timeout=30)
        )
        try:

            async def blocking() -> bool:
                return any(entry.get("cmd") == "blpop" for entry in await client_list(old))

            await eventually(blocking, what="the BLPOP blocked on the master", timeout=5.0)
            new = await group.failover()
            lease = await lock.acquire()  # the pool learns of the failover
            await lease.release()
            await _ask(old.port, "LPUSH", blocked_key, "done")
            assert await within(blocked, what="the BLPOP's end") is not None
        finally:
            blocked.cancel()
            await asyncio.gather(blocked, return_exceptions=True)
        # The BLPOP's connection, open to the former master, is back in the pool (the
        # next one it hands out); the former master still takes writes.
        assert await group.role(old) == "master"
        sent = await script_calls(old)
        for _ in range(10):
            lease = await lock.acquire()
            assert await holder_on(new, name) == lease.fencing_token
            await lease.release()
        assert await script_calls(old) == sent, "a script was sent to the former master"


async def test_a_lock_key_lost_in_the_failover_lets_a_second_holder_in_and_the_first_loses(
    group: SentinelGroup, name: str
) -> None:
    """The known limit: replication is asynchronous, so a key written just before the
    failover may never reach the replica that is promoted. (Simulated here by deleting the
    lock's keys on the replica: the acquire's write that did not arrive.) A second client
    then gets the lock on the new master at once, although the first never released it;
    the first learns of it at its next renewal (`NOT_OWNER`, within ttl/3 of the switch),
    and `release()` says so. The fencing token of the second is the larger: fenced storage
    rejects the first."""
    holder, other = group.master_client(), group.master_client()
    loop = asyncio.get_running_loop()
    ttl = 1.5
    keys = LockKeys.build("aiolock", name)
    assert group.replica is not None
    replica = group.replica
    async with closing(holder, other):
        lease = await Lock(holder, name, ttl=ttl).acquire()
        await group.replicated()
        await _ask(replica.port, "CONFIG", "SET", "replica-read-only", "no")
        await _ask(replica.port, "DEL", *keys.scripts)
        await group.failover()
        switched = loop.time()
        second = await Lock(other, name, ttl=ttl).acquire(timeout=0)
        await within(lease.wait_lost(), what="the first holder's loss", timeout=5.0)
        lost_after = loop.time() - switched
        assert lease.loss_reason is LossReason.NOT_OWNER
        assert lost_after <= ttl / 3 + 0.3, lost_after
        assert second.fencing_token > lease.fencing_token
        with pytest.raises(LeaseLostError) as info:
            await lease.release()
        assert info.value.reason is LossReason.NOT_OWNER
        await second.release()


async def test_a_demoted_master_refusing_writes_sends_the_renewal_to_the_new_master(
    group: SentinelGroup, name: str
) -> None:
    """A renewal sent to a former master that was demoted (it answers READONLY), because
    the Sentinels were asked before the switch reached them: redis-py's Sentinel-managed
    connection closes itself on READONLY and raises a connection error, aiolock sends the
    renewal again on a new connection, which asks the Sentinels again and reaches the new
    master. The lease is renewed by that same call: no renewal fails, nothing is lost."""
    old = group.master
    lagging = [True]  # names the former master for as long as this holds
    stale: list[tuple[str, int]] = []  # then this once more

    class LaggingSentinel(Sentinel):
        """A view of the Sentinels that lags behind a failover."""

        def __init__(self, sentinels: list[tuple[str, int]]) -> None:
            super().__init__(sentinels)

        async def discover_master(self, service_name: str) -> tuple[str, int]:
            if lagging[0]:
                return ("127.0.0.1", old.port)
            if stale:
                return stale.pop()
            address: tuple[str, int] = await super().discover_master(service_name)
            return address

    holder = LaggingSentinel([("127.0.0.1", s.port) for s in group.sentinels]).master_for(SERVICE)
    # Renewed every second, with 6 s to spare: the key's expiry on the new master was last
    # moved before the failover, and the renewal that meets READONLY comes up to about 3.5 s
    # later (the failover, a renewal, then the next).
    ttl, every = 6.0, 1.0
    async with closing(holder):
        token: list[int] = []
        with events_of(token) as events:
            async with Lock(holder, name, ttl=ttl, renew_interval=every) as lease:
                token.append(lease.fencing_token)
                await group.replicated()
                new = await group.failover()
                # Right after a renewal (the next is a second away): the former master is
                # demoted, as the Sentinels would do later (but without closing its clients'
                # connections), and the view catches up but for one more stale answer.
                renewed = count(events, EventKind.RENEWED)
                await eventually(
                    lambda: count(events, EventKind.RENEWED) > renewed,
                    what="a renewal after the failover",
                    timeout=5.0,
                )
                await _ask(old.port, "REPLICAOF", "127.0.0.1", new.port)
                assert await group.role(old) == "slave"
                scripts_before = await script_calls(old, refused=True)
                stale.append(("127.0.0.1", old.port))
                lagging[0] = False
                renewed = count(events, EventKind.RENEWED)
                await eventually(
                    lambda: count(events, EventKind.RENEWED) >= renewed + 2,
                    what="two renewals after the demotion",
                    timeout=5.0,
                )
                assert not stale, "no renewal asked the lagging view"
                # A renewal reached the demoted master and was refused there (READONLY; or,
                # if it came while the demoted server was replacing its data, another
                # error), then sent again to the new master.
                assert await script_calls(old, refused=True) > scripts_before
                assert not lease.lost
            # A renewal may go unanswered within its bound when the machine stalls (the
            # lease stays held: renewals are retried within its validity); any other
            # failure would be the Sentinel routing's.
            failures = [e.error for e in events if e.kind is EventKind.RENEWAL_FAILED]
            assert all("no reply from Redis within" in str(e) for e in failures), failures
            assert count(events, EventKind.LOST) == 0
