"""An acquire's timeout holds whatever Redis and this process's other tasks are doing.

A timeout is met within the single attempt's minimum reply window (1 s) at most, and no
code path spins: the CPU time an acquire uses while waiting is measured.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from aiolock import AcquireTimeoutError, BackendError, Lock
from aiolock._engine.runtime import runtime_for

from ..conftest import make_client
from ..support.load import scaled
from ..support.servers import RedisServer
from .test_network_faults import until

pytestmark = pytest.mark.real_only

ATTEMPT_WINDOW = 1.0
"""The shortest time an acquire attempt gives Redis to answer (aiolock's own floor)."""

SCHEDULING = 0.3
"""Event-loop and process scheduling allowed on top, on a loaded machine."""

CPU_BOUND = 0.25
"""CPU seconds a waiting acquire may use over its whole timeout (a spin uses all of it)."""

WAIT = 1.0
"""The waiting acquire's timeout: long enough that it still waits, on a loaded machine,
when the release is sent (once it has left, the release has no queue to put in line)."""


@pytest.mark.parametrize("redis_comes_back", [True, False], ids=["thawed", "frozen"])
async def test_a_timeout_holds_while_a_local_release_puts_the_queue_in_line(
    server: RedisServer, name: str, redis_comes_back: bool
) -> None:
    client = make_client(server.url)
    loop = asyncio.get_running_loop()
    lock = Lock(client, name, ttl=10)
    try:
        holder = await lock.acquire()
        wait = scaled(WAIT)
        waiting = asyncio.create_task(lock.acquire(timeout=wait))
        channel = lock.key + ":released"
        notifier = runtime_for(client).notifier
        await until(lambda: notifier.is_subscribed(channel), "the waiter subscribed", timeout=5)
        queue = notifier.queue_for(channel)
        assert queue is not None
        # Its attempt answered: a release puts the queue in line only with no attempt in flight.
        await until(
            lambda: bool(queue.registrations) and not queue.attempting,
            "the waiter queued in Redis",
            timeout=5,
        )
        server.pause()
        paused = True
        try:
            # The holder's release puts the waiter's queue in line, and gets no answer.
            releasing = asyncio.create_task(holder.release())
            await until(lambda: queue.joining, "the release is in flight", timeout=5)
            assert not waiting.done(), "the waiter left before the release: nothing to test"
            started, cpu = loop.time(), time.process_time()
            with pytest.raises(AcquireTimeoutError):
                await asyncio.wait_for(waiting, 10)
            elapsed, used = loop.time() - started, time.process_time() - cpu
            assert elapsed <= wait + ATTEMPT_WINDOW + SCHEDULING, f"acquire ran {elapsed:.2f}s"
            assert used <= CPU_BOUND, f"the waiting acquire spun: {used:.2f}s of CPU"
            if redis_comes_back:
                server.resume()
                paused = False
            if redis_comes_back:
                await asyncio.wait_for(releasing, 10)
            else:
                with pytest.raises(BackendError):  # the key expires by itself
                    await asyncio.wait_for(releasing, 10)
        finally:
            if paused:
                server.resume()
    finally:
        await client.aclose()
