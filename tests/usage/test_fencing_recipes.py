"""The fenced storage recipes of docs/fencing.md, each with a paused holder and with many
concurrent writers: Redis (`fenced_set`), SQL (SQLite always; PostgreSQL where psycopg
and a server are at hand), an HTTP API (a `Fencing-Token` header) and a directory of
files (a version per token). The code is the examples' own (`fenced_stores`).

The paused holder is a process of its own (`fenced_holder`) whose event loop blocks past
its ttl: its lease expires in Redis, this process takes the lock with a higher token and
writes, then the holder resumes and writes with its older token: refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import secrets
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from aiohttp.test_utils import TestServer

from aiolock import Lock

from ..conftest import make_client
from ..support.children import PIPE, child, finished
from ..support.load import scaled
from .fenced_stores import (
    SYNCHRONOUS,
    Writer,
    example,
    postgres,
    postgres_missing,
    postgres_write,
    write_now,
)

pytestmark = pytest.mark.real_only

KINDS = ("redis", "sqlite", "postgres", "http", "files")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "fencing.md"
EVENT_BOUND = 30.0
"""Hang guard for one line of the holder process (its start imports aiolock, aiohttp...)."""


@pytest.fixture
async def contender(server_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = make_client(server_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(params=KINDS)
async def store(
    request: pytest.FixtureRequest,
    server_url: str,
    contender: redis.asyncio.Redis,
    name: str,
    tmp_path: Path,
) -> AsyncIterator[Writer]:
    """An empty store of each kind (for SQL, the account row 1 with fence 0)."""
    kind = str(request.param)
    if kind == "redis":
        yield Writer(kind, f"{name}:data", client=contender)
    elif kind == "sqlite":
        path = tmp_path / "accounts.sqlite"
        db = sqlite3.connect(path)
        with db:
            db.execute(example("fenced_sql").SCHEMA)
            db.execute("INSERT INTO accounts VALUES (1, 0, 0)")
        db.close()
        yield Writer(kind, str(path))
    elif kind == "postgres":
        missing = postgres_missing()
        if missing is not None:
            pytest.skip(missing)
        schema = f"fence_{secrets.token_hex(6)}"
        with postgres("public") as db:
            db.execute(f"CREATE SCHEMA {schema}")
            db.commit()
        try:
            with postgres(schema) as db:
                db.execute(example("fenced_sql").SCHEMA)
                db.execute("INSERT INTO accounts VALUES (1, 0, 0)")
                db.commit()
            yield Writer(kind, schema)
        finally:
            with postgres("public") as db:
                db.execute(f"DROP SCHEMA {schema} CASCADE")
                db.commit()
    elif kind == "http":
        server = TestServer(example("fenced_http").create_app(server_url))
        await server.start_server()
        writer = Writer(kind, str(server.make_url(f"/documents/{secrets.token_hex(6)}")))
        try:
            yield writer
        finally:
            await writer.close()
            await server.close()
    else:
        yield Writer(kind, str(tmp_path / "files"))


# ------------------------------------------------------------------- a paused holder
async def test_a_paused_holders_late_write_is_refused(
    store: Writer, server_url: str, contender: redis.asyncio.Redis, name: str
) -> None:
    argv = ["--url", server_url, "--name", name, "--ttl", str(scaled(2.0)), "--store", store.kind]
    events: list[dict[str, Any]] = []
    async with child(
        "python", "-m", "tests.usage.fenced_holder", *argv, "--target", store.target, stdin=PIPE
    ) as holder:
        assert holder.stdout is not None and holder.stdin is not None

        async def next_event() -> dict[str, Any]:
            assert holder.stdout is not None
            async with asyncio.timeout(EVENT_BOUND):
                line = await holder.stdout.readline()
            assert line, f"the holder ended early: {events}"
            events.append(json.loads(line))
            assert events[-1]["event"] != "error", events
            return events[-1]

        while (event := await next_event())["event"] != "acquired":
            pass
        old = int(event["fencing_token"])
        # The holder's event loop is blocked: nothing renews its lease, which expires.
        lease = await Lock(contender, name, ttl=10).acquire(timeout=scaled(15))
        try:
            assert lease.fencing_token > old
            assert await store.write(3, lease.fencing_token)
            holder.stdin.write(b"resume\n")
            await holder.stdin.drain()
            out, err = await finished(holder, what="the paused holder")
        finally:
            await lease.release()
    events += [json.loads(line) for line in out.splitlines()]
    kinds = [event["event"] for event in events]
    assert kinds == ["write", "acquired", "resumed", "lost", "write", "exit"], (events, err)
    first, late = events[0], events[4]
    assert (first["label"], first["accepted"]) == ("first", True)
    assert (late["label"], late["fencing_token"]) == ("late", old)
    assert late["accepted"] is False, "the store accepted the late write of a lost lease"
    assert await store.read() == 3


async def test_the_same_holder_writes_again_and_an_older_token_is_refused(store: Writer) -> None:
    token = 1_800_000_000_000_000
    assert await store.write(1, token)
    assert await store.write(2, token)  # the same lease, a second write
    assert not await store.write(3, token - 1)
    assert await store.read() == 2
    assert await store.write(4, token + 1)
    assert await store.read() == 4


# ------------------------------------------------------------------- concurrent writers
WRITERS = 40


def shuffled_tokens(seed: int) -> list[tuple[int, int]]:
    """(value, token) pairs, tokens increasing with the value, in a random order."""
    base = 1_800_000_000_000_000
    pairs = [(value, base + 1000 * value) for value in range(1, WRITERS + 1)]
    random.Random(seed).shuffle(pairs)
    return pairs


async def test_concurrent_writers_never_lose_the_newest(store: Writer) -> None:
    """Forty writers at once, their tokens in a random order: the store ends with the value
    of the highest token, and it accepted that write."""
    pairs = shuffled_tokens(45)
    if store.kind in SYNCHRONOUS:
        results = await asyncio.to_thread(
            in_threads, lambda v, t: write_now(store.kind, store.target, v, t), pairs
        )
    else:
        start = asyncio.Event()

        async def write(value: int, token: int) -> bool:
            await start.wait()
            return await store.write(value, token)

        tasks = [asyncio.create_task(write(value, token)) for value, token in pairs]
        await asyncio.sleep(0)
        start.set()
        results = list(await asyncio.gather(*tasks))
    highest = max(token for _, token in pairs)
    accepted = dict(zip(pairs, results, strict=True))
    assert accepted[(WRITERS, highest)]
    assert await store.read() == WRITERS
    if store.kind == "files":  # every other version was removed, by its writer or the newest
        left = [p.name for p in (Path(store.target) / "document").iterdir()]
        assert left == [f"{highest:020d}"]


def in_threads(write: Callable[[int, int], bool], pairs: list[tuple[int, int]]) -> list[bool]:
    """`write(value, token)` for each pair, one thread each, started together."""
    barrier = threading.Barrier(len(pairs), timeout=30)

    def one(pair: tuple[int, int]) -> bool:
        barrier.wait()
        return write(*pair)

    with ThreadPoolExecutor(max_workers=len(pairs)) as pool:
        return list(pool.map(one, pairs, timeout=60))


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
async def test_concurrent_upserts_create_the_row_once_and_keep_the_newest(
    database: str, tmp_path: Path
) -> None:
    """The UPSERT recipe on a row that does not exist yet: forty writers at once."""
    module = example("fenced_sql")
    pairs = shuffled_tokens(46)
    if database == "sqlite":
        path = tmp_path / "accounts.sqlite"
        with contextlib.closing(sqlite3.connect(path)) as db, db:  # (closed, committed)
            db.execute(module.SCHEMA)

        def write(value: int, token: int) -> bool:
            db = sqlite3.connect(path, timeout=30)
            try:
                return bool(module.fenced_upsert(db, 7, value, token))
            finally:
                db.close()

        results = await asyncio.to_thread(in_threads, write, pairs)
        with contextlib.closing(sqlite3.connect(path)) as db:
            rows = db.execute("SELECT id, balance, fence FROM accounts").fetchall()
    else:
        missing = postgres_missing()
        if missing is not None:
            pytest.skip(missing)
        schema = f"fence_{secrets.token_hex(6)}"
        with postgres("public") as db:
            db.execute(f"CREATE SCHEMA {schema}")
            db.commit()
        try:
            with postgres(schema) as db:
                db.execute(module.SCHEMA)
                db.commit()

            def write(value: int, token: int) -> bool:
                with postgres(schema) as db:
                    return postgres_write(db, module.UPSERT, 7, value, token)

            results = await asyncio.to_thread(in_threads, write, pairs)
            with postgres(schema) as db:
                rows = db.execute("SELECT id, balance, fence FROM accounts").fetchall()
        finally:
            with postgres("public") as db:
                db.execute(f"DROP SCHEMA {schema} CASCADE")
                db.commit()
    highest = max(token for _, token in pairs)
    assert dict(zip(pairs, results, strict=True))[(WRITERS, highest)]
    assert [tuple(row) for row in rows] == [(7, WRITERS, highest)]


def test_the_upsert_takes_the_same_holders_second_write_and_refuses_an_older_token() -> None:
    module = example("fenced_sql")
    db = sqlite3.connect(":memory:")
    try:
        db.execute(module.SCHEMA)
        assert module.fenced_upsert(db, 1, 10, 500)  # created
        assert module.fenced_upsert(db, 1, 20, 500)  # the same lease again
        assert not module.fenced_upsert(db, 1, 30, 499)
        assert db.execute("SELECT balance, fence FROM accounts").fetchall() == [(20, 500)]
    finally:
        db.close()


# ------------------------------------------------------------------- the HTTP API's answers
async def test_the_http_api_refuses_a_write_without_a_usable_token(server_url: str) -> None:
    server = TestServer(example("fenced_http").create_app(server_url))
    await server.start_server()
    try:
        import aiohttp

        url = server.make_url(f"/documents/{secrets.token_hex(6)}")
        async with aiohttp.ClientSession() as session:
            statuses = []
            for headers in ({}, {"Fencing-Token": "x1"}, {"Fencing-Token": str(2**63)}):
                async with session.put(url, data=b"v", headers=headers) as response:
                    statuses.append(response.status)
            async with session.get(url) as response:
                statuses.append(response.status)
            async with session.put(url, data=b"v", headers={"Fencing-Token": "7"}) as response:
                statuses.append(response.status)
            async with session.put(url, data=b"w", headers={"Fencing-Token": "6"}) as response:
                statuses.append(response.status)
            async with session.get(url) as response:
                statuses.append(response.status)
                body, token = await response.read(), response.headers["Fencing-Token"]
    finally:
        await server.close()
    assert statuses == [428, 400, 400, 404, 204, 409, 200]
    assert (body, token) == (b"v", "7")


# ------------------------------------------------------------------- the docs show this code
def test_the_recipes_in_the_docs_are_the_tested_code() -> None:
    """Each code block of docs/fencing.md that follows a `<!-- from examples/X.py -->` line
    is in that example, line for line (the examples run as tests, and these tests use
    their code)."""
    text = DOCS.read_text()
    blocks = re.findall(r"<!-- from (examples/[\w.]+) -->\n```\w*\n(.*?)```", text, re.DOTALL)
    assert len(blocks) >= 6, "the recipes' blocks are marked"
    root = DOCS.parents[1]
    for path, block in blocks:
        source = (root / path).read_text()
        assert block in source, f"a block of docs/fencing.md is not in {path}:\n{block}"
    for name in ("fenced_storage", "fenced_sql", "fenced_http", "fenced_files"):
        assert f"<!-- from examples/{name}.py -->" in text
