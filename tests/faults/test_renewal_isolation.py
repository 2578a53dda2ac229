"""One stuck renewal (or release) must not cost the other leases of the same client.

A connection that a middlebox dropped without a reset hangs whatever is sent on it until
the call's own bound. Each lease's renewal is bounded by that lease's deadline; the other
leases of the client are renewed meanwhile on other connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import warnings
from collections.abc import Iterator

import pytest

from aiolock import EventKind, Lease, Lock, LockEvent, add_listener
from aiolock._engine import lease_issuing as _granting

from ..support.load import scaled
from .test_network_faults import Proxied, proxied, until

__all__ = ("proxied",)  # the fixture, used by name

pytestmark = pytest.mark.real_only


@contextlib.contextmanager
def renewals_of(lease: Lease) -> Iterator[list[int]]:
    """A one-element list counting the confirmed renewals of `lease` while in the block."""
    counter = [0]

    def listener(event: LockEvent) -> None:
        if event.kind is EventKind.RENEWED and event.fencing_token == lease.fencing_token:
            counter[0] += 1

    remove = add_listener(listener)
    try:
        yield counter
    finally:
        remove()


async def test_a_renewal_stuck_on_a_dead_connection_does_not_cost_another_lease(
    proxied: Proxied, name: str
) -> None:
    slow = await Lock(proxied.client, f"{name}:long", ttl=30, renew_interval=0.2).acquire()
    stuck = proxied.proxy.silence_next(slow.token.encode())
    await asyncio.wait_for(stuck.wait(), 5)  # its renewal now waits ~15 s for a reply
    short = await Lock(proxied.client, name, ttl=1.2).acquire()
    try:
        with renewals_of(short) as renewed:
            # Renewed every 0.4 s: five renewals take 2 s, past its 1.2 s ttl.
            await until(lambda: renewed[0] >= 5 or short.lost, "five renewals", timeout=10)
        assert not short.lost, f"the short lease was lost: {short.loss_reason}"
        assert not slow.lost
    finally:
        await short.release()
        await slow.release()


async def test_a_release_stuck_on_a_dead_connection_does_not_cost_another_lease(
    proxied: Proxied, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An abandoned (garbage-collected) lease is released by the scheduler in the
    background; that release hangs (for up to its bound, 1 s, made 5 s here so that the
    short lease's ttl can outlast the stalls of a loaded machine and still be shorter), and
    the other lease is renewed meanwhile."""
    monkeypatch.setattr(_granting, "ABORT_TIMEOUT", 5.0)
    dropped = await Lock(proxied.client, f"{name}:dropped", ttl=30).acquire()
    stuck = proxied.proxy.silence_next(dropped.token.encode())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del dropped
        gc.collect()
    await asyncio.wait_for(stuck.wait(), 5)
    # Taken once the collection is over: it holds the event loop, for seconds on a loaded
    # machine (a worker's heap after many tests), and a lease held then would be lost.
    short = await Lock(proxied.client, name, ttl=scaled(0.6)).acquire()
    try:
        with renewals_of(short) as renewed:
            # Renewed every third of its ttl: five renewals take it past its ttl.
            await until(lambda: renewed[0] >= 5 or short.lost, "five renewals", timeout=10)
        assert not short.lost, f"the short lease was lost: {short.loss_reason}"
    finally:
        await short.release()
