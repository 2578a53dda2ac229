"""`hold_elsewhere` and `expire_now` for every primitive: a lock, a semaphore's permits, a
read-write lock's writer and readers, an election, a multi-lock (on a real server and on
fakeredis), a Redlock (on three real servers)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio

from aiolock import (
    AcquireTimeoutError,
    ConfigError,
    Election,
    Lease,
    Lock,
    LossReason,
    MultiLock,
    ReadWriteLock,
    Redlock,
    Semaphore,
)
from aiolock.testing import expire_now, hold_elsewhere

from ..conftest import CommandLog
from ..support.load import scaled
from ..support.servers import (
    RedisServer,
    ServerBinary,
    clients_of,
    independent_servers,
    quorum_calls_ended,
)
from ..support.waits import within


async def lost(lease: Lease) -> None:
    """Wait until `lease` is lost at a renewal (its key or field expired under it)."""
    error = await within(lease.wait_lost(), what=f"{lease!r} lost")
    assert error is not None
    assert lease.loss_reason is LossReason.NOT_OWNER


async def test_expire_now_a_semaphores_permits(client: redis.asyncio.Redis, name: str) -> None:
    sem = Semaphore(client, name, limit=3, ttl=scaled(0.3))
    first, second = await sem.acquire(), await sem.acquire()
    assert (first.slot, second.slot) == (0, 1)
    assert await expire_now(client, sem, slot=1)  # the permit in slot 1 only
    await lost(second)
    await first.extend()  # still held
    assert not await expire_now(client, sem, slot=1)  # nobody in slot 1 now
    assert not await expire_now(client, sem, slot=2)
    third = await sem.acquire()
    assert await expire_now(client, sem)  # every permit
    await lost(first)
    await lost(third)
    assert not await expire_now(client, sem)
    assert (await sem.info()).holders == ()  # free again: the permits expired
    async with sem as again:
        assert again.slot == 0


async def test_expire_now_a_read_write_locks_writer_or_readers(
    client: redis.asyncio.Redis, name: str
) -> None:
    rw = ReadWriteLock(client, name, ttl=scaled(0.3))
    writer = await rw.write().acquire()
    assert not await expire_now(client, rw.read())  # no reader to expire
    assert writer.held
    assert await expire_now(client, rw.write())
    await lost(writer)
    readers = [await rw.read().acquire() for _ in range(2)]
    assert not await expire_now(client, rw.write())
    assert await expire_now(client, rw.read())  # every reader
    for reader in readers:
        await lost(reader)
    async with rw.write():  # free again
        pass


async def test_expire_now_a_lock_as_before(client: redis.asyncio.Redis, name: str) -> None:
    lock = Lock(client, name, ttl=scaled(0.3))
    lease = await lock.acquire()
    assert await expire_now(client, lock)
    await lost(lease)
    lease = await lock.acquire()
    assert await expire_now(client, name)  # by its name
    await lost(lease)


async def test_hold_elsewhere_every_free_permit_or_some(
    client: redis.asyncio.Redis, name: str
) -> None:
    sem = Semaphore(client, name, limit=3, ttl=5)
    async with hold_elsewhere(client, sem) as permits:
        assert sorted(p.slot or 0 for p in permits) == [0, 1, 2]
        assert await sem.try_acquire() is None  # busy for the code under test
        with pytest.raises(AcquireTimeoutError):
            await sem.acquire(timeout=0.05)
    async with hold_elsewhere(client, sem, permits=2) as permits:
        assert len(permits) == 2
        async with sem as mine:  # one left
            assert mine.slot == 2
            assert await sem.try_acquire() is None
    mine = await sem.acquire()  # some held here: the rest are taken
    async with hold_elsewhere(client, sem) as permits:
        assert len(permits) == 2
        assert await sem.try_acquire() is None
    await mine.release()
    assert (await sem.info()).holders == ()  # released at the block's end


async def test_hold_elsewhere_a_read_write_lock(client: redis.asyncio.Redis, name: str) -> None:
    rw = ReadWriteLock(client, name, ttl=5)
    async with hold_elsewhere(client, rw.write()) as writer:
        assert writer.held
        assert await rw.read().try_acquire() is None
        assert await rw.write().try_acquire() is None
    async with hold_elsewhere(client, rw.read()) as reader:
        assert reader.held
        assert await rw.write().try_acquire() is None  # a reader keeps writers out
        async with rw.read():  # but lets readers in
            pass
    async with rw.write():  # released at the block's end
        pass


async def test_hold_elsewhere_a_lock_object_or_name(client: redis.asyncio.Redis, name: str) -> None:
    lock = Lock(client, name, ttl=5, prefix="app")
    async with hold_elsewhere(client, lock) as lease:  # the Lock's own prefix
        assert lease.held
        assert await lock.try_acquire() is None
    async with hold_elsewhere(client, name, prefix="app"):
        assert await lock.try_acquire() is None
    async with lock:
        pass


async def test_hold_elsewhere_waits_for_a_busy_semaphore(
    client: redis.asyncio.Redis, name: str
) -> None:
    sem = Semaphore(client, name, limit=1, ttl=5)
    async with sem:
        with pytest.raises(AcquireTimeoutError):
            async with hold_elsewhere(client, sem, timeout=0.05):
                pass


@pytest.mark.real_only
async def test_bad_targets_and_arguments_fail_before_anything_is_sent(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    rw = ReadWriteLock(client, name)
    sem = Semaphore(client, name, limit=2)
    mark = commands.mark()
    for target in (rw, 42, b"name"):
        with pytest.raises(TypeError, match=r"^lock must be") as info:
            await expire_now(client, target)  # type: ignore[call-overload]
        assert "ReadWriteLock" in str(info.value)  # the kinds it takes
        with pytest.raises(TypeError, match=r"^name must be"):
            async with hold_elsewhere(client, target):  # type: ignore[call-overload]
                pass
    with pytest.raises(ConfigError, match="slot") as config:
        await expire_now(client, sem, slot=-1)
    assert config.value.argument == "slot"
    with pytest.raises(TypeError, match="slot"):
        await expire_now(client, Lock(client, name), slot=0)  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="permits") as config:
        async with hold_elsewhere(client, sem, permits=0):
            pass
    assert config.value.argument == "permits"
    with pytest.raises(TypeError, match="permits"):
        async with hold_elsewhere(client, rw.read(), permits=1):  # type: ignore[call-overload]
            pass
    assert commands.since(mark).total() == 0


@pytest.fixture(scope="module")
def node_servers(binaries: list[ServerBinary]) -> Iterator[list[RedisServer]]:
    """Three independent servers: a Redlock's nodes."""
    with independent_servers(binaries[0], 3) as started:
        yield started


@pytest.fixture
async def nodes(node_servers: list[RedisServer]) -> AsyncIterator[list[redis.asyncio.Redis]]:
    async with clients_of(node_servers) as clients:
        try:
            yield clients
        finally:
            await quorum_calls_ended(clients)


async def test_hold_elsewhere_a_redlock_on_every_node_or_some(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    redlock = Redlock(nodes, name, ttl=5, prefix="app")
    async with hold_elsewhere(nodes, redlock) as lease:
        assert lease.held
        assert await redlock.try_acquire() is None
        info = await redlock.info()
        assert info is not None and info.holder is not None  # a quorum's holder
        assert all(node.holder is not None for node in info.nodes)
    async with hold_elsewhere(nodes, redlock, nodes=[2]), redlock:  # a minority: a quorum free
        pass
    async with hold_elsewhere(nodes, redlock, nodes=[0, 2]):  # a majority
        assert await redlock.try_acquire() is None
    async with redlock:  # released at the block's end
        pass


async def test_expire_now_a_redlock_on_every_node_or_a_minority(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    redlock = Redlock(nodes, name, ttl=scaled(0.6))
    lease = await redlock.acquire()
    assert await expire_now(nodes, redlock, nodes=[1])  # one node of three: still a quorum
    await lease.extend()
    assert lease.held
    assert await expire_now(nodes, redlock)  # every node: not given back at the renewal
    await lost(lease)
    assert not await expire_now(nodes, redlock)  # nothing held now
    async with redlock:  # free again
        pass


async def test_hold_elsewhere_and_expire_now_an_election(
    client: redis.asyncio.Redis, name: str
) -> None:
    election = Election(client, name, ttl=scaled(0.6), identity="here")
    async with hold_elsewhere(client, election) as term:
        assert term.held
        leader = await election.leader()
        assert leader is not None and leader.identity == "elsewhere"
    assert await election.leader() is None  # resigned at the block's end
    mine = await anext(aiter(election.campaign()))
    assert await expire_now(client, election)
    await lost(mine.lease)
    assert await election.leader() is None
    assert not await expire_now(client, election)


async def test_hold_elsewhere_and_expire_now_a_multilock(
    client: redis.asyncio.Redis, name: str
) -> None:
    accounts = MultiLock(client, [f"{name}:1", f"{name}:2"], ttl=scaled(0.6))
    async with hold_elsewhere(client, accounts) as held:
        assert held.held
        assert await accounts.try_acquire() is None
        assert await Lock(client, f"{name}:2").try_acquire() is None  # each name is held
    multi = await accounts.acquire()
    assert await expire_now(client, accounts)
    error = await within(multi.wait_lost(), what="the multi-lease lost")
    assert error is not None and multi.loss_reason is LossReason.NOT_OWNER
    assert not await expire_now(client, accounts)


@pytest.mark.real_only
async def test_the_new_kinds_bad_arguments_fail_before_anything_is_sent(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    other = redis.asyncio.Redis(port=1)  # never connected: nothing may be sent to it
    redlock = Redlock([client, other], name)
    election, accounts = Election(client, name), MultiLock(client, [name])
    mark = commands.mark()
    with pytest.raises(TypeError, match="list of clients"):
        await expire_now(client, redlock)  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="2 clients") as config:
        await expire_now([client], redlock)
    assert config.value.argument == "client"
    for bad in ([], [0, 0], [2], [-1], [True]):
        with pytest.raises(ConfigError, match=r"from 0 to 1") as config:
            async with hold_elsewhere([client, other], redlock, nodes=bad):
                pass
        assert config.value.argument == "nodes"
    for target in (election, accounts):
        with pytest.raises(TypeError, match="nodes applies to a Redlock"):
            await expire_now(client, target, nodes=[0])  # type: ignore[call-overload]
        with pytest.raises(TypeError, match="permits applies to a Semaphore"):
            hold_elsewhere(client, target, permits=1)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="nodes applies to a Redlock"):
        await expire_now(client, name, nodes=[0])  # type: ignore[call-overload]
    assert commands.since(mark).total() == 0
    await other.aclose()
