"""Semaphores in `aiolock ls`, `show`, `watch` and `stats`, beside locks, against a real server.

Each client stands for a process (its own wait queue); one test holds a permit in a
process of its own, for a second pid.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio

from aiolock import Lease, Lock, Semaphore
from aiolock._lua.layout import LockKeys
from aiolock._model.holder import HOST

from ..support.load import scaled
from ..support.servers import server_ms
from ..support.waits import within
from .conftest import Run, eventually, release_all

pytestmark = pytest.mark.real_only

AsyncRunCli = Callable[..., Awaitable[Run]]


def sem_keys(name: str) -> LockKeys:
    return LockKeys.build("aiolock", name, "sem:")


async def acquire_as(semaphore: Semaphore, task: str) -> Lease:
    """A permit acquired by a task named `task` (the name recorded with the permit)."""
    return await asyncio.create_task(semaphore.acquire(), name=task)


async def queue_up(
    client: redis.asyncio.Redis, semaphores: list[Semaphore]
) -> list[asyncio.Task[Lease]]:
    """One waiter in each of `semaphores` (of distinct clients), queued in Redis in that
    order. One waiter per process: a process's entry counts the waiters it had when its
    first waiter last sent it, which later waiters of that process do not update."""
    waiters = []
    for semaphore in semaphores:
        waiters.append(asyncio.create_task(semaphore.acquire()))
        count = len(waiters)

        async def queued(count: int = count, key: str = sem_keys(semaphore.name).queue) -> bool:
            return bool(await client.zcard(key) == count)

        await eventually(queued, what=f"{count} process(es) queued in Redis")
    return waiters


async def test_ls_lists_semaphores_beside_locks(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    """Permits held by three clients, waiters in two, and a lock."""
    name = f"{tag}:partner-api"
    semaphores = [Semaphore(client, name, limit=3, ttl=20) for client in clients]
    first = await acquire_as(semaphores[0], "sync-0")
    await asyncio.sleep(0.25)  # the oldest permit is older than the others by this much
    leases = [first]
    leases += [await acquire_as(semaphores[i], f"sync-{i}") for i in (1, 2)]
    waiters = await queue_up(clients[0], [semaphores[3], semaphores[0]])
    lock = await Lock(clients[0], f"{tag}:orders", ttl=10).acquire()
    leases.append(lock)

    async def rows() -> list[dict[str, Any]]:
        result = await arun("--url", server_url, "ls", f"{tag}:*", "--json")
        assert result.code == 0, result.err
        rows: list[dict[str, Any]] = result.json()
        return rows

    async def queued() -> bool:
        return any(row["kind"] == "semaphore" and row["waiters"] == 2 for row in await rows())

    try:
        await eventually(queued, what="ls shows the two waiters of the semaphore")
        orders, sem = await rows()
        assert (orders["name"], orders["kind"], orders["held"], orders["limit"]) == (
            f"{tag}:orders",
            "lock",
            1,
            1,
        )
        assert orders["fencing_token"] == lock.fencing_token
        assert (sem["name"], sem["kind"], sem["state"]) == (name, "semaphore", "held")
        assert (sem["held"], sem["limit"], sem["waiters"]) == (3, 3, 2)
        # A semaphore's row has no single holder: its permits are listed, by slot.
        assert sem["host"] is sem["pid"] is sem["task"] is sem["fencing_token"] is None
        permits = sem["holders"]
        assert [permit["slot"] for permit in permits] == [0, 1, 2]
        assert [permit["fencing_token"] for permit in permits] == [
            lease.fencing_token for lease in leases[:3]
        ]
        assert [permit["task"] for permit in permits] == ["sync-0", "sync-1", "sync-2"]
        assert all(permit["pid"] == os.getpid() for permit in permits)
        assert all(permit["ttl"] == 20.0 and permit["reserved_for"] is None for permit in permits)
        # The age is the oldest permit's; the ttl left, the permit expiring first.
        assert sem["age"] == max(permit["age"] for permit in permits) == permits[0]["age"]
        assert sem["age"] - permits[1]["age"] >= 0.24  # read at one instant (ms rounding)
        assert sem["expires_in"] == min(permit["expires_in"] for permit in permits)

        table = await arun("--url", server_url, "ls", f"{tag}:*")
        assert table.code == 0
        (sem_line,) = [line for line in table.out.splitlines() if name in line]
        for text in ("semaphore", "3/3", "3 tasks", f"{HOST}:{os.getpid()}"):
            assert text in sem_line, text
        assert sem_line.split()[-1] == "2"  # the waiters
        (lock_line,) = [line for line in table.out.splitlines() if f"{tag}:orders" in line]
        assert "lock" in lock_line and "1/1" in lock_line
        assert str(lock.fencing_token) in lock_line

        only = await arun("--url", server_url, "ls", f"{tag}:*", "--kind", "semaphore", "--json")
        assert [row["name"] for row in only.json()] == [name]
        only = await arun("--url", server_url, "ls", f"{tag}:*", "--kind", "lock", "--json")
        assert [row["name"] for row in only.json()] == [f"{tag}:orders"]

        watched = await arun(
            "--url", server_url, "watch", f"{tag}:*", "--json", "--count", "1"
        )  # fmt: skip
        assert watched.code == 0, watched.err
        assert '"kind": "semaphore"' in watched.out and '"held": 3' in watched.out
    finally:
        await release_all(leases, waiters)


async def test_show_tells_everything_about_a_semaphore(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    name = f"{tag}:exports"
    semaphores = [Semaphore(c, name, limit=3, ttl=15, hold_stats=True) for c in clients]
    for _ in range(4):  # recorded holds
        async with semaphores[0]:
            pass
    leases = [await acquire_as(semaphores[i], f"export-{i}") for i in range(3)]
    # A release that hands its permit to a queued process sets the typical hold.
    handed = asyncio.create_task(semaphores[3].acquire(), name="export-3")

    async def queued_processes(count: int) -> bool:
        return int(await clients[0].zcard(sem_keys(name).queue)) == count

    await eventually(lambda: queued_processes(1), what="a process queued in Redis")
    await leases.pop(0).release()
    leases.append(await within(handed, what="the permit handed over"))
    await eventually(lambda: queued_processes(0), what="the served process out of the queue")
    waiters = await queue_up(clients[0], [semaphores[0], semaphores[1]])

    async def shown() -> dict[str, Any]:
        result = await arun("--url", server_url, "show", name, "--json")
        assert result.code == 0, result.err
        return dict(result.json())

    async def queued() -> bool:
        return bool((await shown())["semaphore"]["waiters"] == 2)

    try:
        await eventually(queued, what="show lists the two waiters")
        everything = await shown()
        assert everything["name"] == name and everything["lock"] is None
        sem = everything["semaphore"]
        assert sem["key"] == f"aiolock:sem:{{{name}}}"
        assert (sem["kind"], sem["state"], sem["limit"], sem["held"], sem["free"]) == (
            "semaphore",
            "held",
            3,
            3,
            0,
        )
        assert sem["holder"] is None and sem["reservation"] is None
        tokens = {lease.slot: lease.fencing_token for lease in leases}
        assert {p["slot"]: p["fencing_token"] for p in sem["holders"]} == tokens
        assert sem["last_fencing_token"] == max(tokens.values())
        for permit in sem["holders"]:
            assert permit["pid"] == os.getpid() and permit["ttl"] == 15.0
            assert 0 < permit["expires_in"] <= 15 and 0 <= permit["age"] < 15
        assert [e["count"] for e in sem["queue"]] == [1, 1]
        assert [e["position"] for e in sem["queue"]] == [1, 2]
        assert all(not e["expired"] and e["expires_in"] > 0 for e in sem["queue"])
        assert sem["typical_hold"] is not None and 0 <= sem["typical_hold"] < 15
        assert len(sem["recent_holds_ms"]) == 5  # 4 + the one handed over
        stats = sem["hold_stats"]
        assert (stats["count"], stats["ttl"], stats["near_ttl"]) == (5, 15.0, False)

        table = await arun("--url", server_url, "show", name)
        assert table.code == 0, table.err
        for text in (
            f"semaphore      {name!r} (key aiolock:sem:{{{name}}})",
            "limit          3 (in force",
            "permits        3 held, 0 free",
            "permits: 3 of 3 held",
            "queue: 2 process(es), 2 waiter(s)",
            f"fence counter  {max(tokens.values())} (last token issued)",
            "recent holds: 5,",
        ):
            assert text in table.out, text
        assert "typical hold   -" not in table.out
        # One line per permit: slot, host, pid, task, fencing token, age, ttl, expires in.
        for lease, task in zip(leases, ("export-1", "export-2", "export-3"), strict=True):
            (line,) = [ln for ln in table.out.splitlines() if f" {task} " in ln]
            cells = line.split()
            assert cells[:5] == [
                str(lease.slot), HOST, str(os.getpid()), task, str(lease.fencing_token)
            ]  # fmt: skip
            assert cells[6] == "15s"
        for entry in sem["queue"]:
            assert entry["queue_id"] in table.out
    finally:
        await release_all(leases, waiters)


HOLDER = """
import asyncio, json, sys
import redis.asyncio
from aiolock import Semaphore

async def main(url: str, name: str) -> None:
    client = redis.asyncio.Redis.from_url(url)
    async with Semaphore(client, name, limit=2, ttl=10) as permit:
        print(json.dumps({"slot": permit.slot, "fencing_token": permit.fencing_token}))
        sys.stdout.flush()
        await asyncio.to_thread(sys.stdin.readline)  # hold until told
    await client.aclose()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""
"""A process holding a permit until a line arrives on its stdin."""


async def test_permits_held_by_two_processes(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    name = f"{tag}:two-pids"
    semaphore = Semaphore(clients[0], name, limit=2, ttl=10)
    mine, handed = [await acquire_as(semaphore, "here") for _ in range(2)]
    other = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, server_url, name,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert other.stdin is not None and other.stdout is not None
    try:

        async def queued() -> bool:
            return bool(await clients[0].zcard(sem_keys(name).queue) == 1)

        # (A new Python process: it may take seconds to start on a loaded machine.)
        await eventually(
            queued, what="the other process queued behind the two permits", timeout=scaled(10.0)
        )
        await handed.release()
        line = await within(other.stdout.readline(), what="the other process's permit")
        acquired = json.loads(line)
        assert acquired["slot"] == 1
        (row,) = (await arun("--url", server_url, "ls", f"{tag}:*", "--json")).json()
        assert (row["held"], row["limit"]) == (2, 2)
        assert [(p["slot"], p["pid"]) for p in row["holders"]] == [
            (0, os.getpid()),
            (1, other.pid),
        ]
        assert row["holders"][1]["fencing_token"] == acquired["fencing_token"]
        table = await arun("--url", server_url, "ls", f"{tag}:*")
        assert "2 processes" in table.out and "2/2" in table.out
        shown = await arun("--url", server_url, "show", name)
        assert f" {other.pid} " in shown.out and f" {os.getpid()} " in shown.out

        other.stdin.write(b"release\n")
        assert await within(other.wait(), what="the other process to release and exit") == 0
        (row,) = (await arun("--url", server_url, "ls", f"{tag}:*", "--json")).json()
        assert [p["pid"] for p in row["holders"]] == [os.getpid()]
        assert "1/2" in (await arun("--url", server_url, "ls", f"{tag}:*")).out
    finally:
        if other.returncode is None:
            other.kill()
            await other.wait()
        await mine.release()


async def test_an_expired_permit_is_not_shown_as_held(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    name = f"{tag}:expiring"
    client = clients[0]
    # Not renewed, and nothing else touches the state: the expired permit stays in the
    # hash (kept alive by the other permit) until the next script reads it.
    loop = asyncio.get_running_loop()
    ttl = scaled(1.0)  # still valid when the next permit is taken, on a loaded machine
    short = await Semaphore(client, name, limit=3, ttl=ttl, renew=False).acquire()
    await asyncio.sleep(ttl * 0.2)
    before_kept = loop.time()
    kept = await Semaphore(client, name, limit=3, ttl=30, renew=False).acquire()
    try:
        await asyncio.sleep(ttl * 0.9)
        assert short.lost  # its ttl is over
        assert await client.hexists(sem_keys(name).lock, f"p:{short.token}")
        (row,) = (await arun("--url", server_url, "ls", f"{tag}:*", "--json")).json()
        assert (row["held"], row["limit"]) == (1, 3)
        assert [p["fencing_token"] for p in row["holders"]] == [kept.fencing_token]
        # The oldest permit's age is the one still valid (the expired one is older).
        assert row["age"] == row["holders"][0]["age"] < loop.time() - before_kept + 0.1
        assert "1/3" in (await arun("--url", server_url, "ls", f"{tag}:*")).out
        sem = (await arun("--url", server_url, "show", name, "--json")).json()["semaphore"]
        assert (sem["held"], sem["free"]) == (1, 2)
        assert [p["fencing_token"] for p in sem["holders"]] == [kept.fencing_token]
        shown = (await arun("--url", server_url, "show", name)).out
        assert str(kept.fencing_token) in shown and str(short.fencing_token) not in shown
        assert "1 held, 2 free" in shown and "permits: 1 of 3 held" in shown
    finally:
        await kept.release()


async def test_a_name_that_is_both_a_lock_and_a_semaphore(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    name = f"{tag}:shared-name"
    client = clients[0]
    lock = await Lock(client, name, ttl=10, hold_stats=True).acquire()
    semaphore = Semaphore(client, name, limit=2, ttl=20, hold_stats=True)
    async with semaphore:
        pass
    permit = await semaphore.acquire()
    try:
        rows = (await arun("--url", server_url, "ls", f"{tag}:*", "--json")).json()
        assert [(row["name"], row["kind"], row["held"], row["limit"]) for row in rows] == [
            (name, "lock", 1, 1),
            (name, "semaphore", 1, 2),
        ]
        assert rows[0]["fencing_token"] == lock.fencing_token
        assert rows[1]["holders"][0]["fencing_token"] == permit.fencing_token

        both = await arun("--url", server_url, "show", name, "--json")
        assert both.code == 0, both.err
        shown = both.json()
        assert shown["lock"]["key"] == f"aiolock:{{{name}}}"
        assert shown["lock"]["holder"]["fencing_token"] == lock.fencing_token
        assert shown["semaphore"]["key"] == f"aiolock:sem:{{{name}}}"
        assert shown["semaphore"]["holders"][0]["fencing_token"] == permit.fencing_token
        assert shown["semaphore"]["limit"] == 2

        table = await arun("--url", server_url, "show", name)
        assert table.code == 0
        assert "is both a lock and a semaphore" in table.out
        lock_part, sem_part = table.out.split(f"semaphore {name!r} ─")
        assert f"lock           {name!r} (key aiolock:{{{name}}})" in lock_part
        assert str(lock.fencing_token) in lock_part and str(permit.fencing_token) not in lock_part
        assert str(permit.fencing_token) in sem_part and str(lock.fencing_token) not in sem_part

        for kind, other in (("lock", "semaphore"), ("semaphore", "lock")):
            one = await arun("--url", server_url, "show", name, "--kind", kind, "--json")
            assert one.json()[other] is None and one.json()[kind]["kind"] == kind
            text = await arun("--url", server_url, "show", name, "--kind", kind)
            assert text.code == 0
            assert text.out.startswith(f"{kind} ") and "is both" not in text.out
            assert f"{other} " not in text.out

        stats = (await arun("--url", server_url, "stats", f"{tag}:*", "--json")).json()
        assert [(row["name"], row["kind"], row["count"]) for row in stats] == [
            (name, "lock", 0),
            (name, "semaphore", 1),
        ]
    finally:
        await lock.release()
        await permit.release()


async def test_stats_include_semaphores_recorded_holds(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    client = clients[0]
    # Judged against a ttl of 0.1 s (--ttl below); the leases' own ttls outlast a loaded
    # machine's stalls (the slow one, renewed, is held past 0.1 s).
    ttl = scaled(0.1)
    slow = Semaphore(client, f"{tag}:slow", limit=2, ttl=ttl, hold_stats=True)
    async with slow:
        await asyncio.sleep(ttl * 1.5)  # kept past its ttl by the watchdog
    fixed = Semaphore(
        client, f"{tag}:fixed", limit=2, ttl=scaled(0.5), renew=False, hold_stats=True
    )
    async with fixed:
        await asyncio.sleep(0.08)  # more than half of the 0.1 s judged against below
    fast = Semaphore(client, f"{tag}:fast", limit=5, ttl=5, hold_stats=True)
    for _ in range(3):
        async with fast:
            pass
    async with Lock(client, f"{tag}:lock", ttl=5, hold_stats=True):
        pass
    held = await Semaphore(client, f"{tag}:held", limit=2, ttl=8).acquire()
    try:
        result = await arun("--url", server_url, "stats", f"{tag}:*", "--json", "--ttl", "0.1")
        assert result.code == 0, result.err
        rows = result.json()
        assert [(row["name"], row["kind"]) for row in rows] == [
            (f"{tag}:fast", "semaphore"),
            (f"{tag}:fixed", "semaphore"),
            (f"{tag}:held", "semaphore"),
            (f"{tag}:lock", "lock"),
            (f"{tag}:slow", "semaphore"),
        ]
        stats = {row["name"]: row for row in rows}
        slow_row = stats[f"{tag}:slow"]
        assert (slow_row["count"], slow_row["over_ttl"], slow_row["near_ttl"]) == (1, 1, False)
        assert slow_row["recommended_ttl"] is None  # renewed: its holds do not set the ttl
        fixed_row = stats[f"{tag}:fixed"]
        assert (fixed_row["fixed"], fixed_row["near_ttl"], fixed_row["recommended_ttl"]) == (
            1, True, 1.0,
        )  # fmt: skip
        fast_row = stats[f"{tag}:fast"]
        assert fast_row["count"] == 3 and fast_row["p50"] <= fast_row["p99"] <= fast_row["max"]
        assert stats[f"{tag}:held"]["ttl"] == 8.0  # held: judged against its permits' ttl
        assert stats[f"{tag}:lock"]["count"] == 1

        sems = await arun("--url", server_url, "stats", f"{tag}:*", "--kind", "semaphore", "--json")
        assert {row["kind"] for row in sems.json()} == {"semaphore"}

        table = await arun("--url", server_url, "stats", f"{tag}:*", "--ttl", "0.1")
        (line,) = [ln for ln in table.out.splitlines() if f"{tag}:slow" in ln]
        assert "semaphore" in line and "renewed (1 past the ttl): fine" in line
        (line,) = [ln for ln in table.out.splitlines() if f"{tag}:fixed" in ln]
        assert "semaphore" in line and "unrenewed holds near the ttl" in line
    finally:
        await held.release()


async def test_a_permit_in_transit_to_a_queued_process(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    """Written by hand, as the scripts leave it: a permit handed over to a queue whose
    process has not claimed it yet, one held in another process, one that expired. What
    is live stays so for a minute: the commands below may take seconds on a loaded
    machine."""
    name = f"{tag}:transit"
    keys = sem_keys(name)
    client = clients[0]
    queue = "5f0e2b9c1d7a4e63"
    now = await server_ms(client)
    await client.hset(
        keys.lock,
        mapping={
            "limit": "4",
            "fence": "1002",
            f"p:q{queue}": f"1 {now + 60_000} 1002 {now - 100} 1000 web-2 77 (reserved)",
            "p:" + "a" * 32: f"0 {now + 90_000} 1001 {now - 2000} 10000 web-1 66 job-7",
            "p:" + "b" * 32: f"2 {now - 1} 999 {now - 900_000} 10000 web-3 88 job-2",  # expired
        },
    )
    await client.pexpire(keys.lock, 120_000)
    await client.zadd(keys.queue, {queue: 1})
    await client.hset(keys.waiters, mapping={queue: f"{now + 60_000} 2 web-2 77"})
    try:
        (row,) = (await arun("--url", server_url, "ls", f"{tag}:*", "--json")).json()
        assert (row["held"], row["limit"], row["waiters"]) == (2, 4, 2)
        assert [(p["slot"], p["reserved_for"]) for p in row["holders"]] == [(0, None), (1, queue)]
        assert 1.9 <= row["age"] < 600  # the oldest live permit's (not the expired one's: 900 s)
        assert 30 < row["expires_in"] <= 60  # the soonest: the reservation (not the 90 s permit)
        line = (await arun("--url", server_url, "ls", f"{tag}:*")).out
        assert "web-1:66" in line and "job-7" in line and "2/4" in line  # one holder, one task
        assert "1001" in line  # its fencing token

        sem = (await arun("--url", server_url, "show", name, "--json")).json()["semaphore"]
        assert (sem["held"], sem["free"], sem["last_fencing_token"]) == (2, 2, 1002)
        assert sem["holders"][1]["task"] == "(reserved)"
        table = (await arun("--url", server_url, "show", name)).out
        assert f"(handed over to queue {queue})" in table
        assert "1 of them handed over to a queued process" in table
        assert "queue: 1 process(es), 2 waiter(s)" in table
        assert "web-3" not in table and "job-2" not in table

        # Only the reservation left: no holder, the permit on its way.
        await client.hdel(keys.lock, "p:" + "a" * 32)
        line = (await arun("--url", server_url, "ls", f"{tag}:*")).out
        assert "(handed over)" in line and "1/4" in line
    finally:
        await client.delete(keys.lock, keys.queue, keys.waiters)


async def test_a_lowered_limit_below_the_permits_held(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    name = f"{tag}:lowered"
    semaphore = Semaphore(clients[0], name, limit=3, ttl=10)
    leases = [await semaphore.acquire() for _ in range(3)]
    try:
        assert await semaphore.set_limit(1) == 3
        sem = (await arun("--url", server_url, "show", name, "--json")).json()["semaphore"]
        assert (sem["limit"], sem["held"], sem["free"]) == (1, 3, 0)
        assert "3/1" in (await arun("--url", server_url, "ls", f"{tag}:*")).out
        table = (await arun("--url", server_url, "show", name)).out
        assert "3 held, 0 free (2 over a lowered limit)" in table
    finally:
        for lease in leases:
            await lease.release()


async def test_waiters_behind_permits_that_expired_are_listed(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    """Written by hand: every permit expired (no script has run since), a process waits.
    What is live stays so for a minute: the commands below may take seconds on a loaded
    machine."""
    name = f"{tag}:stalled"
    keys = sem_keys(name)
    client = clients[0]
    queue = "0c1d2e3f4a5b6c7d"
    now = await server_ms(client)
    await client.hset(
        keys.lock,
        mapping={
            "limit": "1",
            "fence": "5",
            "q": str(now + 90_000),
            "p:" + "c" * 32: f"0 {now - 5} 5 {now - 1000} 995 web-1 66 job-1",
        },
    )
    await client.pexpire(keys.lock, 120_000)
    await client.zadd(keys.queue, {queue: 1})
    await client.hset(keys.waiters, mapping={queue: f"{now + 60_000} 3 web-2 77"})
    try:
        (row,) = (await arun("--url", server_url, "ls", f"{tag}:*", "--json")).json()
        assert (row["state"], row["held"], row["limit"], row["waiters"]) == ("free", 0, 1, 3)
        assert row["holders"] == [] and row["age"] is None and row["expires_in"] is None
        listed = (await arun("--url", server_url, "ls", f"{tag}:*")).out
        (line,) = [ln for ln in listed.splitlines() if name in ln]
        assert "0/1" in line and "(none)" in line and line.split()[-1] == "3"
        table = (await arun("--url", server_url, "show", name)).out
        assert "permits        0 held, 1 free" in table
        assert "queue: 1 process(es), 3 waiter(s)" in table and "web-1" not in table
    finally:
        await client.delete(keys.lock, keys.queue, keys.waiters)


async def test_show_lists_a_lease_of_several_permits_once_with_its_slots(
    server_url: str, tag: str, client: redis.asyncio.Redis, arun: AsyncRunCli
) -> None:
    name = f"{tag}:gpus"
    semaphore = Semaphore(client, name, limit=5, ttl=15)
    big = await asyncio.create_task(semaphore.acquire(permits=3), name="training")
    single = await acquire_as(semaphore, "inference")
    try:
        result = await arun("--url", server_url, "show", name, "--json")
        assert result.code == 0, result.err
        sem = result.json()["semaphore"]
        assert (sem["held"], sem["free"]) == (4, 1)
        assert [(p["task"], p["permits"], p["slots"]) for p in sem["holders"]] == [
            ("training", 3, [0, 1, 2]),
            ("inference", 1, [3]),
        ]
        table = await arun("--url", server_url, "show", name)
        assert table.code == 0, table.err
        assert "permits        4 held by 2 holder(s), 1 free" in table.out
        assert "permits: 4 of 5 held" in table.out
        (line,) = [ln for ln in table.out.splitlines() if " training " in ln]
        assert line.split()[:5] == [
            "0,1,2",
            HOST,
            str(os.getpid()),
            "training",
            str(big.fencing_token),
        ]
    finally:
        await big.release()
        await single.release()
