"""`run_once`: several servers run a job once; no marker after a loss or a failure."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import redis.asyncio

from aiolock import (
    ConfigError,
    Lease,
    LeaseLostError,
    Lock,
    OnceResult,
    OnceStatus,
    run_once,
)
from aiolock._engine.runtime import runtime_for

from ..conftest import CommandLog
from ..support.children import child, finished
from ..support.load import scaled

ROOT = Path(__file__).resolve().parents[2]


def marker_key(job: str) -> str:
    return f"aiolock:{{once:{job}}}:done"


async def test_three_servers_started_apart_run_the_job_once(
    client: redis.asyncio.Redis, name: str
) -> None:
    runs: list[int] = []
    done = [asyncio.Event() for _ in range(3)]

    async def server(index: int) -> OnceResult[int]:
        if index:  # started apart, as cron on three hosts: each after the one before ended
            await done[index - 1].wait()

        async def job() -> int:
            runs.append(index)
            await asyncio.sleep(0.05)
            return index

        try:
            return await run_once(client, name, job, retention=60, ttl=5)
        finally:
            done[index].set()

    async with asyncio.timeout(10):
        results = await asyncio.gather(*(server(i) for i in range(3)))
    assert runs == [0]
    assert [r.status for r in results] == [OnceStatus.RAN] + [OnceStatus.ALREADY_DONE] * 2
    assert results[0].value == 0 and results[0].ran
    assert results[1].marker == results[2].marker == results[0].marker


async def test_with_a_lock_alone_the_same_servers_run_it_three_times(
    client: redis.asyncio.Redis, name: str
) -> None:
    """Why the marker: the lock only keeps the runs apart."""
    runs: list[int] = []

    async def server(index: int) -> None:
        await asyncio.sleep(0.4 * index)
        lease = await Lock(client, name, ttl=5).try_acquire()
        if lease is not None:
            async with lease:
                runs.append(index)

    async with asyncio.timeout(10):
        await asyncio.gather(*(server(i) for i in range(3)))
    assert runs == [0, 1, 2]


@pytest.mark.real_only
@pytest.mark.timeout(240)  # three processes one after another, each within 60 s
async def test_three_server_processes_started_apart_run_the_job_once(
    server_url: str, client: redis.asyncio.Redis, name: str
) -> None:
    log = f"{name}:log"
    argv = ["-m", "tests.usage.once_worker", "--url", server_url, "--job", name, "--log", log]
    async with contextlib.AsyncExitStack() as stack:
        processes = []
        statuses = []
        for index in range(3):
            if index:  # 0.4 s after the one before is done (a loaded machine's start-ups vary)
                await asyncio.sleep(0.4)
            process = await stack.enter_async_context(child("python", *argv))
            processes.append(process)
            out, err = await finished(process, what="a server process", timeout=60)
            assert process.returncode == 0, err.decode()
            statuses.append(json.loads(out)["status"])
    ran = [int(pid) for pid in await client.lrange(log, 0, -1)]
    assert len(ran) == 1, statuses
    assert ran[0] == processes[statuses.index("ran")].pid
    assert sorted(statuses) == ["already_done", "already_done", "ran"]


async def test_a_server_arriving_while_the_job_runs_finds_it_running(
    client: redis.asyncio.Redis, name: str
) -> None:
    started = asyncio.Event()
    finish = asyncio.Event()

    async def job() -> str:
        started.set()
        await finish.wait()
        return "done"

    async with asyncio.timeout(10):
        first = asyncio.create_task(run_once(client, name, job, retention=60, ttl=5))
        await started.wait()
        second = await run_once(client, name, job, retention=60, ttl=5)
        assert second.status is OnceStatus.RUNNING_ELSEWHERE
        assert not second.ran and second.value is None
        waiting = asyncio.create_task(run_once(client, name, job, retention=60, timeout=5))
        channel = f"aiolock:{{once:{name}}}:released"
        while runtime_for(client).notifier.queue_length(channel) == 0:
            await asyncio.sleep(0)  # until it waits in the queue behind the running job
        finish.set()
        assert (await first).status is OnceStatus.RAN
        # It waited for the lock, then found the marker written under it.
        assert (await waiting).status is OnceStatus.ALREADY_DONE


async def test_a_lost_lease_writes_no_marker(client: redis.asyncio.Redis, name: str) -> None:
    written_after_loss: list[str] = []

    async def job() -> None:
        await client.delete(f"aiolock:{{once:{name}}}")  # the lock is taken from us
        await asyncio.sleep(10)  # cancelled at the next renewal
        written_after_loss.append("x")

    with pytest.raises(LeaseLostError):
        await asyncio.wait_for(run_once(client, name, job, retention=60, ttl=scaled(0.3)), 5)
    assert written_after_loss == []
    assert await client.exists(marker_key(name)) == 0
    again = await run_once(client, name, lambda: asyncio.sleep(0, "second"), retention=60)
    assert again.status is OnceStatus.RAN and again.value == "second"


async def test_a_job_that_finishes_after_its_lease_ran_out_writes_no_marker(
    client: redis.asyncio.Redis, name: str
) -> None:
    async def job() -> str:
        time.sleep(0.4)  # the event loop stalls past the 0.3 s lease: it is gone
        return "late"

    await client.ping()  # a connection open: the acquire must be answered within 0.3 s
    with pytest.raises(LeaseLostError):
        await run_once(client, name, job, retention=60, ttl=0.3)
    assert await client.exists(marker_key(name)) == 0


async def test_a_failed_job_writes_no_marker_and_runs_again(
    client: redis.asyncio.Redis, name: str
) -> None:
    async def failing() -> None:
        raise ValueError("the report service is down")

    with pytest.raises(ValueError, match="report service"):
        await run_once(client, name, failing, retention=60)
    assert await client.exists(marker_key(name)) == 0
    assert not await Lock(client, "once:" + name).locked()
    retry = await run_once(client, name, lambda: asyncio.sleep(0, 7), retention=60)
    assert retry.status is OnceStatus.RAN and retry.value == 7


async def test_the_marker_records_the_run_and_expires_after_the_retention(
    client: redis.asyncio.Redis, name: str
) -> None:
    tokens: list[int] = []

    async def job(lease: Lease) -> None:
        tokens.append(lease.fencing_token)

    result = await run_once(client, name, job, retention=30)
    assert result.marker is not None
    assert result.marker.fencing_token == tokens[0]
    assert result.marker.finished_at == pytest.approx(time.time(), abs=5)
    assert 29_000 < await client.pttl(marker_key(name)) <= 30_000
    again = await run_once(client, name, job, retention=30)
    assert again.status is OnceStatus.ALREADY_DONE and again.marker == result.marker
    assert len(tokens) == 1
    await client.delete(marker_key(name))  # as if the retention ran out
    assert (await run_once(client, name, job, retention=30)).ran


@pytest.mark.real_only
async def test_bad_arguments_fail_before_anything_is_sent(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    async def job() -> None: ...

    async def two(a: int, b: int) -> None: ...

    mark = commands.mark()
    with pytest.raises(ConfigError) as info:
        await run_once(client, name, job, retention=0)
    assert info.value.argument == "retention"
    with pytest.raises(ConfigError) as info:
        await run_once(client, "", job, retention=1)
    assert info.value.argument == "job_key"
    with pytest.raises(ConfigError) as info:
        await run_once(client, name, job, retention=1, ttl=-1)
    assert info.value.argument == "ttl"
    with pytest.raises(TypeError, match="job_key must be a str"):
        await run_once(client, b"k", job, retention=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="one"):
        await run_once(client, name, two, retention=1)  # type: ignore[arg-type]
    assert commands.since(mark).total() == 0


@pytest.mark.real_only
async def test_a_job_that_is_not_async_is_refused_before_anything_is_sent(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    """A plain `def` (and any callable that is not async) is refused at the call, naming
    `fn`, with nothing sent: it used to take the lock, run the job, fail on `await` and
    never mark it done, so that every try ran it again."""
    ran: list[str] = []

    def plain() -> int:
        ran.append("plain")
        return 1

    async def job(order: int) -> int:
        ran.append(f"job {order}")
        return order

    class SyncCallable:
        def __call__(self) -> int:
            ran.append("object")
            return 2

    async def agen() -> AsyncIterator[int]:
        yield 1

    mark = commands.mark()
    for fn, what in (
        (plain, "plain function"),
        (SyncCallable(), "SyncCallable"),
        (agen, "function"),
        (functools.partial(plain), "partial"),
        (print, "builtin_function_or_method"),
        ("job", "str"),
    ):
        with pytest.raises(TypeError, match=r"^fn must be an async function") as info:
            await run_once(client, name, fn, retention=60)  # type: ignore[arg-type]
        assert what in str(info.value)
    assert commands.since(mark).total() == 0
    assert ran == []
    assert await client.exists(marker_key(name)) == 0


async def test_async_callables_that_are_not_functions_run_once(
    client: redis.asyncio.Redis, name: str
) -> None:
    """A partial of an async function (nested too), an async method, an object with an
    async `__call__`: each runs, with or without the lease, and is marked done."""
    runs: list[str] = []

    async def job(order: int, lease: Lease) -> str:
        runs.append(f"partial {order} {lease.fencing_token > 0}")
        return "partial"

    class Job:
        async def __call__(self) -> str:
            runs.append("object")
            return "object"

        async def method(self, lease: Lease) -> str:
            runs.append(f"method {lease.fencing_token > 0}")
            return "method"

    cases: list[Callable[..., Awaitable[str]]] = [
        functools.partial(job, 42),
        functools.partial(functools.partial(job), 43),
        Job(),
        Job().method,
    ]
    for index, fn in enumerate(cases):
        result = await run_once(client, f"{name}:{index}", fn, retention=60)
        assert result.ran, result
        again = await run_once(client, f"{name}:{index}", fn, retention=60)
        assert again.status is OnceStatus.ALREADY_DONE
    assert runs == ["partial 42 True", "partial 43 True", "object", "method True"]


async def test_a_lambda_is_called_under_the_lock_and_its_result_checked(
    client: redis.asyncio.Redis, name: str
) -> None:
    """A lambda returning a coroutine runs (`lambda: job(42)`); one returning something
    else did its work when called: `TypeError` naming `fn`, the lock released, no marker."""

    async def job(order: int) -> int:
        return order

    result = await run_once(client, name, lambda: job(42), retention=60)
    assert (result.status, result.value) == (OnceStatus.RAN, 42)
    with pytest.raises(TypeError, match=r"^fn must return an awaitable .* got int"):
        await run_once(client, f"{name}:sync", lambda: 7, retention=60)  # type: ignore[arg-type]
    assert not await Lock(client, f"once:{name}:sync").locked()
    assert await client.exists(marker_key(f"{name}:sync")) == 0
