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

from aiolock import BackendError, Lock, Semaphore
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys
from aiolock._lua.lock import ACQUIRE, RELEASE
from aiolock._lua.semaphore import SEM_RELEASE
from aiolock._model.holder import pid

from ..support.waits import within
from .test_network_faults import Proxied, proxied, until

__all__ = ("proxied",)  # the fixture, used by name

pytestmark = pytest.mark.real_only

TTL = 30.0
"""The lock's ttl: what a lease nobody owns would cost the others."""

FREED_BOUND = 5.0
"""Longest wait for the lock to be free after the acquire raised: well below the ttl."""


async def free(proxied: Proxied, name: str) -> bool:
    return await proxied.direct.hget(LockKeys.build("aiolock", name).lock, "token") is None


async def test_an_abort_that_outlasts_the_callers_timeout_still_frees_the_lock(
    proxied: Proxied, name: str
) -> None:
    """The caller's timeout is used up when the acquire's reply is found lost: it waits for
    the abort only a moment, but the abort goes on in the background (for up to a second)
    and frees the lock, here over a new connection that takes 0.4 s to open."""
    await (await Lock(proxied.client, f"{name}:warm", ttl=TTL).acquire()).release()
    since = asyncio.get_running_loop().time()
    proxied.proxy.lose_reply_to(ACQUIRE.sha.encode())
    # The acquire's connection is dropped with its lost reply: the abort needs a new one.
    proxied.proxy.delay_connections(0.4)
    with pytest.raises(BackendError):
        await asyncio.wait_for(Lock(proxied.client, name, ttl=TTL).acquire(timeout=1.0), 15)
    assert proxied.proxy.arrived(ACQUIRE.sha.encode(), since=since), "the acquire reached Redis"
    await until(lambda: free(proxied, name), "the lock free again", timeout=FREED_BOUND)
    assert await proxied.direct.hget(LockKeys.build("aiolock", name).lock, "ac") == b"1"


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


@pytest.mark.parametrize("fault", ["timeout", "reset"])
async def test_a_permit_handed_over_under_a_lost_reply_reaches_the_waiting_task_soon(
    proxied: Proxied, name: str, fault: str
) -> None:
    """A release hands its permit over to a task of the same process (under a token of the
    release's own, while another command of the process puts the queue in line), and its
    reply is lost: the permit, held under a token nobody here took, is given back at once
    (an abort of that token) and reaches the waiting task well before the ttl. Lost by a
    timeout, the release raises; lost by a reset, it is sent again and answers "released
    already" (its first copy's hand-over unknown to the caller)."""
    client = proxied.client
    async with Semaphore(client, f"{name}:warm", limit=1, ttl=TTL):
        pass
    semaphore = Semaphore(client, name, limit=1, ttl=TTL)
    holder = await semaphore.acquire()
    waiter = asyncio.create_task(semaphore.acquire())
    notifier = runtime_for(client).notifier
    channel = semaphore._channel

    def in_line() -> bool:
        queue = notifier.queue_for(channel)
        return (
            queue is not None
            and notifier.is_subscribed(channel)
            and queue.registered
            and not queue.attempting
        )

    try:
        await until(in_line, "the waiting task queued in Redis", timeout=FREED_BOUND)
        queue = notifier.queue_for(channel)
        assert queue is not None
        queue.joining = True  # as if another release of this process put the queue in line
        since = asyncio.get_running_loop().time()
        if fault == "timeout":
            proxied.proxy.lose_reply_to(SEM_RELEASE.sha.encode())
            with pytest.raises(BackendError):
                await holder.release()
        else:
            proxied.proxy.lose_reply_to(SEM_RELEASE.sha.encode(), reset=True)
            await holder.release()
        queue.joining_failed()
        sent = [
            data
            for at, data in proxied.proxy.arrivals
            if at >= since and SEM_RELEASE.sha.encode() in data
        ]
        # (an entry of registration 0: a hand-over's)
        assert sent and f" {pid()} 0 ".encode() in sent[0], "the release carried a hand-over"
        permit = await within(waiter, what="the permit at the waiting task", timeout=FREED_BOUND)
        info = await semaphore.info()
        assert [h.fencing_token for h in info.holders] == [permit.fencing_token]
        await permit.release()
    finally:
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
