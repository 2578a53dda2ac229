"""A lease handed over by another process's release: taken at once, renewed before use."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from aiolock import Lease, LeaseLostError, Lock, LossReason
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import RESERVATION_MS, LockKeys
from aiolock._lua.lease import RENEW_HOLDER
from aiolock._lua.lock import ACQUIRE
from aiolock._model.holder import text

from ..conftest import CommandLog
from ..support.servers import server_ms
from ..support.waits import cancelled, within
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
    renewal = proxied.proxy.hold_requests(RENEW_HOLDER.source.encode()[:120])
    try:
        await holder.release()
        lease = await asyncio.wait_for(waiting, 5)
        returned = asyncio.get_running_loop().time()
        await asyncio.wait_for(renewal.wait(), 5)
        # Written before acquire() returned (the proxy, in this loop, reads it a moment
        # later; on a loaded machine up to a few scheduling slices), not by the watchdog a
        # third of the grant's expiry after the registration.
        assert asyncio.get_running_loop().time() - returned < 0.25
        assert lease.remaining() < RESERVATION_MS / 1000, "taken from the grant, unconfirmed"
    finally:
        await proxied.proxy.restore()
    await until(lambda: lease.remaining() > 29, "the renewal confirmed", timeout=10)
    await lease.release()


@pytest.mark.parametrize("held_up", ["lands", "refused"])
async def test_a_grant_to_an_older_registration_is_claimed_by_the_next_waiter(
    proxied: Proxied, name: str, commands: CommandLog, held_up: str
) -> None:
    """A process with two waiters: the head's try (with a new registration) is held up in
    the network; another process's release grants the lock to the older registration,
    the one in Redis; the head is cancelled. The next waiter must claim the grant with an
    acquire, never take it as its lease: the held-up try may have claimed it first.

    - "lands": the held-up try reaches Redis after the grant and claims it (its reply is
      lost), then the head's cancellation gives it back, and the lock is free. A waiter
      that took the older grant as its lease would hold nothing, and let a third party in.
    - "refused": the held-up try reaches Redis only after the head's cancellation aborted
      it (refused); the next waiter claims the grant, keeping its fencing token.

    The grant lasts RESERVATION_MS unless claimed: a run in which it lapsed before the
    steps below could check it (a loaded machine) says nothing, and is run again.
    """
    for attempt in range(3):
        if await _older_registration_scenario(proxied, f"{name}:{attempt}", commands, held_up):
            return
    pytest.fail("the grant lapsed before it could be checked, three times in a row")


async def _older_registration_scenario(
    proxied: Proxied, name: str, commands: CommandLog, held_up: str
) -> bool:
    """One run of the scenario above; False if the grant lapsed before it was checked."""
    keys = LockKeys.build("aiolock", name)
    other = await Lock(proxied.direct, name, ttl=30).acquire()
    lock = Lock(proxied.client, name, ttl=30)
    first = asyncio.create_task(lock.acquire(), name="first")
    second: asyncio.Task[Lease] | None = None
    notifier = runtime_for(proxied.client).notifier
    try:
        await until(lambda: notifier.is_subscribed(keys.channel), "subscribed", timeout=10)
        queue = notifier.queue_for(keys.channel)
        assert queue is not None
        await until(
            lambda: bool(queue.registrations) and not queue.attempting,
            "the head's try answered (queued in Redis)",
            timeout=10,
        )
        (older,) = queue.registrations
        held = proxied.proxy.hold_requests(ACQUIRE.sha.encode())
        if held_up == "lands":
            proxied.proxy.lose_reply_to(ACQUIRE.sha.encode())
        # A notification that the lock may be free (a release that handed it to nobody):
        # the head tries again at once, with a new registration.
        await proxied.direct.publish(keys.channel, "1")
        await within(held.wait(), what="the head's new try, held up")
        assert [r.seq for r in queue.registrations] == [older.seq, older.seq + 1]
        second = asyncio.create_task(lock.acquire(), name="second")
        await until(lambda: len(queue.waiters) == 2, "the second waiter queued", timeout=10)

        granted_ms = await server_ms(proxied.direct)  # the grant is made after this
        await other.release()  # grants the lock to the older registration
        await until(lambda: queue.grant is not None, "the grant heard of", timeout=10)
        grant = queue.grant
        assert grant is not None and grant.registration is older
        if held_up == "lands":
            await proxied.proxy.restore()

            async def claimed_by_the_head() -> bool:
                holder = text(await proxied.direct.hget(keys.lock, "m"))
                return holder.endswith(" first")

            await until(claimed_by_the_head, "the held-up try claimed the grant", timeout=10)
        mark = commands.mark()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(first, what="the head's cancellation")
        if held_up == "refused":
            # Meanwhile the lock is held under the grant: nobody else gets in.
            intruder = await Lock(proxied.direct, name, ttl=30).try_acquire()
            if intruder is not None and await lapsed(proxied, granted_ms):
                await intruder.release()
                return False
            assert intruder is None
            await proxied.proxy.restore()
        lease = await within(second, what="the second waiter's acquire")
        # Held in Redis under the lease's own token, by one holder.
        assert await proxied.direct.hget(keys.lock, "token") == lease.token.encode()
        assert await Lock(proxied.direct, name, ttl=30).try_acquire() is None
        assert commands.since(mark)["EVALSHA acquire"] == 1, "claimed by an acquire"
        if held_up == "refused":
            if lease.fencing_token != grant.fencing_token and await lapsed(proxied, granted_ms):
                await lease.release()
                return False
            assert lease.fencing_token == grant.fencing_token, "the grant was claimed"
        else:
            assert lease.fencing_token > grant.fencing_token, "the grant was given back"
        assert not lease.lost
        await lease.release()
        return True
    finally:
        await proxied.proxy.restore()
        await cancelled(first, second)
        with contextlib.suppress(LeaseLostError):
            await other.release()


async def lapsed(proxied: Proxied, granted_ms: int) -> bool:
    """Whether a grant made after `granted_ms` (server time) may have lapsed by now."""
    return await server_ms(proxied.direct) - granted_ms >= RESERVATION_MS


async def test_a_grant_whose_first_renewal_finds_it_gone_is_lost_at_that_answer(
    proxied: Proxied, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grant lapsed (here: its key deleted) before the grantee's renewal to the full
    ttl arrived: that renewal's answer, "not the owner", loses the lease there and then,
    not at the watchdog's next renewal.

    A grant heard later than half its 0.9 s after the registration (a loaded machine) is
    claimed by an acquire instead, with no such renewal: the run says nothing, and is run
    again."""
    grantee = runtime_for(proxied.client).backend
    run = type(grantee).run
    renewing, answered = asyncio.Event(), asyncio.Event()

    async def gone_first(self: Any, script: Any, keys: Any, args: Any, options: Any) -> Any:
        if self is grantee and options.operation == "renew" and options.by_text:
            renewing.set()
            await proxied.direct.delete(keys[0])  # the grant lapsed meanwhile
            try:
                return await run(self, script, keys, args, options)
            finally:
                answered.set()
        return await run(self, script, keys, args, options)

    monkeypatch.setattr(type(grantee), "run", gone_first)
    for attempt in range(3):
        lease = await _granted(proxied, f"{name}:{attempt}")
        if not renewing.is_set():
            await lease.release()  # claimed by an acquire: no renewal of a grant to check
            continue
        await within(answered.wait(), what="the grant's renewal answered")
        assert lease.lost and lease.loss_reason is LossReason.NOT_OWNER
        with pytest.raises(LeaseLostError):
            await lease.release()
        return
    pytest.fail("the grant was heard too late to be taken, three times in a row")


async def _granted(proxied: Proxied, name: str) -> Lease:
    """A lease of the proxied client's process, granted by a release of the direct one."""
    keys = LockKeys.build("aiolock", name)
    holder = await Lock(proxied.direct, name, ttl=30).acquire()
    waiting = asyncio.create_task(Lock(proxied.client, name, ttl=30).acquire())
    notifier = runtime_for(proxied.client).notifier
    await until(lambda: notifier.is_subscribed(keys.channel), "the waiter subscribed", timeout=10)

    async def queued() -> bool:
        return int(await proxied.direct.zcard(keys.queue)) == 1

    await until(queued, "the waiter queued in Redis", timeout=10)
    await holder.release()
    return await within(waiting, what="the waiter's lease")
