"""An acquire under the caller's own token whose reply is lost stays held under it: the
caller's retry gets the same lease back, never a second one. And a slow reply past the
caller's timeout: a request for several permits waits the reply window, as one does."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from aiolock import BackendError, Lock, Semaphore
from aiolock._lua.layout import LockKeys
from aiolock._lua.lock import ACQUIRE

from .test_network_faults import Proxied, proxied

__all__ = ("proxied",)  # the fixture, used by name

pytestmark = pytest.mark.real_only


async def test_a_lost_reply_leaves_the_lock_held_for_the_callers_retry(
    proxied: Proxied, name: str
) -> None:
    key = LockKeys.build("aiolock", name).lock
    await (await Lock(proxied.client, f"{name}:warm", ttl=10).acquire()).release()
    token = secrets.token_hex(16)
    # It reaches Redis, its reply is lost; and so are those of the copies a loaded machine
    # may send again within the call's timeout (its reply window passed first).
    for _ in range(3):
        proxied.proxy.lose_reply_to(ACQUIRE.sha.encode())
    with pytest.raises(BackendError):
        await asyncio.wait_for(
            Lock(proxied.client, name, ttl=10).acquire(token=token, timeout=1), 15
        )
    assert proxied.proxy.arrived(ACQUIRE.sha.encode()), "the acquire was sent"
    await proxied.proxy.restore()
    # Not aborted: the lock is held under the caller's token, waiting for its retry.
    assert await proxied.direct.hget(key, "token") == token.encode()
    lease = await Lock(proxied.client, name, ttl=10).acquire(token=token, timeout=0)
    assert lease.token == token
    assert str(lease.fencing_token).encode() == await proxied.direct.hget(key, "fence")
    await lease.release()


async def test_a_request_for_several_permits_gives_redis_the_reply_window_past_its_timeout(
    proxied: Proxied, name: str
) -> None:
    """Each reply 0.2 s late, a request for 2 of 2 free permits with a timeout of 0.1 s:
    its attempt is given the reply window every attempt gets (`reply_timeout`, 1 s), as a
    single permit's is, and takes them. It was given what was left of the timeout (at
    least 0.05 s): "no reply from Redis within 0.1s" (seen on a loaded machine)."""
    semaphore = Semaphore(proxied.client, name, limit=2, ttl=10)
    await (await semaphore.acquire()).release()  # the connections made, the scripts loaded
    proxied.proxy.delay_replies(0.2)
    lease = await asyncio.wait_for(semaphore.acquire(permits=2, timeout=0.1), 15)
    await proxied.proxy.restore()
    assert lease.permits == 2
    await lease.release()
