"""Read-write locks in `aiolock ls`, `show`, `watch` and `stats`, beside locks and
semaphores, against a real server.

Each client stands for a process (its own wait queues); one waiter per process, so that
each process's queue entry counts one task.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio

from aiolock import Lease, Lock, ReadLock, ReadWriteLock, Semaphore, WriteLock
from aiolock._model.holder import HOST
from aiolock._primitives.rwlock import _RWKeys

from ..support.load import scaled
from ..support.waits import within
from .conftest import Run, eventually, release_all

pytestmark = pytest.mark.real_only

AsyncRunCli = Callable[..., Awaitable[Run]]


async def acquire_as(side: ReadLock | WriteLock, task: str) -> Lease:
    """A lease of `side` acquired by a task named `task` (the name recorded with it)."""
    return await asyncio.create_task(side.acquire(), name=task)


async def wait_in_line(
    client: redis.asyncio.Redis, sides: list[ReadLock | WriteLock], *, writers: bool
) -> list[asyncio.Task[Lease]]:
    """One waiter on each of `sides` (of distinct clients), queued in Redis in that order
    in the writers' or the readers' queue."""
    keys = _RWKeys.build("aiolock", sides[0].lock.name)
    queue = keys.writers[0] if writers else keys.readers[0]
    waiters: list[asyncio.Task[Lease]] = []
    for side in sides:
        waiters.append(asyncio.create_task(side.acquire(), name=f"waiting-{len(waiters)}"))
        count = len(waiters)

        async def queued(count: int = count) -> bool:
            return bool(await client.zcard(queue) == count)

        await eventually(queued, what=f"{count} process(es) queued in Redis")
    return waiters


async def test_ls_lists_rwlocks_beside_locks_and_semaphores(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    """A read-write lock held by three readers with a writer and two readers waiting, one
    held by a writer, a lock and a semaphore."""
    catalog = [ReadWriteLock(client, f"{tag}:catalog", ttl=20) for client in clients]
    leases = [await acquire_as(catalog[i].read(), f"read-{i}") for i in range(3)]
    waiters = await wait_in_line(clients[0], [catalog[3].write()], writers=True)
    # A writer waits: new readers queue behind it.
    waiters += await wait_in_line(clients[0], [catalog[4].read(), catalog[5].read()], writers=False)
    writer = await acquire_as(ReadWriteLock(clients[0], f"{tag}:index", ttl=12).write(), "rebuild")
    leases.append(writer)
    leases.append(await Lock(clients[0], f"{tag}:orders", ttl=10).acquire())
    leases.append(await Semaphore(clients[0], f"{tag}:pool", limit=2, ttl=10).acquire())

    async def rows() -> list[dict[str, Any]]:
        result = await arun("--url", server_url, "ls", f"{tag}:*", "--json")
        assert result.code == 0, result.err
        rows: list[dict[str, Any]] = result.json()
        return rows

    async def queued() -> bool:
        return any(row["readers_waiting"] == 2 for row in await rows())

    try:
        await eventually(queued, what="ls shows the two waiting readers")
        listed = await rows()
        assert [(row["name"], row["kind"]) for row in listed] == [
            (f"{tag}:catalog", "rwlock"),
            (f"{tag}:index", "rwlock"),
            (f"{tag}:orders", "lock"),
            (f"{tag}:pool", "semaphore"),
        ]
        # Every row has the same keys, whatever its kind.
        assert len({tuple(row) for row in listed}) == 1
        read, written, lock, sem = listed
        assert (read["state"], read["held"], read["limit"]) == ("held", 3, None)
        assert (read["writers_waiting"], read["readers_waiting"], read["waiters"]) == (1, 2, 3)
        # No writer: no single holder; the readers are listed, by fencing token.
        assert read["host"] is read["pid"] is read["task"] is read["fencing_token"] is None
        assert read["ttl"] is None
        assert [(r["side"], r["slot"], r["task"]) for r in read["holders"]] == [
            ("read", None, "read-0"),
            ("read", None, "read-1"),
            ("read", None, "read-2"),
        ]
        assert [r["fencing_token"] for r in read["holders"]] == [
            lease.fencing_token for lease in leases[:3]
        ]
        assert all(r["pid"] == os.getpid() and r["ttl"] == 20.0 for r in read["holders"])
        assert read["age"] == max(r["age"] for r in read["holders"])
        assert read["expires_in"] == min(r["expires_in"] for r in read["holders"])

        assert (written["state"], written["held"], written["limit"]) == ("held", 1, None)
        assert (written["host"], written["pid"], written["task"]) == (HOST, os.getpid(), "rebuild")
        assert (written["fencing_token"], written["ttl"]) == (writer.fencing_token, 12.0)
        assert (written["writers_waiting"], written["readers_waiting"]) == (0, 0)
        (lease,) = written["holders"]
        assert (lease["side"], lease["fencing_token"]) == ("write", writer.fencing_token)

        for other in (lock, sem):  # the other kinds: no sides
            assert other["writers_waiting"] is other["readers_waiting"] is None
            assert all(holder["side"] is None for holder in other["holders"])
        assert lock["held"] == 1 and sem["held"] == 1

        table = await arun("--url", server_url, "ls", f"{tag}:*")
        assert table.code == 0, table.err
        lines = table.out.splitlines()
        (line,) = [ln for ln in lines if f"{tag}:catalog" in ln]
        for text in ("rwlock", "3 readers", "3 tasks", f"{HOST}:{os.getpid()}"):
            assert text in line, text
        assert line.split()[-2:] == ["1w", "2r"]  # writers and readers waiting
        (line,) = [ln for ln in lines if f"{tag}:index" in ln]
        for text in ("rwlock", "writer", "rebuild", str(writer.fencing_token), "of 12s"):
            assert text in line, text
        assert line.split()[-2:] == ["0w", "0r"]
        (line,) = [ln for ln in lines if f"{tag}:orders" in ln]
        assert "1/1" in line and line.split()[-1] == "0"

        only = await arun("--url", server_url, "ls", f"{tag}:*", "--kind", "rwlock", "--json")
        assert only.code == 0, only.err
        assert [row["name"] for row in only.json()] == [f"{tag}:catalog", f"{tag}:index"]
        only = await arun("--url", server_url, "ls", f"{tag}:*", "--kind", "lock", "--json")
        assert [row["name"] for row in only.json()] == [f"{tag}:orders"]

        watched = await arun(
            "--url", server_url, "watch", f"{tag}:*", "--json", "--count", "1"
        )  # fmt: skip
        assert watched.code == 0, watched.err
        assert '"kind": "rwlock"' in watched.out and '"readers_waiting": 2' in watched.out
        live = await arun("--url", server_url, "watch", f"{tag}:*", "--count", "1")
        assert "1 lock(s), 1 semaphore(s), 2 rwlock(s), 0 election(s) in use" in live.out
    finally:
        await release_all(leases, waiters)


async def test_show_tells_everything_about_a_rwlock(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    """A writer inside, a writer and two readers waiting; then the readers inside."""
    name = f"{tag}:catalog"
    rws = [ReadWriteLock(client, name, ttl=15, hold_stats=True) for client in clients]
    for side in (rws[0].write(), rws[0].read(), rws[0].read()):  # recorded holds
        async with side:
            pass
    writer = await acquire_as(rws[0].write(), "rebuild")
    waiters = await wait_in_line(clients[0], [rws[1].write()], writers=True)
    readers = await wait_in_line(clients[0], [rws[2].read(), rws[3].read()], writers=False)
    leases = [writer]

    async def shown() -> dict[str, Any]:
        result = await arun("--url", server_url, "show", name, "--json")
        assert result.code == 0, result.err
        return dict(result.json())

    async def queued() -> bool:
        return bool((await shown())["rwlock"]["readers_waiting"] == 2)

    try:
        await eventually(queued, what="show lists the two waiting readers")
        everything = await shown()
        assert everything["name"] == name
        assert everything["lock"] is everything["semaphore"] is None
        rw = everything["rwlock"]
        assert rw["key"] == f"aiolock:rw:{{{name}}}"
        assert (rw["kind"], rw["state"], rw["held"], rw["limit"], rw["free"]) == (
            "rwlock",
            "held",
            1,
            None,
            None,
        )
        holder = rw["holder"]
        assert (holder["fencing_token"], holder["task"], holder["pid"]) == (
            writer.fencing_token,
            "rebuild",
            os.getpid(),
        )
        assert holder["ttl"] == 15.0 and 0 < holder["expires_in"] <= 15
        assert [(h["side"], h["fencing_token"]) for h in rw["holders"]] == [
            ("write", writer.fencing_token)
        ]
        assert rw["last_fencing_token"] == writer.fencing_token
        assert (rw["writers_waiting"], rw["readers_waiting"], rw["waiters"]) == (1, 2, 3)
        assert [e["count"] for e in rw["queue"]] == [1]
        assert [(e["position"], e["count"]) for e in rw["reader_queue"]] == [(1, 1), (2, 1)]
        assert all(not e["expired"] for e in rw["queue"] + rw["reader_queue"])
        assert len(rw["recent_holds_ms"]) == 3
        stats = rw["hold_stats"]
        assert (stats["count"], stats["ttl"], stats["near_ttl"]) == (3, 15.0, False)

        table = await arun("--url", server_url, "show", name)
        assert table.code == 0, table.err
        for text in (
            f"rwlock         {name!r} (key aiolock:rw:{{{name}}})",
            "held by        the writer",
            f"writer         host {HOST}, pid {os.getpid()}, task 'rebuild'",
            f"fencing token  {writer.fencing_token}",
            "ttl            15s, expires in",
            "waiting        1 writer(s), 2 reader(s)",
            "leases: the writer",
            "writers' queue: 1 process(es), 1 waiter(s)",
            "readers' queue: 2 process(es), 2 waiter(s)",
            f"fence counter  {writer.fencing_token} (last token issued)",
            "recent holds: 3,",
        ):
            assert text in table.out, text
        assert "ago)" in table.out.split("acquired", 1)[1].splitlines()[0]  # held for
        (line,) = [ln for ln in table.out.splitlines() if ln.split()[:1] == ["write"]]
        assert line.split()[:5] == [
            "write", HOST, str(os.getpid()), "rebuild", str(writer.fencing_token)
        ]  # fmt: skip
        for entry in rw["queue"] + rw["reader_queue"]:
            assert entry["queue_id"] in table.out

        # The writer leaves: the waiting writer comes first, then both readers at once.
        await leases.pop().release()
        second = await within(waiters.pop(), what="the waiting writer")
        await second.release()
        leases = [await within(reader, what="a waiting reader") for reader in readers]
        readers = []
        rw = (await shown())["rwlock"]
        assert (rw["held"], rw["holder"], rw["waiters"]) == (2, None, 0)
        assert [(h["side"], h["fencing_token"]) for h in rw["holders"]] == [
            ("read", lease.fencing_token) for lease in sorted(leases, key=lambda x: x.fencing_token)
        ]
        table = await arun("--url", server_url, "show", name)
        for text in (
            "held by        2 readers",
            "oldest reader  acquired",
            "leases: 2 readers",
            "writers' queue: empty",
            "readers' queue: empty",
        ):
            assert text in table.out, text
        assert "writer         host" not in table.out
        reader_lines = [ln for ln in table.out.splitlines() if ln.split()[:1] == ["read"]]
        assert len(reader_lines) == 2
        for lease in leases:
            assert any(str(lease.fencing_token) in ln for ln in reader_lines)
    finally:
        await release_all(leases, waiters + readers)


async def test_a_name_that_is_a_lock_a_semaphore_and_a_rwlock(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    name = f"{tag}:shared-name"
    client = clients[0]
    lock = await Lock(client, name, ttl=10).acquire()
    permit = await Semaphore(client, name, limit=2, ttl=10).acquire()
    reader = await ReadWriteLock(client, name, ttl=10).read().acquire()
    try:
        rows = (await arun("--url", server_url, "ls", f"{tag}:*", "--json")).json()
        assert [(row["name"], row["kind"], row["held"]) for row in rows] == [
            (name, "lock", 1),
            (name, "semaphore", 1),
            (name, "rwlock", 1),
        ]
        assert rows[2]["holders"][0]["fencing_token"] == reader.fencing_token

        shown = (await arun("--url", server_url, "show", name, "--json")).json()
        assert shown["rwlock"]["key"] == f"aiolock:rw:{{{name}}}"
        assert shown["rwlock"]["holders"][0]["fencing_token"] == reader.fencing_token
        assert shown["lock"]["holder"]["fencing_token"] == lock.fencing_token
        assert shown["semaphore"]["holders"][0]["fencing_token"] == permit.fencing_token
        # The same keys in each kind's object.
        assert set(shown["lock"]) == set(shown["semaphore"]) == set(shown["rwlock"])

        table = await arun("--url", server_url, "show", name)
        assert table.code == 0, table.err
        assert "is a lock, a semaphore and an rwlock" in table.out
        rw_part = table.out.split(f"rwlock {name!r} ─")[1]
        assert f"rwlock         {name!r} (key aiolock:rw:{{{name}}})" in rw_part
        assert str(reader.fencing_token) in rw_part and str(lock.fencing_token) not in rw_part

        one = await arun("--url", server_url, "show", name, "--kind", "rwlock", "--json")
        assert one.json()["lock"] is one.json()["semaphore"] is None
        assert one.json()["rwlock"]["kind"] == "rwlock"
        text = await arun("--url", server_url, "show", name, "--kind", "rwlock")
        assert text.code == 0, text.err
        assert text.out.startswith("rwlock ") and "semaphore" not in text.out
    finally:
        for lease in (lock, permit, reader):
            await lease.release()


async def test_stats_include_rwlocks_recorded_holds(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    client = clients[0]
    ttl = scaled(0.1)  # judged against 0.1 s below; longer than a loaded machine's stalls
    slow = ReadWriteLock(client, f"{tag}:slow", ttl=ttl, hold_stats=True)
    async with slow.write():
        await asyncio.sleep(ttl * 1.5)  # kept past its ttl by the watchdog
    fast = ReadWriteLock(client, f"{tag}:fast", ttl=5, hold_stats=True)
    for side in (fast.read(), fast.read(), fast.write()):
        async with side:
            pass
    async with Semaphore(client, f"{tag}:sem", limit=2, ttl=5, hold_stats=True):
        pass
    held = await ReadWriteLock(client, f"{tag}:held", ttl=8).read().acquire()
    try:
        result = await arun("--url", server_url, "stats", f"{tag}:*", "--json", "--ttl", "0.1")
        assert result.code == 0, result.err
        rows = result.json()
        assert [(row["name"], row["kind"]) for row in rows] == [
            (f"{tag}:fast", "rwlock"),
            (f"{tag}:held", "rwlock"),
            (f"{tag}:sem", "semaphore"),
            (f"{tag}:slow", "rwlock"),
        ]
        stats = {row["name"]: row for row in rows}
        slow_row = stats[f"{tag}:slow"]  # renewed past its ttl: by design, not flagged
        assert (slow_row["count"], slow_row["over_ttl"], slow_row["near_ttl"]) == (1, 1, False)
        assert stats[f"{tag}:fast"]["count"] == 3
        assert stats[f"{tag}:held"]["ttl"] == 8.0  # held: judged against its reader's ttl

        only = await arun("--url", server_url, "stats", f"{tag}:*", "--kind", "rwlock", "--json")
        assert {row["kind"] for row in only.json()} == {"rwlock"}

        table = await arun("--url", server_url, "stats", f"{tag}:*", "--ttl", "0.1")
        (line,) = [ln for ln in table.out.splitlines() if f"{tag}:slow" in ln]
        assert "rwlock" in line and "renewed (1 past the ttl): fine" in line
    finally:
        await held.release()


async def test_waiters_behind_leases_that_expired_are_listed(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    """Written by hand: the writer's lease expired (no script has run since), a reader's
    process waits, a waiting writer's entry lapsed. What is live stays so for a minute: the
    commands below may take seconds on a loaded machine."""
    name = f"{tag}:stalled"
    keys = _RWKeys.build("aiolock", name)
    client = clients[0]
    seconds, micros = await client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    await client.hset(
        keys.state,
        mapping={"fence": "7", "p:" + "c" * 32: f"1 {now - 5} 7 {now - 1000} 995 web-1 66 job"},
    )
    await client.pexpire(keys.state, 120_000)
    await client.zadd(keys.readers[0], {"r1": 1})
    await client.hset(keys.readers[1], mapping={"r1": f"{now + 60_000} 4 web-2 77"})
    await client.zadd(keys.writers[0], {"w1": 1})
    await client.hset(keys.writers[1], mapping={"w1": f"{now - 1} 1 web-3 88"})
    try:
        (row,) = (await arun("--url", server_url, "ls", f"{tag}:*", "--json")).json()
        assert (row["state"], row["held"], row["holders"], row["host"]) == ("free", 0, [], None)
        assert (row["writers_waiting"], row["readers_waiting"], row["waiters"]) == (0, 4, 4)
        listed = (await arun("--url", server_url, "ls", f"{tag}:*")).out
        (line,) = [ln for ln in listed.splitlines() if name in ln]
        assert "free" in line and "(none)" in line and line.split()[-2:] == ["0w", "4r"]
        table = (await arun("--url", server_url, "show", name)).out
        assert "held by        nobody" in table and "web-1" not in table
        assert "writers' queue: 0 process(es), 0 waiter(s)" in table  # one lapsed entry
        assert "expired" in table
        assert "readers' queue: 1 process(es), 4 waiter(s)" in table
    finally:
        await client.delete(keys.state, *keys.writers, *keys.readers)
