"""An acquire under aiolock's own token whose reply is lost is undone at once.

The acquire reached Redis and took the lock, but its caller never heard: the reply did not
come within the attempt's bound, or the connection broke before it came (and broke again
when the call was sent once more). The token is aiolock's own, so nobody can ever use that
lease: the release with the abort flag runs before the error reaches the caller, and the
lock is free at once, not held for its ttl. (Under the caller's own token it is kept for
the caller's retry: `test_caller_tokens.py`.)
"""

from __future__ import annotations

import asyncio

import pytest

from aiolock import BackendError, Lock
from aiolock._layout import LockKeys
from aiolock._scripts import ACQUIRE, RELEASE

from .test_network_faults import Proxied, proxied, until

__all__ = ("proxied",)  # the fixture, used by name

pytestmark = pytest.mark.real_only

TTL = 30.0
"""The lock's ttl: what a lease nobody owns would cost the others."""

FREED_BOUND = 5.0
"""Longest wait for the lock to be free after the acquire raised: well below the ttl."""


async def free(proxied: Proxied, name: str) -> bool:
    return await proxied.direct.hget(LockKeys.build("aiolock", name).lock, "token") is None


@pytest.mark.parametrize("fault", ["timeout", "reset"])
async def test_an_acquire_whose_reply_is_lost_leaves_the_lock_free(
    proxied: Proxied, name: str, fault: str
) -> None:
    key = LockKeys.build("aiolock", name).lock
    await (await Lock(proxied.client, f"{name}:warm", ttl=TTL).acquire()).release()
    since = asyncio.get_running_loop().time()
    if fault == "timeout":
        # No reply: the attempt's bound (1 s, the caller's timeout) runs out.
        proxied.proxy.lose_reply_to(ACQUIRE.sha.encode())
        timeout = 1.0
    else:
        # The connection is reset as the reply comes; the call is sent once more on a new
        # connection (every script is safe to apply twice), which is reset the same way.
        proxied.proxy.lose_reply_to(ACQUIRE.sha.encode(), reset=True)
        proxied.proxy.lose_reply_to(ACQUIRE.sha.encode(), reset=True)
        timeout = 5.0
    with pytest.raises(BackendError) as info:
        await asyncio.wait_for(Lock(proxied.client, name, ttl=TTL).acquire(timeout=timeout), 15)
    assert info.value.operation == "acquire"
    sent = proxied.proxy.arrived(ACQUIRE.sha.encode(), since=since)
    assert len(sent) == (1 if fault == "timeout" else 2), "the acquire reached Redis"
    await until(lambda: free(proxied, name), "the lock free again", timeout=FREED_BOUND)
    assert proxied.proxy.arrived(RELEASE.sha.encode(), since=since), "the abort was sent"
    assert await proxied.direct.hget(key, "ac") == b"1", "one acquire recorded as aborted"
    # Another process gets it at once.
    lease = await Lock(proxied.direct, name, ttl=TTL).acquire(timeout=0)
    await lease.release()
