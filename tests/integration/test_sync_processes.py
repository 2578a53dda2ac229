"""aiolock.sync in a process of its own: a fork, Ctrl-C during an acquire, SIGTERM, the
interpreter's exit (`sync_child.py` runs each scenario; these tests hold the other side)."""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

import pytest
import redis.asyncio

import aiolock

from ..support.children import child, finished
from ..support.waits import BOUND, eventually

pytestmark = pytest.mark.real_only


async def next_event(process: asyncio.subprocess.Process, event: str) -> dict[str, Any]:
    """The child's next line, which must be `event`."""
    assert process.stdout is not None
    async with asyncio.timeout(BOUND * 2):
        line = await process.stdout.readline()
    assert line, f"the child ended before saying {event!r}"
    said: dict[str, Any] = json.loads(line)
    assert said["event"] == event, said
    return said


def scenario(which: str, url: str, name: str) -> tuple[str, ...]:
    return ("python", "-m", "tests.integration.sync_child", which, "--url", url, "--name", name)


@pytest.fixture
async def aclient(server_url: str) -> Any:
    client = redis.asyncio.Redis.from_url(server_url)
    try:
        yield client
    finally:
        await client.aclose()


async def test_a_forked_child_never_holds_its_parents_lease(
    server_url: str, name: str, aclient: redis.asyncio.Redis
) -> None:
    """The child's inherited lease says lost, raises on every use, sends nothing (the
    parent's key keeps its token); a lock object made before the fork works in the child,
    on a background loop of its own; the parent's lease is still held after the child."""
    async with child(*scenario("fork", server_url, name)) as process:
        acquired = await next_event(process, "acquired")
        seen = await next_event(process, "child")
        parent = await next_event(process, "parent")
        await finished(process, what="the fork scenario")
    assert process.returncode == 0
    assert seen["lost"] is True and seen["held"] is False
    for action in ("check", "release", "extend"):
        assert seen[action].startswith("LeaseLostError"), seen
        assert "forked" in seen[action] and "nothing was sent" in seen[action]
    assert seen["with"] == "LeaseLostError"
    assert isinstance(seen["own"], int)
    assert parent == {"event": "parent", "child_status": 0, "held": True}
    assert acquired["fencing_token"] > 0


async def test_ctrl_c_during_an_acquire_leaves_nothing_held_or_queued(
    server_url: str, name: str, aclient: redis.asyncio.Redis
) -> None:
    lock = aiolock.Lock(aclient, name, ttl=30)
    async with (
        lock,
        child(*scenario("interrupt", server_url, name), stdin=asyncio.subprocess.PIPE) as process,
    ):
        await next_event(process, "waiting")

        async def queued() -> bool:
            info = await lock.info()
            return info is not None and info.waiting == 1

        await eventually(queued, what="the child's acquire queued")
        process.send_signal(signal.SIGINT)
        await next_event(process, "interrupted")
        # The child is still alive: what it left is what the give-back did.
        info = await lock.info()
        assert info is not None and info.waiting == 0
        assert process.stdin is not None
        process.stdin.write(b"go\n")
        await finished(process, what="the interrupt scenario")
    # Released by this block: free at once, granted to nobody.
    taken = await lock.try_acquire()
    assert taken is not None
    await taken.release()


async def test_the_interpreters_exit_releases_a_held_lease(
    server_url: str, name: str, aclient: redis.asyncio.Redis
) -> None:
    by_name = server_url.replace("127.0.0.1", "localhost")  # resolved when it connects
    async with child(*scenario("exit", by_name, name)) as process:
        await next_event(process, "acquired")
        await next_event(process, "exit")
        await finished(process, what="the exit scenario")
    assert process.returncode == 0
    taken = await aiolock.Lock(aclient, name, ttl=30).try_acquire()  # not its ttl of 30 s
    assert taken is not None
    await taken.release()


async def test_sigterm_releases_the_lock_then_ends_the_process(
    server_url: str, name: str, aclient: redis.asyncio.Redis
) -> None:
    async with child(*scenario("sigterm", server_url, name)) as process:
        await next_event(process, "acquired")
        process.send_signal(signal.SIGTERM)
        await finished(process, what="the sigterm scenario")
    assert process.returncode == -signal.SIGTERM
    taken = await aiolock.Lock(aclient, name, ttl=30).try_acquire()
    assert taken is not None
    await taken.release()


async def test_gevent_monkey_patching_is_refused_clearly(server_url: str, name: str) -> None:
    """Under gevent's monkey-patching (a Celery -P gevent pool) a sync call says why it
    cannot run, at once, and starts nothing."""
    code = (
        "from gevent import monkey\n"
        "monkey.patch_all()\n"
        "import threading, aiolock.sync\n"
        "try:\n"
        f"    aiolock.sync.Lock({server_url!r}, {name!r}).acquire()\n"
        "except RuntimeError as error:\n"
        "    print(error)\n"
        "print(sorted(t.name for t in threading.enumerate()))\n"
    )
    async with child("python", "-c", code) as process:
        out, err = await finished(process, what="the gevent child")
    assert process.returncode == 0, err.decode()
    said = out.decode()
    assert "does not run under gevent's monkey-patching" in said, said
    assert "aiolock-sync" not in said
