"""A lease handed over by another process's release: taken at once, renewed before use."""

from __future__ import annotations

import asyncio

import pytest

from aiolock import Lock
from aiolock._layout import RESERVATION_MS, LockKeys
from aiolock._runtime import runtime_for
from aiolock._scripts import RENEW

from .test_network_faults import Proxied, proxied, until

__all__ = ("proxied",)  # the fixture, used by name

pytestmark = pytest.mark.real_only


async def test_the_grantee_writes_its_first_renewal_and_does_not_wait_for_it(
    proxied: Proxied, name: str
) -> None:
    keys = LockKeys.build("aiolock", name)
    holder = await Lock(proxied.direct, name, ttl=30).acquire()
    waiting = asyncio.create_task(Lock(proxied.client, name, ttl=30).acquire())
    notifier = runtime_for(proxied.client).notifier
    await until(lambda: notifier.is_subscribed(keys.channel), "the waiter subscribed", timeout=10)

    async def queued() -> bool:
        return int(await proxied.direct.zcard(keys.queue)) == 1

    await until(queued, "the waiter queued in Redis", timeout=10)
    # Written (by the script's text), never answered.
    renewal = proxied.proxy.hold_requests(RENEW.source.encode()[:120])
    try:
        await holder.release()
        lease = await asyncio.wait_for(waiting, 5)
        returned = asyncio.get_running_loop().time()
        await asyncio.wait_for(renewal.wait(), 5)
        # Written before acquire() returned (the proxy takes a moment to read it), not by
        # the watchdog a third of the grant's expiry later.
        assert asyncio.get_running_loop().time() - returned < 0.1
        assert lease.remaining() < RESERVATION_MS / 1000, "taken from the grant, unconfirmed"
    finally:
        await proxied.proxy.restore()
    await until(lambda: lease.remaining() > 29, "the renewal confirmed", timeout=10)
    await lease.release()
