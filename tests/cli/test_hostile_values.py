"""Values read from Redis are printed as text: names, holders and tasks with rich markup,
emoji codes, ANSI escapes, control characters, 10 kB names and bytes that are not UTF-8,
through every command (`ls`, `show`, `watch`, `stats`, `release`), in tables and in JSON,
for every kind.

A name the library accepts is held by the real primitive, by a task named after it; a name
it refuses (10 kB, not UTF-8: only another writer makes those) is written by copying a held
primitive's state hash to that name's key. Either way the holder's host is then rewritten to
a hostile one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import subprocess
import sys
import unicodedata
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio

from aiolock import LeaseLostError, Lock, ReadWriteLock, Semaphore
from aiolock._lua.layout import LockKeys

from ..conftest import make_client
from .conftest import Run

pytestmark = pytest.mark.real_only

AsyncRunCli = Callable[..., Awaitable[Run]]

INFIX = {"lock": "", "semaphore": "sem:", "rwlock": "rw:"}


@dataclass(frozen=True)
class Hostile:
    """A value under test: as written to Redis, and as the tables must show it."""

    id: str
    raw: bytes
    shown: str
    """What a table shows (the start of it, for a value cut short)."""
    api: bool = True
    """Whether the library takes it as a name (else it is written by copying)."""

    @property
    def text(self) -> str:
        """The value as a name on the command line (argv is decoded this way)."""
        return self.raw.decode("utf-8", "surrogateescape")


HOSTILE = [
    Hostile("brackets", b"a[b]", "a[b]"),
    Hostile("closing-tag", b"x[/]", "x[/]"),
    Hostile("bold", b"[bold]loud[/bold]", "[bold]loud[/bold]"),
    Hostile("emoji-code", b"job:ok:done", "job:ok:done"),
    Hostile("ansi", b"\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
    Hostile(
        "controls",
        b"t\tn\nr\rb\x07d\x7fc\xc2\x9bu\xe2\x80\xae",
        "t\\tn\\nr\\rb\\x07d\\x7fc\\x9bu\\u202e",
    ),
    Hostile("10kB", b"n" * 10_000, "n" * 40, api=False),
    Hostile("not-utf8", b"\xff\xfe-bytes", "\\xff\\xfe-bytes", api=False),
]

CONTROLS = (
    {chr(c) for c in range(32) if chr(c) != "\n"}
    | {chr(0x7F)}
    | {chr(c) for c in range(0x80, 0xA0)}
)


def printable(output: str) -> bool:
    """No control character but newlines, no bidirectional override, no lone surrogate."""
    return not any(
        c in CONTROLS or c in "\u202a\u202b\u202c\u202d\u202e" or unicodedata.category(c) == "Cs"
        for c in output
    )


HOST = b"\x1b[2J[bold]evil-host[/]\xff"
HOST_SHOWN = "\\x1b[2J[bold]evil-host[/]"
QUEUE_ID = b"q[/]\x1b[5m\xfe"
QUEUE_SHOWN = "q[/]\\x1b[5m"


@dataclass
class Held:
    name: str
    """The name as the command line takes it."""
    key: str
    """Its state key, as `show --json` says it."""
    task: str
    """The task recorded (the library cuts it to 200 characters)."""
    cleanup: Callable[[], Awaitable[None]]


@pytest.fixture
async def client(server_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = make_client(server_url)
    try:
        yield client
    finally:
        await client.aclose()


async def hold(client: redis.asyncio.Redis, kind: str, tag: str, value: Hostile) -> Held:
    """A `kind` named "<tag>:<value>", held, its holder's host rewritten to `HOST`."""
    raw_name = tag.encode() + b":" + value.raw
    name = raw_name.decode("utf-8", "surrogateescape")
    source = f"{tag}-src" if not value.api else name
    task = value.text if value.api else "copied"
    if kind == "lock":
        primitive: Any = Lock(client, source, ttl=30, hold_stats=True)
    elif kind == "semaphore":
        primitive = Semaphore(client, source, limit=3, ttl=30, hold_stats=True)
    else:
        primitive = ReadWriteLock(client, source, ttl=30, hold_stats=True).write()
    async with primitive:  # one hold recorded, for `stats`
        pass
    lease = await asyncio.create_task(primitive.acquire(), name=task)
    source_key = LockKeys.build("aiolock", source, INFIX[kind]).lock.encode()
    key = b"aiolock:" + INFIX[kind].encode() + b"{" + raw_name + b"}"
    raw: Any = client  # redis-py types the keys of COPY, ZADD and HSET as str
    if not value.api:
        assert await raw.copy(source_key, key)
        assert await raw.copy(source_key + b":holds", key + b":holds")
    await rewrite_host(client, key)
    # A queued process with a hostile queue id and host (entries as the layout writes
    # them: "<expires at, ms> <waiters> <host> <pid>"), expiring with the holder.
    queue, waiters = key + b":queue", key + b":waiters"
    seconds, _ = await client.time()
    expires = int(seconds) * 1000 + 30_000
    await raw.zadd(queue, {QUEUE_ID: 1})
    await raw.hset(waiters, QUEUE_ID, str(expires).encode() + b" 1 " + HOST + b" 4242")
    await client.pexpire(queue, 30_000)
    await client.pexpire(waiters, 30_000)

    async def cleanup() -> None:
        with contextlib.suppress(LeaseLostError):  # `release --force` evicted it
            await lease.release()
        await client.delete(key, key + b":holds", queue, waiters)

    return Held(
        name=name, key=key.decode("utf-8", "surrogateescape"), task=task[:200], cleanup=cleanup
    )


async def rewrite_host(client: redis.asyncio.Redis, key: bytes) -> None:
    """The holders' host in the state hash at `key` becomes `HOST`."""
    fields: dict[bytes, bytes] = await client.hgetall(key)  # type: ignore[assignment]
    for field, value in fields.items():
        if field == b"m":  # a lock's holder: "<host> <pid> <task>"
            await client.hset(key, field, HOST + b" " + value.split(b" ", 1)[1])
        elif field.startswith(b"p:") and not field.startswith(b"p:q"):
            # a lease: "<slot> <expires> <fence> <acquired> <ttl> <host> <pid> <task>"
            parts = value.split(b" ", 6)
            await client.hset(key, field, b" ".join([*parts[:5], HOST, parts[6]]))


def check_table(result: Run, value: Hostile, *, task: str | None = None) -> None:
    assert result.code == 0, result.err
    assert result.err == ""
    assert printable(result.out), ascii(result.out[:500])
    assert value.shown in result.out.replace("\n", "")
    if value.id == "10kB":  # cut short, not 10 kB of folded lines
        assert len(result.out) < 8000, [(len(line), line[:40]) for line in result.out.splitlines()]
    if task is not None:
        assert task in result.out.replace("\n", "")


@pytest.mark.parametrize(
    "case",
    [
        pytest.param((kind, value), id=f"{value.id}-{kind}")
        for value in HOSTILE
        for kind in ("lock", "semaphore", "rwlock")
    ],
)
async def test_every_command_prints_hostile_values_as_text(
    client: redis.asyncio.Redis, server_url: str, tag: str, arun: AsyncRunCli,
    case: tuple[str, Hostile],
) -> None:  # fmt: skip
    kind, value = case
    held = await hold(client, kind, tag, value)
    url = ("--url", server_url)
    try:
        rows = (await arun(*url, "ls", f"{tag}:*", "--json")).json()
        assert [(row["name"], row["kind"]) for row in rows] == [(held.name, kind)]
        (holder,) = rows[0]["holders"]
        assert holder["host"] == HOST.decode(errors="replace")
        check_table(await arun(*url, "ls", f"{tag}:*"), value)

        shown = await arun(*url, "show", held.name, "--kind", kind, "--json")
        assert shown.code == 0, shown.err
        state = shown.json()[kind]
        assert (state["name"], state["key"]) == (held.name, held.key)
        if value.api:
            assert state["holders"][0]["task"] == held.task
        assert state["queue"][0]["host"] == HOST.decode(errors="replace")
        table = await arun(*url, "show", held.name, "--kind", kind)
        check_table(table, value, task=HOST_SHOWN)
        assert QUEUE_SHOWN in table.out
        if value.api and value.id != "10kB":
            shown_task = value.shown if kind != "semaphore" else value.shown[:10]
            assert shown_task in table.out.replace("\n", "")

        watched = await arun(*url, "watch", f"{tag}:*", "--json", "--count", "1")
        assert watched.code == 0, watched.err
        assert [row["name"] for row in watched.json()] == [held.name]
        check_table(await arun(*url, "watch", f"{tag}:*", "--count", "1"), value)

        stats = await arun(*url, "stats", f"{tag}:*", "--json")
        assert stats.code == 0, stats.err
        assert [(row["name"], row["count"]) for row in stats.json()] == [(held.name, 1)]
        check_table(await arun(*url, "stats", f"{tag}:*"), value)

        if kind == "lock":
            released = await arun(*url, "release", held.name, "--force", "--yes")
            check_table(released, value)
            assert "released lock" in released.out
            assert not await client.hexists(held.key.encode("utf-8", "surrogateescape"), "token")
    finally:
        await held.cleanup()


@pytest.mark.parametrize("value", HOSTILE, ids=[value.id for value in HOSTILE])
async def test_release_of_a_hostile_name_in_json(
    client: redis.asyncio.Redis, server_url: str, tag: str, arun: AsyncRunCli, value: Hostile
) -> None:
    held = await hold(client, "lock", tag, value)
    try:
        released = await arun(
            "--url", server_url, "release", held.name, "--force", "--yes", "--json"
        )
        assert released.code == 0, released.err
        reply = released.json()
        assert (reply["name"], reply["outcome"]) == (held.name, "released")
        assert reply["holder"]["host"] == HOST.decode(errors="replace")
    finally:
        await held.cleanup()


@pytest.mark.parametrize("prefix", ["x[/]", "[bold]p", "p:ok:", "p\x1b[31m"])
async def test_hostile_prefix_in_messages(
    server_url: str, tag: str, arun: AsyncRunCli, prefix: str
) -> None:
    """The prefix is the user's, but it is printed in messages too."""
    url = ("--url", server_url, "--prefix", prefix)
    for command, code in (("ls", 0), ("stats", 0), ("show", 1)):  # show: nothing known
        result = await arun(*url, command, f"{tag}:x")
        assert result.code == code, result.err
        assert printable(result.out), ascii(result.out)
        visible = prefix.replace("\x1b", "\\x1b")
        assert f"prefix '{visible}'" in result.out


async def test_doctor_with_a_hostile_prefix_and_user(server_url: str, arun: AsyncRunCli) -> None:
    """`doctor` prints the prefix and the ACL user it was given in its findings (the user's
    check names the prefix where the server can check it, ACL DRYRUN on Redis >= 7, and
    the user alone where it cannot)."""
    for argv, shown in (
        (("--prefix", "x[/]", "doctor"), ("x[/]",)),
        (
            ("--prefix", "x[/]", "doctor", "--acl-user", "[bold]u\x1b[31m"),
            ("[bold]u\\x1b[31m",),  # the escape character shown escaped
        ),
    ):
        result = await arun("--url", server_url, *argv)
        assert result.code in (0, 1), result.err  # 1: a problem found; never a crash
        for text in shown:
            assert text in result.out, result.out
        assert printable(result.out), ascii(result.out)
        assert (await arun("--url", server_url, *argv, "--json")).json()["findings"]


def test_release_asks_with_a_hostile_holder(server_url: str, tag: str) -> None:
    """The confirmation question names the holder as text (a real terminal, answered y)."""
    name = f"{tag}:x[/]\x1b[31m"

    async def acquire() -> tuple[redis.asyncio.Redis, Any]:
        client = make_client(server_url)
        return client, await asyncio.create_task(
            Lock(client, name, ttl=30).acquire(), name="[bold]task[/]"
        )

    runner = asyncio.Runner()  # (its close ends what the lock's client still runs)
    client, lease = runner.run(acquire())
    main_fd, terminal_fd = pty.openpty()
    try:
        os.write(main_fd, b"y\n")
        done = subprocess.run(
            [sys.executable, "-m", "aiolock", "--url", server_url, "release", name, "--force"],
            stdin=terminal_fd, capture_output=True, timeout=60, check=False,
            env={k: v for k, v in os.environ.items() if k != "REDIS_URL"},
        )  # fmt: skip
        out = done.stdout.decode()
        assert done.returncode == 0, done.stderr.decode()
        assert "x[/]\\x1b[31m" in out and "'[bold]task[/]'" in out
        assert "released lock" in out
    finally:
        os.close(main_fd)
        os.close(terminal_fd)
        with contextlib.suppress(LeaseLostError):
            runner.run(lease.release())
        runner.run(client.aclose())
        runner.close()
