"""Fenced storage in Redis: `fenced_set`, `fenced_get`, `fenced_delete`.

Each test runs on a real server and on fakeredis (its Lua extra), but those marked
`real_only` (round trips counted on the wire, a flushed script cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from aiolock import (
    BackendError,
    ConfigError,
    FencedValue,
    LeaseLostError,
    Lock,
    fenced_delete,
    fenced_get,
    fenced_set,
)
from aiolock._lua.fencing import FENCING_SCRIPTS
from aiolock._ops.acl import _CALLS
from aiolock.testing import expire_now

from ..conftest import CommandLog, make_client

MAX = 2**63 - 1


async def test_a_token_at_least_the_highest_writes_and_a_lower_one_is_refused(
    client: redis.asyncio.Redis, name: str
) -> None:
    key = f"{name}:data"
    assert await fenced_get(client, key) == FencedValue(value=None, fencing_token=0)
    assert await fenced_set(client, key, "first", 10)
    assert await fenced_get(client, key) == FencedValue(value=b"first", fencing_token=10)
    # The same holder writes again with its token: accepted.
    assert await fenced_set(client, key, "again", 10)
    assert await fenced_get(client, key) == FencedValue(value=b"again", fencing_token=10)
    # A superseded holder: refused, nothing changed.
    assert not await fenced_set(client, key, "stale", 9)
    assert await fenced_get(client, key) == FencedValue(value=b"again", fencing_token=10)
    assert await fenced_set(client, key, "newer", 11)
    assert await fenced_get(client, key) == FencedValue(value=b"newer", fencing_token=11)
    # The layout the docs describe: one hash, `value` and `fence`.
    assert await client.hgetall(key) == {b"value": b"newer", b"fence": b"11"}


async def test_the_same_write_applied_twice_gives_the_same_answer(
    client: redis.asyncio.Redis, name: str
) -> None:
    key = f"{name}:data"
    assert await fenced_set(client, key, b"v", 7, ttl=30)
    assert await fenced_set(client, key, b"v", 7, ttl=30)
    assert await fenced_get(client, key) == FencedValue(value=b"v", fencing_token=7)
    assert await fenced_delete(client, key, 8)
    assert await fenced_delete(client, key, 8)
    assert await fenced_get(client, key) == FencedValue(value=None, fencing_token=8)


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        (9, 10),  # as text, "9" > "10": compared as numbers
        (2**53, 2**53 + 1),  # equal as doubles (Lua's numbers): compared exactly
        (10**18, 10**18 + 1),
        (MAX - 1, MAX),
        (999_999_999, 1_000_000_000),
        (1_000_000_000, 1_000_000_001),
        (12_345_678_901, 22_345_678_900),  # the high parts decide
        (0, 1),
    ],
)
async def test_tokens_are_compared_exactly_over_the_whole_range(
    client: redis.asyncio.Redis, name: str, lower: int, higher: int
) -> None:
    key = f"{name}:data"
    assert await fenced_set(client, key, "higher", higher)
    assert not await fenced_set(client, key, "lower", lower)
    assert not await fenced_delete(client, key, lower)
    assert await fenced_get(client, key) == FencedValue(value=b"higher", fencing_token=higher)
    other = f"{name}:other"
    assert await fenced_set(client, other, "lower", lower)
    assert await fenced_set(client, other, "higher", higher)
    assert await fenced_get(client, other) == FencedValue(value=b"higher", fencing_token=higher)


async def test_a_superseded_holders_late_write_is_refused(
    client: redis.asyncio.Redis, name: str
) -> None:
    """Holder A's lease is lost while A is not looking (its key expired); B takes the lock
    and writes; A's write with its older token, arriving after B's, is refused."""
    key = f"{name}:balance"
    lock = Lock(client, name, ttl=10)
    a = await lock.acquire()
    assert await fenced_set(client, key, 100, a.fencing_token)
    assert await expire_now(client, lock)  # as an expiry during A's pause would
    b = await Lock(client, name, ttl=10).acquire(timeout=5)
    try:
        assert b.fencing_token > a.fencing_token
        assert await fenced_set(client, key, 90, b.fencing_token)
        assert not await fenced_set(client, key, 50, a.fencing_token)  # A, late
        assert not await fenced_delete(client, key, a.fencing_token)
    finally:
        await b.release()
        with pytest.raises(LeaseLostError):
            await a.release()  # A learns that its lease was lost
    assert await fenced_get(client, key) == FencedValue(value=b"90", fencing_token=b.fencing_token)


async def test_concurrent_writers_never_lose_the_newest(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """Sixty writers on six connections, their tokens arriving in a random order: the value
    left is the one of the highest token, and every write refused had a token below one
    accepted before it."""
    key = f"{name}:data"
    tokens = list(range(1_000_000, 1_000_060))
    random.Random(45).shuffle(tokens)
    start = asyncio.Event()

    async def write(index: int, token: int) -> tuple[int, bool]:
        await start.wait()
        client = clients[index % len(clients)]
        return token, await fenced_set(client, key, f"written with {token}", token)

    tasks = [asyncio.create_task(write(i, token)) for i, token in enumerate(tokens)]
    await asyncio.sleep(0)
    start.set()
    results = await asyncio.gather(*tasks)
    highest = max(tokens)
    assert dict(results)[highest], "the highest token's write was refused"
    current = await fenced_get(clients[0], key)
    assert current == FencedValue(value=f"written with {highest}".encode(), fencing_token=highest)
    accepted = sorted(token for token, ok in results if ok)
    for token, ok in results:
        if not ok:
            assert token < highest and any(a > token for a in accepted)


async def test_a_cancelled_write_may_have_landed_and_writing_again_is_safe(
    client: redis.asyncio.Redis, name: str
) -> None:
    """Cancelled at various points of its round trip, a write has landed or not; written
    again with the same token, it is accepted, and the value is the one written."""
    key = f"{name}:data"
    before = FencedValue(value=None, fencing_token=0)
    for turns in range(6):
        value, token = f"v{turns}", 10 + turns
        task = asyncio.create_task(fenced_set(client, key, value, token))
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        written = FencedValue(value=value.encode(), fencing_token=token)
        assert await fenced_get(client, key) in (before, written)
        assert await fenced_set(client, key, value, token)
        assert await fenced_get(client, key) == written
        before = written


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        (b"\x00\xff binary", b"\x00\xff binary"),
        (bytearray(b"bytes"), b"bytes"),
        (memoryview(b"view"), b"view"),
        ("text: été", "text: été".encode()),
        ("", b""),
        (42, b"42"),
        (-7, b"-7"),
        (2**70, str(2**70).encode()),
        (0.1, b"0.1"),
        (1e20, b"1e+20"),
    ],
)
async def test_the_value_types_taken_and_how_they_are_stored(
    client: redis.asyncio.Redis, name: str, value: Any, stored: bytes
) -> None:
    key = f"{name}:data"
    assert await fenced_set(client, key, value, 1)
    assert (await fenced_get(client, key)).value == stored


@pytest.mark.parametrize("value", [None, True, False, ["a"], {"a": 1}, object(), 1j])
async def test_other_values_are_refused_naming_the_argument(
    client: redis.asyncio.Redis, name: str, value: object
) -> None:
    with pytest.raises(TypeError, match=r"^value must be bytes .* got \w+; encode it first"):
        await fenced_set(client, f"{name}:data", value, 1)  # type: ignore[arg-type]
    assert not await client.exists(f"{name}:data")


@pytest.mark.parametrize(
    "case",
    [
        ({"fencing_token": -1}, ConfigError, r"fencing_token must be an int from 0 to 2\*\*63"),
        ({"fencing_token": MAX + 1}, ConfigError, r"fencing_token must be an int from 0 to"),
        ({"fencing_token": 1.0}, TypeError, r"^fencing_token must be an int, got float$"),
        ({"fencing_token": "12"}, TypeError, r"^fencing_token must be an int, got str$"),
        ({"fencing_token": True}, TypeError, r"^fencing_token must be an int, got bool$"),
        ({"fencing_token": None}, TypeError, r"^fencing_token must be an int, got NoneType$"),
        ({"key": ""}, ConfigError, r"^key must not be empty$"),
        ({"key": b"k"}, TypeError, r"^key must be a str, got bytes \(decode it first\)$"),
        ({"key": "\ud800"}, ConfigError, r"^key must be encodable as UTF-8"),
        ({"value": "\ud800"}, ConfigError, r"^value must be encodable as UTF-8"),
        ({"ttl": 0}, ConfigError, r"^ttl must be a finite number of seconds from 0.001"),
        ({"ttl": -1}, ConfigError, r"^ttl must be a finite number of seconds"),
        ({"ttl": math.inf}, ConfigError, r"^ttl must be a finite number of seconds"),
        ({"ttl": math.nan}, ConfigError, r"^ttl must be a finite number of seconds"),
        ({"ttl": "10"}, TypeError, r"^ttl must be a number of seconds"),
        ({"timeout": 0}, ConfigError, r"^timeout must be a finite number of seconds"),
        ({"client": object()}, TypeError, r"^client must be a redis.asyncio.Redis"),
    ],
)
async def test_bad_input_is_refused_at_the_call_and_nothing_is_sent(
    client: redis.asyncio.Redis,
    commands: CommandLog,
    name: str,
    case: tuple[dict[str, Any], type[Exception], str],
) -> None:
    call, error, message = case
    key = f"{name}:data"
    arguments: dict[str, Any] = {"client": client, "key": key, "value": "v", "fencing_token": 1}
    arguments.update(call)
    mark = commands.mark()
    with pytest.raises(error, match=message) as raised:
        await fenced_set(**arguments)
    assert not commands.since(mark)
    if isinstance(raised.value, ConfigError):
        assert raised.value.argument == next(iter(call))
    assert not await client.exists(key)


async def test_a_lease_given_as_the_token_is_refused_with_a_hint(
    client: redis.asyncio.Redis, name: str
) -> None:
    async with Lock(client, name) as lease:
        with pytest.raises(TypeError, match=r"got Lease \(pass its \.fencing_token\)$"):
            await fenced_set(client, f"{name}:data", "v", lease)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"got Lease \(pass its \.fencing_token\)$"):
            await fenced_delete(client, f"{name}:data", lease)  # type: ignore[arg-type]


async def test_delete_and_get_refuse_bad_input(client: redis.asyncio.Redis, name: str) -> None:
    with pytest.raises(ConfigError, match=r"^keep must be a finite number of seconds") as raised:
        await fenced_delete(client, f"{name}:data", 1, keep=0)
    assert raised.value.argument == "keep"
    with pytest.raises(ConfigError, match=r"fencing_token must be an int from 0"):
        await fenced_delete(client, f"{name}:data", -5)
    with pytest.raises(TypeError, match=r"^key must be a str, got int$"):
        await fenced_get(client, 5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^timeout must be a finite number"):
        await fenced_get(client, f"{name}:data", timeout=-1)
    assert not await client.exists(f"{name}:data")


async def test_the_highest_token_expires_with_the_data_and_never_before(
    client: redis.asyncio.Redis, name: str
) -> None:
    key = f"{name}:data"
    assert await fenced_set(client, key, "v", 5, ttl=30)
    assert 29_000 < await client.pttl(key) <= 30_000
    # A refused write changes nothing, its ttl included.
    assert not await fenced_set(client, key, "stale", 4, ttl=1000)
    assert await client.pttl(key) <= 30_000
    # A write without a ttl removes the expiry, as SET does.
    assert await fenced_set(client, key, "v", 5)
    assert await client.pttl(key) == -1
    # The token lives in the key that holds the data: whatever expires or evicts one
    # takes the other with it, and nothing else is written.
    assert await client.hgetall(key) == {b"value": b"v", b"fence": b"5"}


async def test_an_expired_key_accepts_any_token_again(
    client: redis.asyncio.Redis, name: str
) -> None:
    key = f"{name}:data"
    assert await fenced_set(client, key, "v", 5, ttl=0.05)
    async with asyncio.timeout(5):
        while await client.exists(key):
            await asyncio.sleep(0.01)
    assert await fenced_get(client, key) == FencedValue(value=None, fencing_token=0)
    assert await fenced_set(client, key, "late", 1)


async def test_a_delete_keeps_the_highest_token_so_a_late_write_is_still_refused(
    client: redis.asyncio.Redis, name: str
) -> None:
    key = f"{name}:data"
    assert await fenced_set(client, key, "v", 5, ttl=60)
    assert not await fenced_delete(client, key, 4)
    assert await fenced_get(client, key) == FencedValue(value=b"v", fencing_token=5)
    assert await fenced_delete(client, key, 6)
    assert await fenced_get(client, key) == FencedValue(value=None, fencing_token=6)
    assert 59_000 < await client.pttl(key) <= 60_000  # the expiry it had
    assert not await fenced_set(client, key, "late", 5)
    assert await fenced_get(client, key) == FencedValue(value=None, fencing_token=6)
    assert await fenced_set(client, key, "new", 7)
    assert await fenced_get(client, key) == FencedValue(value=b"new", fencing_token=7)


async def test_a_delete_with_keep_sets_how_long_the_token_stays(
    client: redis.asyncio.Redis, name: str
) -> None:
    key = f"{name}:data"
    assert await fenced_set(client, key, "v", 5)
    assert await fenced_delete(client, key, 5, keep=20)
    assert 19_000 < await client.pttl(key) <= 20_000
    # A key that does not exist: the token is recorded all the same.
    missing = f"{name}:missing"
    assert await fenced_delete(client, missing, 3)
    assert await fenced_get(client, missing) == FencedValue(value=None, fencing_token=3)
    assert await client.pttl(missing) == -1
    assert not await fenced_set(client, missing, "late", 2)


async def test_a_key_of_another_type_is_refused_and_left_as_it_was(
    client: redis.asyncio.Redis, name: str
) -> None:
    key = f"{name}:data"
    await client.set(key, "plain string")
    for call in (
        fenced_set(client, key, "v", 1),
        fenced_delete(client, key, 1),
        fenced_get(client, key),
    ):
        with pytest.raises(BackendError, match=r"of key '.*:data' failed: .*WRONGTYPE"):
            await call
    assert await client.get(key) == b"plain string"
    # A hash whose `fence` is not a token: refused before anything is written.
    other = f"{name}:other"
    await client.hset(other, mapping={"value": "kept", "fence": "not a number"})
    with pytest.raises(BackendError, match=r"is not a fencing token"):
        await fenced_set(client, other, "v", 1)
    with pytest.raises(BackendError, match=r"is not a fencing token"):
        await fenced_delete(client, other, 1)
    assert await client.hgetall(other) == {b"value": b"kept", b"fence": b"not a number"}


async def test_a_client_that_decodes_its_replies_reads_bytes_all_the_same(
    backend_kind: str, client: redis.asyncio.Redis, name: str, request: pytest.FixtureRequest
) -> None:
    if backend_kind == "real":
        decoding = make_client(request.getfixturevalue("server_url"), decode_responses=True)
    else:
        import fakeredis

        decoding = fakeredis.FakeAsyncRedis(
            connection_pool=client.connection_pool, decode_responses=True
        )
    key = f"{name}:data"
    try:
        assert await fenced_set(decoding, key, "été", 12)
        assert await fenced_get(decoding, key) == FencedValue(
            value="été".encode(), fencing_token=12
        )
        assert await fenced_get(client, key) == FencedValue(value="été".encode(), fencing_token=12)
    finally:
        if decoding.connection_pool is not client.connection_pool:
            await decoding.aclose()


@pytest.mark.real_only
async def test_each_call_is_one_script_in_one_round_trip(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    key = f"{name}:data"
    await client.script_flush()
    calls: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        ("fenced_set", lambda: fenced_set(client, key, "v", 2, ttl=10)),
        ("fenced_set", lambda: fenced_set(client, key, "v", 1)),  # refused
        ("fenced_get", lambda: fenced_get(client, key)),
        ("fenced_delete", lambda: fenced_delete(client, key, 3, keep=10)),
        ("fenced_delete", lambda: fenced_delete(client, key, 2)),  # refused
    ]
    # A server that does not know a script yet: EVALSHA, then EVAL (which caches it).
    for script in ("fenced_set", "fenced_get", "fenced_delete"):
        call = next(call for named, call in calls if named == script)
        mark = commands.mark()
        await call()
        assert commands.since(mark) == {f"EVALSHA {script}": 1, f"EVAL {script}": 1}
    for script, call in calls:
        mark = commands.mark()
        await call()
        assert commands.since(mark) == {f"EVALSHA {script}": 1}


def test_the_docs_name_every_command_the_scripts_run() -> None:
    """docs/fencing.md's list of the commands a Redis user needs (for an ACL)."""
    called = {c.upper() for s in FENCING_SCRIPTS for c in _CALLS.findall(s.source)}
    docs = (Path(__file__).resolve().parents[2] / "docs" / "fencing.md").read_text()
    line = re.search(r"\*\*Permissions\*\*: (.*?) on your data", docs, re.DOTALL)
    assert line is not None
    assert set(re.findall(r"`([A-Z]+)`", line.group(1))) == called | {"EVALSHA", "EVAL"}
