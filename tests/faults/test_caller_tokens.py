"""An acquire under the caller's own token whose reply is lost stays held under it: the
caller's retry gets the same lease back, never a second one."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from aiolock import BackendError, Lock
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
