"""The fenced stores of docs/fencing.md's recipes, as the tests and their holder process
use them: the code is the examples' own (`examples/fenced_*.py`), loaded from there.

`Writer(kind, target)` writes to one store with a fencing token: "redis" (`fenced_set`,
target a key), "sqlite" (`fenced_update`, target a database file), "postgres" (the same
UPDATE, target a schema, see `postgres_dsn`), "http" (`put_fenced`, target a document's
URL) or "files" (`FencedDirectory`, target its root). `read()` returns what it holds.

PostgreSQL is used where psycopg is installed and a server answers at
`AIOLOCK_TEST_POSTGRES` (a libpq connection string; default: 127.0.0.1:5432, database
`test`, user `postgres`); elsewhere its tests are skipped.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import redis.asyncio

from aiolock import fenced_get, fenced_set

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
POSTGRES = os.environ.get(
    "AIOLOCK_TEST_POSTGRES", "host=127.0.0.1 port=5432 dbname=test user=postgres"
)
CONNECT_BOUND = 3
"""Seconds a PostgreSQL connection may take to open (it is skipped if none is there)."""


@functools.cache
def example(name: str) -> ModuleType:
    """The module of `examples/{name}.py` (imported once)."""
    sys.path.insert(0, str(EXAMPLES))  # for the examples' `_server` helper
    try:
        spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(EXAMPLES))


def pyformat(statement: str) -> str:
    """A statement with `:name` placeholders (sqlite3's) as psycopg writes them."""
    return re.sub(r":(\w+)", r"%(\1)s", statement)


def postgres_dsn() -> str | None:
    """The connection string of a PostgreSQL server that answers, with psycopg installed;
    else None (the reason is in `postgres_missing`)."""
    return POSTGRES if postgres_missing() is None else None


@functools.cache
def postgres_missing() -> str | None:
    """Why PostgreSQL cannot be used here, or None."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed"
    try:
        with psycopg.connect(POSTGRES, connect_timeout=CONNECT_BOUND):
            return None
    except psycopg.Error as error:
        return f"no PostgreSQL server at {POSTGRES!r}: {error}"


@contextlib.contextmanager
def postgres(schema: str) -> Iterator[Any]:
    """A psycopg connection whose tables are those of `schema`."""
    import psycopg

    options = f"-c search_path={schema}"
    with psycopg.connect(POSTGRES, connect_timeout=CONNECT_BOUND, options=options) as db:
        yield db


def postgres_write(db: Any, statement: str, account: int, balance: int, token: int) -> bool:
    """The example's statement (UPDATE or UPSERT) on PostgreSQL, in a transaction."""
    with db.transaction():
        cursor = db.execute(
            pyformat(statement), {"id": account, "balance": balance, "token": token}
        )
    return bool(cursor.rowcount == 1)


SYNCHRONOUS = ("sqlite", "postgres", "files")
"""The stores written by blocking calls (a thread each, to write concurrently)."""


def write_now(kind: str, target: str, value: int, token: int) -> bool:
    """A write to a store of `SYNCHRONOUS`, by a blocking call."""
    if kind == "sqlite":
        db = sqlite3.connect(target, timeout=30)
        try:
            return bool(example("fenced_sql").fenced_update(db, 1, value, token))
        finally:
            db.close()
    if kind == "postgres":
        with postgres(target) as db:
            return postgres_write(db, example("fenced_sql").UPDATE, 1, value, token)
    if kind == "files":
        store = example("fenced_files").FencedDirectory(Path(target))
        return bool(store.write("document", str(value).encode(), token))
    raise ValueError(f"no such store: {kind!r}")


class Writer:
    """Fenced writes of one holder to one store (see the module's docstring)."""

    def __init__(self, kind: str, target: str, *, client: redis.asyncio.Redis | None = None):
        self.kind, self.target, self.client = kind, target, client
        self._session: aiohttp.ClientSession | None = None

    def prepare(self) -> None:
        """Import what the writes need now: not in the middle of a lease."""
        if self.kind in ("sqlite", "postgres"):
            example("fenced_sql")
        elif self.kind in ("http", "files"):
            example(f"fenced_{self.kind}")

    async def write(self, value: int, token: int) -> bool:
        if self.kind == "redis":
            assert self.client is not None
            return await fenced_set(self.client, self.target, value, token)
        if self.kind == "http":
            if self._session is None:
                self._session = aiohttp.ClientSession()
            put_fenced = example("fenced_http").put_fenced
            return bool(await put_fenced(self._session, self.target, str(value).encode(), token))
        return write_now(self.kind, self.target, value, token)

    async def read(self) -> int | None:
        """The value the store holds now."""
        if self.kind == "redis":
            assert self.client is not None
            stored = (await fenced_get(self.client, self.target)).value
            return None if stored is None else int(stored)
        if self.kind == "sqlite":
            db = sqlite3.connect(self.target, timeout=30)
            try:
                row = db.execute("SELECT balance FROM accounts WHERE id = 1").fetchone()
            finally:
                db.close()
            return None if row is None else int(row[0])
        if self.kind == "postgres":
            with postgres(self.target) as db:
                row = db.execute("SELECT balance FROM accounts WHERE id = 1").fetchone()
            return None if row is None else int(row[0])
        if self.kind == "http":
            if self._session is None:
                self._session = aiohttp.ClientSession()
            async with self._session.get(self.target) as response:
                return int(await response.read()) if response.status == 200 else None
        if self.kind == "files":
            store = example("fenced_files").FencedDirectory(Path(self.target))
            data, _ = store.read("document")
            return None if data is None else int(data)
        raise ValueError(f"no such store: {self.kind!r}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
