"""Redis Cluster: locks, semaphores and read-write locks over `redis.asyncio.RedisCluster`,
on a real cluster of six processes (three primaries, three replicas; see `cluster.py`),
through a resharding of a held lock's slot and a failover of its primary.

What each test shows is listed in docs/guarantees.md ("Redis Cluster").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.exceptions
from redis.asyncio.cluster import RedisCluster

import aiolock._engine.lease
from aiolock import (
    AcquireTimeoutError,
    BackendError,
    ConfigError,
    EventKind,
    Lease,
    Lock,
    LockEvent,
    ReadWriteLock,
    Semaphore,
    cli,
    hold_stats,
    locked,
    run_once,
)
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys
from aiolock._lua.lease import RENEW
from aiolock._transport.backend import Backend

from ..deployments.cluster import SLOTS, ClusterGroup, cluster_of, on_replica
from ..deployments.sentinel import _ask
from ..integration.test_stalls import turns_taking_grant
from ..support.load import scaled
from ..support.recorded import of_lease as count
from ..support.recorded import recorded
from ..support.servers import ServerBinary, key_slot_of
from ..support.waits import eventually, within

pytestmark = pytest.mark.real_only

NOTIFIED_BOUND = 1.0
"""Longest a waiter may take to get a released lock when the release's notification wakes
it; without one it would sleep until its fallback timer (the holder's ttl, 10 s here)."""


@pytest.fixture
async def cluster(binaries: list[ServerBinary]) -> AsyncIterator[ClusterGroup]:
    async with cluster_of(binaries[0]) as group:
        yield group


def slot_of(name: str, kind: str = "") -> int:
    return key_slot_of(LockKeys.build("aiolock", name, kind).lock)


def names_in_thirds(base: str, per_third: int = 1, kind: str = "") -> list[str]:
    """`per_third` names in each third of the slots (each primary serves one third), each
    in a slot of its own."""
    found: list[str] = []
    for third in range(3):
        low, high = third * SLOTS // 3, (third + 1) * SLOTS // 3
        slots: set[int] = set()
        for i in range(100_000):
            name = f"{base}:{third}:{i}"
            slot = slot_of(name, kind)
            if low <= slot < high and slot not in slots:
                slots.add(slot)
                found.append(name)
                if len(slots) == per_third:
                    break
    return found


async def renewals(seen: list[LockEvent], fencing_token: int, at_least: int) -> None:
    await eventually(
        lambda: count(seen, fencing_token) >= at_least,
        what=f"{at_least} renewals of the lease",
        timeout=5.0,
    )


BUSY = scaled(1.0)
"""How long a check that a name is busy for others tries (a single try gets a second, which
the first call of a cluster client, finding its nodes, can outlast on a loaded machine)."""


async def queued(client: RedisCluster, queue_key: str) -> None:
    async def in_queue() -> bool:
        return int(await client.zcard(queue_key)) >= 1

    await eventually(in_queue, what="the waiter queued in Redis", timeout=scaled(10.0))


async def contended(
    client: RedisCluster, other: RedisCluster, name: str, *, ttl: float, timeout: float
) -> tuple[Lease, asyncio.Future[Lease], LockKeys, int]:
    """`name` held by `client` (for `ttl`) and waited for by `other` (for up to `timeout`,
    queued in Redis): the holder's lease, the waiting acquire, the keys, their slot."""
    holder = await Lock(client, name, ttl=ttl).acquire()
    waiting = asyncio.ensure_future(Lock(other, name, ttl=ttl).acquire(timeout=timeout))
    keys = LockKeys.build("aiolock", name)
    await queued(client, keys.queue)
    return holder, waiting, keys, slot_of(name)


async def hand_over(holder: Any, waiting: asyncio.Future[Any]) -> Any:
    """Release `holder` and return the lease `waiting` gets, checking it was woken by the
    release's notification."""
    loop = asyncio.get_running_loop()
    released = loop.time()
    await holder.release()
    lease = await within(waiting, what="the waiter's lease", timeout=5.0)
    assert loop.time() - released < NOTIFIED_BOUND, "woken by its fallback timer"
    return lease


# ------------------------------------------------------------------- steady state
async def test_locks_semaphores_and_rwlocks_work_on_every_primary(
    cluster: ClusterGroup, name: str
) -> None:
    """On names served by each of the three primaries: a lease is renewed past its ttl,
    a waiter of another client is woken by the release's notification (on Redis 7 and
    Valkey a sharded one, heard on a session per primary), and `info()` reads the name's
    keys from its node."""
    async with cluster.clients(2) as (client, other):
        with recorded(EventKind.RENEWED) as renewed:
            for lock_name in names_in_thirds(name):
                lease = await Lock(client, lock_name, ttl=10, renew_interval=0.1).acquire()
                await renewals(renewed, lease.fencing_token, 2)
                assert (await Lock(client, lock_name).info()) is not None
                waiting = asyncio.ensure_future(Lock(other, lock_name, ttl=10).acquire(timeout=20))
                await queued(client, LockKeys.build("aiolock", lock_name).queue)
                got = await hand_over(lease, waiting)
                await got.release()
            for sem_name in names_in_thirds(name + ":sem", kind="sem:"):
                semaphore = Semaphore(client, sem_name, limit=2, ttl=10)
                first, second = await semaphore.acquire(), await semaphore.acquire()
                info = await semaphore.info()
                assert {h.fencing_token for h in info.holders} == {
                    first.fencing_token, second.fencing_token
                }  # fmt: skip
                waiting = asyncio.ensure_future(
                    Semaphore(other, sem_name, limit=2, ttl=10).acquire(timeout=20)
                )
                await queued(client, LockKeys.build("aiolock", sem_name, "sem:").queue)
                got = await hand_over(first, waiting)
                for permit in (second, got):
                    await permit.release()
            for rw_name in names_in_thirds(name + ":rw", kind="rw:"):
                rw = ReadWriteLock(client, rw_name, ttl=10)
                async with rw.read(), ReadWriteLock(other, rw_name, ttl=10).read():
                    assert len((await rw.info()).readers) == 2
                    with pytest.raises(AcquireTimeoutError):
                        await rw.write().acquire(timeout=0)  # one try: this task reads
                async with rw.write():
                    assert (await rw.info()).writer is not None


async def moved_answers(group: ClusterGroup) -> int:
    """MOVED errors the primaries have answered since they started (INFO errorstats)."""
    total = 0
    for server in group.servers[:3]:
        stats = await _ask(server.port, "INFO", "errorstats")
        total += int(stats.get("errorstat_MOVED", {}).get("count", 0))
    return total


async def test_the_first_calls_of_a_new_client_go_to_their_slots_owners(
    cluster: ClusterGroup, name: str
) -> None:
    """aiolock's own cluster client is made at the first call, and again after it closed
    once idle: many calls at once on it must not go out before it knows which node serves
    which slot (redis-py sends such calls to any node; every fifth MOVED answer makes it
    close all its connections, those of calls in flight included)."""
    names = [f"{name}:{i}" for i in range(24)]
    async with cluster.clients(1) as (client,):
        before = await moved_answers(cluster)
        leases = await asyncio.gather(*(Lock(client, n, ttl=10).acquire() for n in names))
        await asyncio.gather(*(lease.release() for lease in leases))
        assert len({slot_of(n) * 3 // SLOTS for n in names}) == 3, "names on every primary"
        assert await moved_answers(cluster) == before


@contextlib.contextmanager
def routed_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The script calls (EVALSHA, EVAL) sent through redis-py's cluster routing
    (`RedisCluster.execute_command`) while in the block, by any cluster client."""
    seen: list[str] = []
    execute = RedisCluster.execute_command

    async def recording(self: RedisCluster, *args: Any, **kwargs: Any) -> Any:
        if str(args[0]).upper() in ("EVALSHA", "EVAL"):
            seen.append(str(args[3]) if int(args[2]) else "")
        return await execute(self, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(RedisCluster, "execute_command", recording)
        yield seen


async def cycle(client: RedisCluster, name: str) -> None:
    lease = await Lock(client, name, ttl=10).acquire(timeout=5)
    await lease.release()


async def test_a_lock_cycle_sends_its_scripts_to_the_slots_primary_directly(
    cluster: ClusterGroup, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script call goes on a connection of the primary serving its slot, as aiolock's
    own cluster client knows it, past redis-py's cluster routing: each acquire and release
    is one EVALSHA on that primary, and none goes through `execute_command`."""
    async with cluster.clients(1) as (client,):
        names = names_in_thirds(name, per_third=2)
        for each in names:  # the scripts known to every primary, the client its nodes
            await cycle(client, each)
        primaries = [await cluster.owner(slot_of(each)) for each in names]
        before = {p.port: await cluster.commands(p, "evalsha") for p in primaries}
        with routed_calls(monkeypatch) as routed:
            for each in names:
                await cycle(client, each)
        assert routed == []
        ran = {p.port: await cluster.commands(p, "evalsha") - before[p.port] for p in primaries}
        assert ran == {p.port: 4 for p in primaries}, ran  # two names, two calls each


async def test_a_call_answered_moved_goes_once_through_the_cluster_routing(
    cluster: ClusterGroup, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot moved to another primary without aiolock's own cluster client seeing it: a
    call sent to the former owner is answered MOVED (not applied) and sent again through
    redis-py's routing, which follows the redirection and learns the new owner; the calls
    after it go to the new owner directly."""
    async with cluster.clients(1) as (client,):
        await cycle(client, name)
        slot = slot_of(name)
        _, target = await cluster.migration_of(slot)
        await cluster.move_slot(slot, target)
        before = await moved_answers(cluster)
        with routed_calls(monkeypatch) as routed:
            for _ in range(3):
                await cycle(client, name)
        key = LockKeys.build("aiolock", name).lock
        assert routed == [key], routed  # the first acquire only
        # Answered MOVED twice: the direct call, and redis-py's first try from its own map.
        assert await moved_answers(cluster) - before == 2
        assert not await Lock(client, name).locked()


async def test_a_call_on_a_replaced_primarys_slot_finds_the_new_primary(
    cluster: ClusterGroup, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The primary serving a name's slot is killed and its replica promoted while
    aiolock's own cluster client stays open (a lease on another primary's slot keeps it)
    and still maps the slot to the dead node (put back if it learned otherwise). The next
    acquire's call meets a refused connection; the calls after it go through redis-py's
    routing for a while, which finds the cluster's nodes again, and the acquire gets the
    lock within its bound."""
    async with cluster.clients(1) as (client,):
        names = names_in_thirds(name)
        await cycle(client, names[0])
        slot = slot_of(names[0])
        primary = await cluster.owner(slot)
        elsewhere = names[1]  # in another third of the slots: another primary's
        assert await cluster.owner(slot_of(elsewhere)) is not primary
        # Renewed at once and often: its renewals keep the cluster client open throughout.
        keeper = await Lock(client, elsewhere, ttl=scaled(5), renew_interval=0.2).acquire()
        transport = runtime_for(client).backend.transport
        await eventually(
            lambda: getattr(transport, "_own_pinned", False), what="a renewal", timeout=5.0
        )
        own = getattr(transport, "_own", None)
        assert own is not None
        stale = list(own.nodes_manager.slots_cache[slot])
        assert stale[0].port == primary.port
        replica = await cluster.replica_of(primary)
        primary.kill()

        async def promoted() -> bool:
            return await cluster.owner(slot) is replica

        await eventually(promoted, what="the replica promoted", timeout=20.0)
        # As a client that has not heard of the failover yet still maps it (the keeper's
        # renewals may have taught this one).
        own.nodes_manager.slots_cache[slot] = stale
        with routed_calls(monkeypatch) as routed:
            lease = await Lock(client, names[0], ttl=scaled(5)).acquire(timeout=scaled(10))
        assert getattr(transport, "_own", None) is own, "the cluster client was made again"
        assert routed, "sent directly to the dead node only"
        await lease.release()
        assert not keeper.lost
        await keeper.release()


async def test_renewals_go_one_call_per_slot_one_round_trip_per_node(
    cluster: ClusterGroup, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal batch over leases in six slots (two on each primary) is one RENEW call per
    slot, sent as one pipeline per node: each primary runs exactly two script calls per
    batch, however the leases were batched."""
    async with cluster.clients(1) as (client,):
        scheduler = runtime_for(client).scheduler
        calls: list[int] = []
        run_each = Backend.run_each

        async def recording(self: Backend, script: Any, batch: Any, **kwargs: Any) -> list[Any]:
            calls.append(len(batch))
            return await run_each(self, script, batch, **kwargs)

        monkeypatch.setattr(Backend, "run_each", recording)
        names = names_in_thirds(name, per_third=2)
        primaries = [await cluster.owner(slot_of(n)) for n in names[::2]]
        for primary in primaries:  # no NOSCRIPT round in the count below
            await _ask(primary.port, "SCRIPT", "LOAD", RENEW.source)
        # A ttl that a loaded machine's stalls do not outlast (the leases must be kept).
        leases = [await Lock(client, n, ttl=scaled(0.9)).acquire() for n in names]
        before = [await cluster.commands(p, "evalsha") for p in primaries]
        # Counted from here on, together (a batch may have gone while the leases were taken).
        sent, calls_before = scheduler.batches_sent, len(calls)
        await eventually(
            lambda: scheduler.batches_sent - sent >= 4, what="four renewal batches", timeout=20.0
        )
        for lease in leases:
            await lease.release()
        await within(scheduler.wait_idle(), what="the renewals to stop", timeout=10.0)
        batches = scheduler.batches_sent - sent
        after = [await cluster.commands(p, "evalsha") for p in primaries]
        assert all(not lease.lost for lease in leases)
        counted = calls[calls_before:]
        # Each batch holds the leases due together; each of its slots is one call.
        assert sum(counted) >= 6 and all(1 <= c <= 6 for c in counted), counted
        assert len(counted) == batches, (counted, batches)
        per_primary = [b - a for a, b in zip(before, after, strict=True)]
        # Every slot's calls ran on its primary; two releases each.
        assert sum(per_primary) == sum(counted) + len(leases), (per_primary, counted)


async def test_a_granted_lease_writes_its_renewal_without_waiting_for_its_answer(
    cluster: ClusterGroup, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taking another client's grant on a cluster writes the renewal to the full ttl on
    the name's primary directly and starts the body once it is written (as on one
    server), without the loop turning in between to read its answer."""
    async with cluster.clients(2) as (a, b):
        for client in (a, b):  # the scripts loaded, the connections open
            warm = await Lock(client, name, ttl=30).acquire()
            await warm.extend()
            await warm.release()
        taking = await turns_taking_grant(a, b, name, monkeypatch)
        assert taking == [0], "the loop turned while the grant was taken"


# ------------------------------------------------------------------- resharding, failover
async def test_a_resharding_of_a_held_locks_slot_is_followed_not_reported_as_a_loss(
    cluster: ClusterGroup, name: str
) -> None:
    """The slot of a held lock moves to another primary (IMPORTING/MIGRATING, MIGRATE of
    its keys, SETSLOT NODE): renewals follow the ASK replies while the slot migrates and
    the MOVED replies after, and land on the new primary, the lease is kept, the lock stays busy for others, and a waiter is still
    woken by the release."""
    async with cluster.clients(2) as (client, other):
        with recorded(EventKind.RENEWED) as renewed, recorded(EventKind.LOST) as lost:
            lease = await Lock(client, name, ttl=10, renew_interval=0.1).acquire()
            slot = slot_of(name)
            source, target = await cluster.migration_of(slot)
            await eventually(
                lambda: count(renewed, lease.fencing_token) >= 1, what="a renewal", timeout=5.0
            )
            key = LockKeys.build("aiolock", name).lock

            async def while_asking() -> None:
                # The keys are on the target, the slot still the source's: renewals are
                # answered ASK and sent on to the target with ASKING.
                with pytest.raises(redis.exceptions.ResponseError) as asked:
                    await _ask(source.port, "EXISTS", key)
                # redis-py 5.0 reports it as "ASK ...", later versions as an AskError.
                assert isinstance(asked.value, redis.exceptions.AskError) or "ASK" in str(
                    asked.value
                )
                await renewals(
                    renewed, lease.fencing_token, count(renewed, lease.fencing_token) + 2
                )

            await cluster.move_slot(slot, target, midway=while_asking)
            assert await cluster.owner(slot) is target
            moved = count(renewed, lease.fencing_token)
            await eventually(
                lambda: count(renewed, lease.fencing_token) >= moved + 3,
                what="three renewals after the move", timeout=5.0,
            )  # fmt: skip
            assert not lease.lost and not lost
            assert int(await _ask(target.port, "EXISTS", key)) == 1
            with pytest.raises(AcquireTimeoutError):
                await Lock(other, name, ttl=10).acquire(timeout=BUSY)
            waiting = asyncio.ensure_future(Lock(other, name, ttl=10).acquire(timeout=20))
            await queued(client, LockKeys.build("aiolock", name).queue)
            got = await hand_over(lease, waiting)
            await got.release()


async def test_a_failover_of_the_primary_keeps_the_lease(cluster: ClusterGroup, name: str) -> None:
    """`CLUSTER FAILOVER` on the replica of the primary serving a held lock (a coordinated
    failover: the replica has caught up first). The renewals move to the new primary after
    its MOVED replies; the lease is kept (at most a few renewals fail while the roles
    switch, each retried), and the lock stays busy for others. (The ttl outlives a manual
    failover that Redis aborts after 5 s on a loaded machine, writes paused meanwhile, and
    the one asked again after it.)"""
    async with cluster.clients(2) as (client, other):
        with recorded(EventKind.RENEWED) as renewed, recorded(EventKind.RENEWAL_FAILED) as failed:
            lease = await Lock(client, name, ttl=15, renew_interval=0.1).acquire()
            await cluster.fail_over(slot_of(name))
            after = count(renewed, lease.fencing_token)
            await eventually(
                lambda: count(renewed, lease.fencing_token) >= after + 3,
                what="three renewals after the failover", timeout=10.0,
            )  # fmt: skip
            assert not lease.lost
            assert count(failed, lease.fencing_token) <= 10, count(failed, lease.fencing_token)
            with pytest.raises(AcquireTimeoutError):
                await Lock(other, name, ttl=5).acquire(timeout=BUSY)
            await lease.release()
            assert not await Lock(other, name).locked()


@pytest.mark.timeout(120)
async def test_a_killed_primary_is_replaced_and_the_replicated_lease_is_kept(
    cluster: ClusterGroup, name: str
) -> None:
    """The primary serving a held lock is killed (SIGKILL); its replica, which has the key,
    takes over after the node timeout (1 s) and an election. Meanwhile renewals fail or
    wait (each call bounded by half the lease's remaining validity); the lease, ttl 8 s,
    outlives the outage: it is kept, never reported lost, and renewed on the new primary,
    and the lock stays busy for others."""
    async with cluster.clients(2) as (client, other):
        with (
            recorded(EventKind.RENEWED) as renewed,
            recorded(EventKind.RENEWAL_FAILED) as failed,
            recorded(EventKind.LOST) as lost,
        ):
            # (A loaded machine slows the failover: the ttl must outlast it.)
            lease = await Lock(client, name, ttl=scaled(8.0), renew_interval=0.2).acquire()
            slot = slot_of(name)
            primary = await cluster.owner(slot)
            replica = await cluster.replica_of(primary)
            key = LockKeys.build("aiolock", name).lock
            await eventually(
                lambda: on_replica(replica, key), what="the key on the replica", timeout=5.0
            )
            primary.kill()

            async def promoted() -> bool:
                return await cluster.owner(slot) is replica

            await eventually(promoted, what="the replica promoted", timeout=min(40.0, scaled(20.0)))
            after = count(renewed, lease.fencing_token)
            await renewals(renewed, lease.fencing_token, after + 3)
            assert not lease.lost and not lost
            # Renewals that failed meanwhile (if any: redis-py's cluster client may hold a
            # call while it finds the new primary) are retried, and were not a loss.
            assert all(isinstance(e.error, BackendError) for e in failed), failed
            with pytest.raises(AcquireTimeoutError):
                await Lock(other, name, ttl=8).acquire(timeout=BUSY)
            await lease.release()


# ------------------------------------------------------------------- seeing them
async def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    """`aiolock <argv>` in a thread (this test's loop holds the locks); its JSON output."""
    capsys.readouterr()
    code = await asyncio.to_thread(cli.main, list(argv))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out) if "--json" in argv else captured.out


async def test_the_command_line_and_hold_stats_read_every_primary(
    cluster: ClusterGroup, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Given the URL of one node, `aiolock ls`, `show`, `stats` and `release --force` find
    that it is a cluster node and read every primary (each name's keys on the node serving
    its slot); `hold_stats()` takes the cluster client."""
    url = f"redis://127.0.0.1:{cluster.servers[0].port}/0"
    async with cluster.clients(1) as (client,):
        names = names_in_thirds(name)
        # (Renewed by this loop while the command line holds the process in a thread: on a
        # loaded machine their ttl must outlast that.)
        ttl = scaled(3.0)
        leases = [await Lock(client, n, ttl=ttl, hold_stats=True).acquire() for n in names]
        permit = await Semaphore(client, name + ":sem", limit=2, ttl=30).acquire()
        rows = await cli_json(capsys, "--url", url, "ls", f"{name}*", "--json")
        assert sorted((row["kind"], row["name"]) for row in rows) == sorted(
            [("lock", n) for n in names] + [("semaphore", name + ":sem")]
        )
        tokens = {row["name"]: row["fencing_token"] for row in rows if row["kind"] == "lock"}
        assert tokens == {lease.name: lease.fencing_token for lease in leases}
        shown = await cli_json(capsys, "--url", url, "show", names[1], "--json")
        assert json.dumps(shown).count(str(leases[1].fencing_token)) >= 1
        await cli_json(capsys, "--url", url, "release", "--force", "--yes", names[2])
        assert not await Lock(client, names[2]).locked()
        await within(
            leases[2].wait_lost(), what="the evicted holder's loss", timeout=ttl / 3 + scaled(4.0)
        )
        await leases[0].release()
        stats = await cli_json(capsys, "--url", url, "stats", f"{name}*", "--json")
        assert [row["count"] for row in stats if row["name"] == names[0]] == [1]
        assert (await hold_stats(client, names[0])).count == 1
        await leases[1].release()
        await permit.release()


# ------------------------------------------------------------------- what is refused
async def test_locked_and_run_once_take_a_cluster_client_and_replicas_is_refused(
    cluster: ClusterGroup, name: str
) -> None:
    """`@locked` and `run_once` (like the web integrations) take a cluster client;
    `replicas=` is refused with one, at the call (WAIT must follow the script on the same
    connection)."""
    async with cluster.clients(1) as (client,):

        @locked(name + ":{order}", client=client, ttl=5)
        async def job(order: int, *, lease: Lease | None = None) -> int:
            assert lease is not None
            return lease.fencing_token

        assert await job(1) > 0
        assert await job(2) > 0
        ran: list[int] = []

        async def nightly() -> int:
            ran.append(1)
            return len(ran)

        first = await run_once(client, name + ":nightly", nightly, retention=60)
        second = await run_once(client, name + ":nightly", nightly, retention=60)
        assert (first.ran, second.ran, len(ran)) == (True, False, 1)

        with pytest.raises(ConfigError) as info:
            Lock(client, name, replicas=1)
        assert info.value.argument == "replicas"


# ------------------------------------------------------------------- a migration held open
MIGRATION_HELD = 3.0
"""Seconds a test holds a slot's migration open, a name's keys on both sides."""


async def test_a_migration_held_open_costs_waiting_not_errors(
    cluster: ClusterGroup, name: str
) -> None:
    """The slot of a lock, a semaphore and a read-write lock of one name migrates, held
    open for MIGRATION_HELD seconds with the lock's state moved and its wait queue not:
    every script naming several keys is answered TRYAGAIN meanwhile. A release, a contended
    acquire, a semaphore's and a read-write lock's acquire of a free name each wait for
    the migration to end (retrying within their bounds); none fails, and the release hands
    the lock to the queued waiter."""
    async with cluster.clients(3) as (client, other, third):
        holder, waiting, keys, slot = await contended(client, other, name, ttl=10, timeout=30)
        source, target = await cluster.migration_of(slot)
        started: dict[str, asyncio.Future[Any]] = {}

        async def held_open() -> None:
            assert int(await _ask(target.port, "CLUSTER", "COUNTKEYSINSLOT", slot)) == 1
            assert int(await _ask(source.port, "EXISTS", keys.queue)) == 1
            started["release"] = asyncio.ensure_future(holder.release())
            started["contended"] = asyncio.ensure_future(
                Lock(third, name, ttl=10).acquire(timeout=30)
            )
            started["semaphore"] = asyncio.ensure_future(
                Semaphore(third, name, limit=2, ttl=10).acquire(timeout=30)
            )
            started["read"] = asyncio.ensure_future(
                ReadWriteLock(third, name, ttl=10).read().acquire(timeout=30)
            )
            await asyncio.sleep(MIGRATION_HELD)
            failed = {what: f.exception() for what, f in started.items() if f.done()}
            assert not failed, f"failed while the slot migrated: {failed}"
            assert not waiting.done(), "the waiter was served while the release could not run"

        def the_state_first(found: list[str]) -> list[str]:
            return [key for key in found if key == keys.lock]

        await cluster.move_slot(slot, target, first=the_state_first, midway=held_open)
        await within(started["release"], what="the release, once the slot has moved")
        lease = await within(waiting, what="the queued waiter served by the release")
        for what in ("semaphore", "read"):
            await (await within(started[what], what=f"the {what} acquire")).release()
        await lease.release()
        await (await within(started["contended"], what="the contended acquire")).release()


async def test_renewals_do_not_wait_for_the_users_exhausted_pool(
    cluster: ClusterGroup, name: str
) -> None:
    """The user's `RedisCluster` allows one connection per node, and every node's is busy
    with a BLPOP that never returns: leases are renewed on aiolock's own cluster client all
    the same (the pool's limit is not its own), an acquire and a release go through, and a
    waiter of another process is handed the lock by a release."""
    names = names_in_thirds(name)
    user = cluster.client(max_connections=1)
    async with cluster.clients(1) as (other,):
        try:
            with recorded(EventKind.RENEWED) as renewed:
                ttl = scaled(1.0)
                leases = [await Lock(user, n, ttl=ttl).acquire() for n in names]

                async def block(n: str) -> None:
                    """Keep the only connection to `n`'s node busy for good."""
                    while True:
                        with contextlib.suppress(redis.exceptions.MaxConnectionsError):
                            await user.blpop([f"{{{n}}}:never"], timeout=0)
                        await asyncio.sleep(0.01)

                blockers = [asyncio.ensure_future(block(n)) for n in names]
                try:

                    async def exhausted() -> bool:
                        for n in names:
                            try:
                                await user.get(f"{{{n}}}:probe")
                            except redis.exceptions.MaxConnectionsError:
                                continue
                            return False
                        return True

                    await eventually(exhausted, what="the user's pool exhausted", timeout=5.0)
                    before = [count(renewed, lease.fencing_token) for lease in leases]

                    def renewed_thrice() -> bool:  # a ttl's worth of renewals, each
                        after = [count(renewed, lease.fencing_token) for lease in leases]
                        return all(b >= a + 3 for a, b in zip(before, after, strict=True))

                    await eventually(renewed_thrice, what="three renewals of each lease")
                    assert not any(lease.lost for lease in leases)
                    # Acquires and releases do not use it either; a waiter of another
                    # process is handed the lock by a release.
                    extra = await Lock(user, f"{names[0]}:more", ttl=ttl).acquire(timeout=5)
                    await extra.release()
                    waiting = asyncio.ensure_future(
                        Lock(other, names[0], ttl=ttl).acquire(timeout=10)
                    )
                    await queued(other, LockKeys.build("aiolock", names[0]).queue)
                    got = await hand_over(leases[0], waiting)
                    await got.release()
                    assert not any(blocker.done() for blocker in blockers)
                finally:
                    for blocker in blockers:
                        blocker.cancel()
                    await asyncio.gather(*blockers, return_exceptions=True)
                for lease in leases:
                    await lease.release()
                assert not await Lock(other, names[0]).locked()
        finally:
            await user.aclose()


async def test_a_release_refused_past_its_bound_lands_once_the_migration_ends(
    cluster: ClusterGroup, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release whose slot migrates for longer than its bound (shortened here to 0.5 s;
    the ttl is 30 s) returns; it goes on in the background and hands the lock to the queued
    waiter as soon as the migration ends, not when the key would have expired."""
    monkeypatch.setattr(aiolock._engine.lease, "RELEASE_TIMEOUT", 0.5)
    async with cluster.clients(2) as (client, other):
        holder, waiting, keys, slot = await contended(client, other, name, ttl=30, timeout=60)
        _, target = await cluster.migration_of(slot)
        loop = asyncio.get_running_loop()

        async def held_open() -> None:
            await within(holder.release(), what="the release to return", timeout=5.0)
            assert holder.released
            await asyncio.sleep(MIGRATION_HELD - 1.0)
            assert not waiting.done(), "served while the release could not land"

        await cluster.move_slot(
            slot, target, first=lambda found: [k for k in found if k == keys.lock], midway=held_open
        )
        # (From the migration's end: its last steps, the other keys moved and every primary
        # told, took seconds on a loaded machine.)
        ended = loop.time()
        lease = await within(waiting, what="the waiter served once the release landed")
        try:
            assert loop.time() - ended < 5.0, "served by the key's expiry, not by the release"
        finally:
            await lease.release()
