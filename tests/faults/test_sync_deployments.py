"""aiolock.sync over a Sentinel's `master_for` client, a `RedisCluster` and a valkey-py
client: the twin is of the same kind, a sync lease is renewed past its ttl there, and it
excludes an asyncio holder of the name. (The sync calls go through a thread, as they must
from async code.)"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.cluster
import redis.sentinel
import valkey
import valkey.asyncio

import aiolock
import aiolock.sync
from aiolock.sync import _clients

from ..deployments.cluster import ClusterGroup
from ..deployments.sentinel import SERVICE, SentinelGroup, closing
from ..support.load import scaled
from ..support.servers import ServerBinary

pytestmark = pytest.mark.real_only


async def excludes_an_async_holder(sync_client: Any, async_client: Any, name: str) -> None:
    """A sync lease, renewed past its ttl, keeps an asyncio holder out; released, the
    asyncio side gets the next fencing token."""
    ttl = scaled(0.6)
    lock = aiolock.sync.Lock(sync_client, name, ttl=ttl)
    lease = await asyncio.to_thread(lock.acquire)
    try:
        await asyncio.to_thread(time.sleep, 2 * ttl)
        await asyncio.to_thread(lease.check)
        assert await aiolock.Lock(async_client, name, ttl=ttl).try_acquire() is None
    finally:
        await asyncio.to_thread(lease.release)
    async with aiolock.Lock(async_client, name, ttl=ttl) as other:
        assert other.fencing_token > lease.fencing_token


async def test_a_sentinel_master_for_client(binaries: list[ServerBinary], name: str) -> None:
    with SentinelGroup(binaries[0]) as group:
        await group.ready()
        sentinel = redis.sentinel.Sentinel(
            [("127.0.0.1", s.port) for s in group.sentinels], socket_timeout=2
        )
        client = sentinel.master_for(SERVICE, socket_timeout=3)
        async_client = group.master_client()
        async with closing(async_client):
            try:
                twin = _clients.twin(client)
                assert isinstance(twin, redis.asyncio.Redis)
                pool = twin.connection_pool
                assert isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool)
                assert pool.service_name == SERVICE and pool.is_master
                assert pool.connection_kwargs["socket_timeout"] == 3
                await excludes_an_async_holder(client, async_client, name)
            finally:
                await asyncio.to_thread(aiolock.sync.shutdown)
                client.close()
                for each in sentinel.sentinels:
                    each.close()


async def test_a_cluster_client(binaries: list[ServerBinary], name: str) -> None:
    with ClusterGroup(binaries[0]) as group:
        await group.create()
        nodes = [
            redis.cluster.ClusterNode("127.0.0.1", s.port)  # type: ignore[no-untyped-call]
            for s in group.servers
        ]
        client = await asyncio.to_thread(redis.RedisCluster, startup_nodes=nodes)
        async_client = group.client()
        try:
            assert isinstance(_clients.twin(client), redis.asyncio.RedisCluster)
            await excludes_an_async_holder(client, async_client, name)
        finally:
            await asyncio.to_thread(aiolock.sync.shutdown)
            client.close()
            await async_client.aclose()


async def test_a_valkey_client(server_url: str, name: str) -> None:
    client = valkey.Valkey.from_url(server_url)
    async_client = redis.asyncio.Redis.from_url(server_url)
    try:
        assert isinstance(_clients.twin(client), valkey.asyncio.Valkey)
        await excludes_an_async_holder(client, async_client, name)
    finally:
        await asyncio.to_thread(aiolock.sync.shutdown)
        client.close()  # type: ignore[no-untyped-call]  # valkey-py ships few types
        await async_client.aclose()
