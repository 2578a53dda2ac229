"""The core cycle on every server binary available: Redis 7 (PATH), Redis 6.2, Valkey 8."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from aiolock import LeaseLostError, Lock, LossReason

from ..conftest import make_client
from ..support.load import scaled
from ..support.servers import RedisServer, ServerBinary, find_binaries
from ..support.waits import within

pytestmark = pytest.mark.real_only


@pytest.fixture(params=find_binaries(), ids=lambda binary: binary.kind, scope="module")
def versioned_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    binary: ServerBinary = request.param
    server = RedisServer(binary).start()
    try:
        yield server
    finally:
        server.stop()


async def test_core_cycle(versioned_server: RedisServer, name: str) -> None:
    client = make_client(versioned_server.url)
    other = make_client(versioned_server.url)
    try:
        ttl = scaled(0.3)  # renewed on time on a loaded machine
        lock = Lock(client, name, ttl=ttl)
        tokens = []
        async with lock as lease:
            tokens.append(lease.fencing_token)
            waiter = asyncio.create_task(Lock(other, name, ttl=ttl).acquire(timeout=20))
            await asyncio.sleep(ttl * 2)  # renewed twice meanwhile
            assert lease.held
            assert not waiter.done()
        second = await within(waiter, what="the waiter to get the lock")
        tokens.append(second.fencing_token)
        await second.release()

        with pytest.raises(LeaseLostError) as info:
            async with lock as lease:
                tokens.append(lease.fencing_token)
                await other.delete(lock.key)
                await asyncio.sleep(5)
        assert info.value.reason is LossReason.NOT_OWNER
        assert tokens == sorted(set(tokens))
    finally:
        await client.aclose()
        await other.aclose()


async def test_fencing_survives_an_empty_restart(versioned_server: RedisServer, name: str) -> None:
    client = make_client(versioned_server.url)
    try:
        before = await Lock(client, name).acquire()
        await before.release()
        versioned_server.restart_empty()
        await client.connection_pool.disconnect()
        async with Lock(client, name) as after:
            assert after.fencing_token > before.fencing_token
    finally:
        await client.aclose()
