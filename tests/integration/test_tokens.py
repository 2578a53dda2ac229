"""The peers' API: a caller's own token, acquire-or-extend, resume and release by token,
extend to a new ttl, force release, and a single try that says why it failed."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
import redis.asyncio

from aiolock import (
    Busy,
    ConfigError,
    EventKind,
    Lease,
    LeaseLostError,
    Lock,
    LockEvent,
    LossReason,
    ReadWriteLock,
    Semaphore,
    add_listener,
)
from aiolock._engine.acquisition import Primitive
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys

from ..conftest import CommandLog
from ..support.load import scaled
from ..support.waits import eventually, within


async def test_a_callers_token_is_the_leases_and_a_retry_gets_it_back(
    client: redis.asyncio.Redis, name: str
) -> None:
    token = secrets.token_hex(16)
    lease = await Lock(client, name, ttl=10).acquire(token=token)
    assert lease.token == token
    await client.pexpire(LockKeys.build("aiolock", name).lock, 5000)  # time passes
    # The same token again, from another Lock object (another process would do the same):
    # the same lease, its expiry reset to the ttl (beyond the 5 s left, however long the
    # calls took): acquire-or-extend.
    again = await Lock(client, name, ttl=10).acquire(token=token, timeout=0)
    try:
        assert (again.token, again.fencing_token) == (token, lease.fencing_token)
        assert await client.pttl(LockKeys.build("aiolock", name).lock) > 5000
    finally:
        await again.release()
        await lease.release()  # one lease under one token: released already, no error


async def test_a_used_token_is_never_granted_twice(client: redis.asyncio.Redis, name: str) -> None:
    token = secrets.token_hex(16)
    lease = await Lock(client, name, ttl=10).acquire(token=token)
    await lease.release()
    with pytest.raises(LeaseLostError, match="never granted twice") as info:
        await Lock(client, name, ttl=10).acquire(token=token)
    assert info.value.reason is LossReason.NOT_OWNER
    assert not await Lock(client, name).locked()


@pytest.mark.parametrize(
    ("token", "error"),
    [
        ("short", ConfigError),
        ("x" * 129, ConfigError),
        ("has space in it..", ConfigError),
        (b"0123456789abcdef", TypeError),
        (1234567890123456, TypeError),
    ],
)
async def test_bad_tokens_are_refused_before_anything_is_sent(
    client: redis.asyncio.Redis, name: str, commands: CommandLog, token: object, error: type
) -> None:
    lock = Lock(client, name, ttl=10)
    mark = commands.mark()
    with pytest.raises(error, match="token"):
        await lock.acquire(token=token)  # type: ignore[arg-type]
    with pytest.raises(error, match="token"):
        await lock.resume(token)  # type: ignore[arg-type]
    with pytest.raises(error, match="token"):
        await lock.release_token(token)  # type: ignore[arg-type]
    assert commands.since(mark) == {}


async def test_another_process_resumes_or_releases_a_lease_by_its_token(
    client: redis.asyncio.Redis, name: str, backend_kind: str, request: pytest.FixtureRequest
) -> None:
    token = secrets.token_hex(16)
    ttl = scaled(2.0)  # (the leases must outlive the machine's stalls until released)
    first = await Lock(client, name, ttl=ttl).acquire(token=token)
    # "Another process": a lease object of its own under the same token, renewed from here.
    taken = await Lock(client, name, ttl=ttl).resume(token)
    assert (taken.token, taken.fencing_token) == (token, first.fencing_token)
    renewed = asyncio.Event()
    remove = add_listener(
        lambda e: (
            renewed.set()
            if e.kind is EventKind.RENEWED and e.fencing_token == taken.fencing_token
            else None
        )
    )
    try:
        await asyncio.wait_for(renewed.wait(), scaled(5.0))
    finally:
        remove()
    waiter = asyncio.create_task(Lock(client, name, ttl=ttl).acquire(timeout=10))
    await asyncio.sleep(0.05)
    assert await Lock(client, name).release_token(token) is True  # and the waiter is served
    successor = await asyncio.wait_for(waiter, 10)
    assert successor.fencing_token > first.fencing_token
    assert await Lock(client, name).release_token(token) is True  # idempotent
    assert await Lock(client, name).release_token(secrets.token_hex(16)) is False
    with pytest.raises(LeaseLostError):
        await Lock(client, name).resume(token)
    await successor.release()
    # The lease objects under the released token find it at their next renewal.
    for lease in (first, taken):
        loss = await within(lease.wait_lost(), what="the loss found by the renewal")
        assert loss is not None and loss.reason is LossReason.NOT_OWNER
        with pytest.raises(LeaseLostError):
            await lease.release()


async def test_resume_resets_the_keys_expiry(client: redis.asyncio.Redis, name: str) -> None:
    """A lease taken up by its token is valid for the ttl from then on, before its first
    renewal: its key's expiry, however short it had become, is reset to the ttl."""
    key = LockKeys.build("aiolock", name).lock
    token = secrets.token_hex(16)
    first = await Lock(client, name, ttl=10).acquire(token=token)
    await client.pexpire(key, 300)  # time passed: 0.3 s of it left
    taken = await Lock(client, name, ttl=10).resume(token)
    assert await client.pttl(key) > 9000
    assert taken.remaining() > 9
    await taken.release()
    await first.release()  # released already, by the same token


async def test_a_release_by_token_serves_a_waiter_of_this_process_at_once(
    client: redis.asyncio.Redis, name: str
) -> None:
    # The release joins this process's wait queue and grants to it straight away: the
    # waiter takes that grant at once, not when it lapses (the ttl) or a poll comes round.
    ttl = 30.0
    token = secrets.token_hex(16)
    holder = await Lock(client, name, ttl=ttl).acquire(token=token)
    waiter = asyncio.create_task(Lock(client, name, ttl=ttl).acquire(timeout=2 * ttl))
    try:

        async def queued() -> bool:
            info = await Lock(client, name).info()
            return info is not None and info.waiting == 1

        await eventually(queued, what="the waiter queued in Redis")
        assert await Lock(client, name).release_token(token) is True
        successor = await within(
            asyncio.shield(waiter),
            what="the waiter served by the release by token",
            timeout=ttl / 3,
        )
        assert successor.fencing_token > holder.fencing_token
        await successor.release()
    finally:
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
    await holder.release()  # released already, by its token: not an error


async def test_extend_to_a_new_ttl(client: redis.asyncio.Redis, name: str) -> None:
    key = LockKeys.build("aiolock", name).lock
    lease = await Lock(client, name, ttl=5).acquire()
    await lease.extend(ttl=60)
    assert 59_000 < await client.pttl(key) <= 60_000
    assert lease.remaining() > 59
    # Shorter than the renewal interval it had (5 / 3 s): renewed often enough to live.
    await lease.extend(ttl=0.6)
    assert await client.pttl(key) <= 600
    await asyncio.sleep(1.5)
    assert lease.held, "renewed to the new ttl, at a third of it"
    assert 0 < await client.pttl(key) <= 600
    with pytest.raises(ConfigError, match="ttl"):
        await lease.extend(ttl=0)
    await lease.release()


async def test_extend_to_a_longer_ttl_counts_a_shorter_renewal_still_in_flight(
    client: redis.asyncio.Redis, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog's renewal to the old ttl is on its way when `extend(ttl=10)` is
    answered: Redis may apply it last, leaving the key the old ttl to live. Until it is
    answered, the lease counts on no more than that; once it is, the lease is renewed to
    the new ttl from then on."""
    backend = runtime_for(client).backend
    run = type(backend).run
    on_its_way, land = asyncio.Event(), asyncio.Event()

    async def renewal_held(self: Any, script: Any, keys: Any, args: Any, options: Any) -> Any:
        if self is backend and options.operation == "renew" and not land.is_set():
            on_its_way.set()
            await within(land.wait(), what="the test to let the renewal land")
        return await run(self, script, keys, args, options)

    monkeypatch.setattr(type(backend), "run", renewal_held)
    loop = asyncio.get_running_loop()
    ttl = scaled(1.0)
    lease = await Lock(client, name, ttl=ttl).acquire()
    try:
        await within(on_its_way.wait(), what="the watchdog's renewal on its way")
        await lease.extend(ttl=10)
        assert lease.deadline <= loop.time() + ttl, "past what the renewal in flight allows"
    finally:
        land.set()
    await eventually(
        lambda: lease.remaining() > 5 or lease.lost, what=f"renewed to the new ttl ({lease})"
    )
    assert not lease.lost, f"lost once the renewal in flight was answered: {lease.loss_reason}"
    await lease.release()


async def test_force_release_evicts_the_holder_from_code(
    client: redis.asyncio.Redis, name: str
) -> None:
    lock = Lock(client, name, ttl=10)
    assert await lock.force_release() is None  # nothing held
    lease = await lock.acquire()
    evicted = await Lock(client, name).force_release()
    assert evicted is not None and evicted.fencing_token == lease.fencing_token
    assert not await lock.locked()
    with pytest.raises(LeaseLostError) as info:
        await lease.extend()
    assert info.value.reason is LossReason.NOT_OWNER


async def test_a_single_try_says_why_it_failed(client: redis.asyncio.Redis, name: str) -> None:
    lock = Lock(client, name, ttl=10)
    lease = await lock.try_acquire_or_busy()
    assert isinstance(lease, Lease)
    busy = await lock.try_acquire_or_busy()
    assert isinstance(busy, Busy)
    assert busy.holder is not None and busy.holder.fencing_token == lease.fencing_token
    assert busy.retry_after is not None and 9 < busy.retry_after <= 10  # the key's ttl
    await lease.release()


async def test_the_retry_hint_follows_the_typical_hold_once_known(
    client: redis.asyncio.Redis, name: str
) -> None:
    """Releases that hand the lock on record how long it was held: the hint is what is
    left of that, not the (renewed) key's ttl."""
    lock = Lock(client, name, ttl=30)
    for _ in range(3):
        holder = await lock.acquire()
        waiter = asyncio.create_task(lock.acquire(timeout=10))
        await asyncio.sleep(0.1)  # a hold of about 0.1 s, with a waiter
        await holder.release()
        await (await asyncio.wait_for(waiter, 10)).release()
    held = await lock.acquire()
    busy = await lock.try_acquire_or_busy()
    assert isinstance(busy, Busy) and busy.retry_after is not None
    assert busy.retry_after < 1, f"hint {busy.retry_after}s: not from the typical hold"
    await held.release()


async def test_a_single_try_learns_the_typical_hold_from_holds_it_was_refused_during(
    client: redis.asyncio.Redis, name: str
) -> None:
    """Callers that never wait (one try each) still teach the lock how long it is held:
    a release whose hold refused a try records it, and the next refusal's hint is what is
    left of that hold (about 1.5 s here), not the key's ttl (30 s)."""
    lock = Lock(client, name, ttl=30)
    loop = asyncio.get_running_loop()
    started = loop.time()
    holder = await lock.acquire()
    assert isinstance(await lock.try_acquire_or_busy(), Busy)  # nothing known: the ttl
    await asyncio.sleep(1.5)  # a long hold
    await holder.release()
    # At least the hold Redis recorded (from the acquire's arrival to the release's),
    # however late the sleep ended on a loaded machine.
    longest = loop.time() - started
    holder = await lock.acquire()
    busy = await lock.try_acquire_or_busy()
    assert isinstance(busy, Busy) and busy.retry_after is not None
    assert busy.retry_after <= longest + 0.01, f"hint {busy.retry_after}s: not the typical hold"
    assert busy.retry_after > 0.1 or holder.held_for() > 1.0  # what is left of it
    await holder.release()


def test_a_busy_describes_itself() -> None:
    busy = Busy(name="n", holder=None, retry_after=1.5)
    assert "1.5" in repr(busy)
    assert isinstance(LockEvent, type)


def _expiring(kind: str, client: redis.asyncio.Redis, name: str, ttl: float) -> Primitive:
    """A semaphore of one permit, or the write side of a read-write lock."""
    if kind == "semaphore":
        return Semaphore(client, name, limit=1, ttl=ttl, renew=False)
    return ReadWriteLock(client, name, ttl=ttl, renew=False).write()


@pytest.mark.parametrize("kind", ["semaphore", "write"])
async def test_release_by_token_of_a_lease_that_expired_and_was_passed_on_says_false(
    clients: list[redis.asyncio.Redis], name: str, kind: str
) -> None:
    """Its permit went to a queued waiter when it expired: the hold did not end as the
    token holder's, and releasing by token must say so (as a lock's does)."""
    token = secrets.token_hex(16)
    # (ttl 1 s: the acquire's reply must come within the lease's validity, and a first
    # call on a loaded machine can take longer than 0.3 s)
    expired = await _expiring(kind, clients[0], name, 1.0).acquire(token=token)
    waiter = asyncio.create_task(_expiring(kind, clients[1], name, 10).acquire(timeout=10))
    successor = await within(waiter, what="the waiter served once the lease expired")
    assert expired.lost
    assert await _expiring(kind, clients[2], name, 10).release_token(token) is False
    with pytest.raises(LeaseLostError):
        await expired.release()
    await successor.release()


async def test_release_by_token_of_a_permit_that_expired_unnoticed_says_false(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """Expired, and no command has read the state since (another permit keeps the state's
    key alive): not released by its holder either."""
    other = await Semaphore(clients[1], name, limit=2, ttl=10).acquire()
    token = secrets.token_hex(16)
    await clients[0].ping()  # a connection open: the acquire must be answered within 0.2 s
    expired = await Semaphore(clients[0], name, limit=2, ttl=0.2, renew=False).acquire(token=token)
    await until_lost(expired)
    assert await Semaphore(clients[2], name, limit=2).release_token(token) is False
    assert await Semaphore(clients[2], name, limit=2).release_token(other.token) is True
    assert await Semaphore(clients[2], name, limit=2).release_token(other.token) is True
    with pytest.raises(LeaseLostError):
        await expired.release()
    await other.release()  # released already, by token: not an error


async def until_lost(lease: Lease) -> None:
    await eventually(lambda: lease.lost, what="the lease's loss", interval=0.01)
    # Past the server's expiry too: the acquire's reply came within the lease's validity,
    # so the server applied it before the deadline, and its key expired less than a ttl
    # (0.2 s) after the deadline.
    await asyncio.sleep(0.25)
