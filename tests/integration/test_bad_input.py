"""Bad input: the exact exception, a message naming the argument, and Redis left untouched.

Every case runs against the real server (where the `commands` log must stay empty: not one
command sent) and against fakeredis (where the database must stay as it was).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis
import redis.asyncio

from aiolock import ConfigError, Lease, Lock

from ..conftest import CommandLog, make_client


@dataclass
class Env:
    """What a case's action may use."""

    client: redis.asyncio.Redis
    name: str
    lease: Lease | None = None


Act = Callable[[Env], Awaitable[None]]


@dataclass(frozen=True)
class Case:
    act: Act
    error: type[Exception]
    says: tuple[str, ...]
    """Substrings the message must contain (the argument's name, at least)."""
    argument: str | None = None
    """`ConfigError.argument`."""
    needs_lease: bool = False


def new_lock(**kwargs: Any) -> Act:
    async def act(env: Env) -> None:
        Lock(env.client, env.name, **kwargs)

    return act


def named(bad: Any) -> Act:
    async def act(env: Env) -> None:
        Lock(env.client, bad)

    return act


def with_client(make: Callable[[], Any]) -> Act:
    async def act(env: Env) -> None:
        bad = make()
        try:
            Lock(bad, env.name)
        finally:
            if isinstance(bad, redis.Redis):
                bad.close()

    return act


def acquire_with(timeout: Any) -> Act:
    async def act(env: Env) -> None:
        await Lock(env.client, env.name).acquire(timeout=timeout)

    return act


async def sync_with_lock(env: Env) -> None:
    with Lock(env.client, env.name):
        pytest.fail("the body of a sync 'with' must not run")


async def sync_with_lease(env: Env) -> None:
    assert env.lease is not None
    with env.lease:
        pytest.fail("the body of a sync 'with' must not run")


def config(act: Act, argument: str, *also: str) -> Case:
    return Case(act, ConfigError, (argument, *also), argument=argument)


def wrong_type(act: Act, *says: str) -> Case:
    return Case(act, TypeError, says)


NAN = math.nan
INF = math.inf

CASES = [
    # -- name: wrong types
    pytest.param(wrong_type(named(b"orders:42"), "name", "str", "decode"), id="name-bytes"),
    pytest.param(wrong_type(named(None), "name", "str"), id="name-None"),
    pytest.param(wrong_type(named(42), "name", "str"), id="name-int"),
    pytest.param(wrong_type(named(bytearray(b"x")), "name", "decode"), id="name-bytearray"),
    # -- name: wrong values
    pytest.param(config(named(""), "name", "empty"), id="name-empty"),
    pytest.param(config(named("x" * 1001), "name", "1000", "1001"), id="name-1001-chars"),
    pytest.param(config(named("}orders"), "name", "'}'"), id="name-leading-brace"),
    pytest.param(config(named("}"), "name", "'}'"), id="name-only-brace"),
    pytest.param(config(named("a\ud800b"), "name", "surrogate"), id="name-lone-surrogate"),
    # -- ttl
    pytest.param(config(new_lock(ttl=0), "ttl"), id="ttl-0"),
    pytest.param(config(new_lock(ttl=-1), "ttl"), id="ttl-negative"),
    pytest.param(config(new_lock(ttl=NAN), "ttl"), id="ttl-nan"),
    pytest.param(config(new_lock(ttl=INF), "ttl"), id="ttl-inf"),
    pytest.param(config(new_lock(ttl=-INF), "ttl"), id="ttl-minus-inf"),
    pytest.param(config(new_lock(ttl=0.0009), "ttl", "0.01"), id="ttl-sub-millisecond"),
    pytest.param(config(new_lock(ttl=0.005), "ttl", "0.01"), id="ttl-below-minimum"),
    pytest.param(config(new_lock(ttl=10**9), "ttl"), id="ttl-1e9"),
    pytest.param(config(new_lock(ttl=10**400), "ttl"), id="ttl-int-too-large-for-float"),
    pytest.param(wrong_type(new_lock(ttl="10"), "ttl", "str"), id="ttl-str"),
    pytest.param(wrong_type(new_lock(ttl=None), "ttl", "NoneType"), id="ttl-None"),
    pytest.param(wrong_type(new_lock(ttl=True), "ttl", "bool"), id="ttl-bool"),
    # -- renew / renew_interval
    pytest.param(
        config(new_lock(ttl=10, renew_interval=10), "renew_interval"), id="renew_interval-eq-ttl"
    ),
    pytest.param(
        config(new_lock(ttl=10, renew_interval=11), "renew_interval"), id="renew_interval-gt-ttl"
    ),
    pytest.param(
        config(new_lock(ttl=10, renew_interval=9.95), "renew_interval", "safety margin"),
        id="renew_interval-inside-margin",
    ),
    pytest.param(config(new_lock(renew_interval=0), "renew_interval"), id="renew_interval-0"),
    pytest.param(
        config(new_lock(renew_interval=-1), "renew_interval"), id="renew_interval-negative"
    ),
    pytest.param(config(new_lock(renew_interval=NAN), "renew_interval"), id="renew_interval-nan"),
    pytest.param(
        config(new_lock(renew=False, renew_interval=1), "renew_interval", "renew=False"),
        id="renew_interval-without-renew",
    ),
    pytest.param(
        wrong_type(new_lock(renew_interval="1"), "renew_interval", "str"), id="renew_interval-str"
    ),
    pytest.param(wrong_type(new_lock(renew="yes"), "renew", "bool"), id="renew-str"),
    pytest.param(wrong_type(new_lock(renew=1), "renew", "bool", "int"), id="renew-int"),
    # -- timeout
    pytest.param(config(new_lock(timeout=-1), "timeout"), id="timeout-negative"),
    pytest.param(config(new_lock(timeout=NAN), "timeout"), id="timeout-nan"),
    pytest.param(config(new_lock(timeout=INF), "timeout", "None"), id="timeout-inf"),
    pytest.param(wrong_type(new_lock(timeout="5"), "timeout", "str"), id="timeout-str"),
    # -- max_hold
    pytest.param(config(new_lock(ttl=10, max_hold=5), "max_hold"), id="max_hold-below-ttl"),
    pytest.param(config(new_lock(max_hold=NAN), "max_hold"), id="max_hold-nan"),
    pytest.param(config(new_lock(max_hold=INF), "max_hold"), id="max_hold-inf"),
    # -- prefix
    pytest.param(config(new_lock(prefix=""), "prefix"), id="prefix-empty"),
    pytest.param(config(new_lock(prefix="a{b"), "prefix", "braces"), id="prefix-open-brace"),
    pytest.param(config(new_lock(prefix="a}b"), "prefix", "braces"), id="prefix-close-brace"),
    pytest.param(config(new_lock(prefix="has space"), "prefix", "whitespace"), id="prefix-space"),
    pytest.param(config(new_lock(prefix="tab\there"), "prefix", "whitespace"), id="prefix-tab"),
    pytest.param(config(new_lock(prefix="p" * 101), "prefix", "100"), id="prefix-101-chars"),
    pytest.param(wrong_type(new_lock(prefix=b"x"), "prefix", "str"), id="prefix-bytes"),
    # -- client
    pytest.param(
        wrong_type(with_client(redis.Redis), "client", "redis.asyncio", "synchronous"),
        id="client-sync-redis",
    ),
    pytest.param(wrong_type(with_client(lambda: None), "client", "NoneType"), id="client-None"),
    pytest.param(
        wrong_type(with_client(lambda: "redis://localhost"), "client", "str"), id="client-str"
    ),
    pytest.param(wrong_type(with_client(object), "client", "object"), id="client-object"),
    # -- sync context managers
    pytest.param(wrong_type(sync_with_lock, "async with", "Lock"), id="with-Lock"),
    pytest.param(
        Case(sync_with_lease, TypeError, ("async with", "Lease"), needs_lease=True),
        id="with-Lease",
    ),
    # -- acquire(timeout=...)
    pytest.param(config(acquire_with(-1), "timeout"), id="acquire-timeout-negative"),
    pytest.param(config(acquire_with(NAN), "timeout"), id="acquire-timeout-nan"),
    pytest.param(config(acquire_with(INF), "timeout"), id="acquire-timeout-inf"),
    pytest.param(
        config(acquire_with(10**400), "timeout"), id="acquire-timeout-int-too-large-for-float"
    ),
    pytest.param(wrong_type(acquire_with("1"), "timeout", "str"), id="acquire-timeout-str"),
    pytest.param(wrong_type(acquire_with(True), "timeout", "bool"), id="acquire-timeout-bool"),
]


@pytest.mark.parametrize("case", CASES)
async def test_bad_input_raises_exactly_and_leaves_redis_untouched(
    case: Case,
    client: redis.asyncio.Redis,
    backend_kind: str,
    commands: CommandLog,
    name: str,
) -> None:
    env = Env(client, name)
    if case.needs_lease:
        env.lease = await Lock(client, name, ttl=30).acquire()
    try:
        before = await client.dbsize() if backend_kind == "fakeredis" else None
        assert before == (None if backend_kind == "real" else 1 if case.needs_lease else 0)
        commands.clear()

        with pytest.raises(case.error) as info:
            await case.act(env)

        assert commands.commands == []  # first: nothing at all was sent
        error = info.value
        assert type(error) is case.error
        message = str(error)
        for part in case.says:
            assert part in message, f"{part!r} not in {message!r}"
        if isinstance(error, ConfigError):
            assert error.argument == case.argument
        if backend_kind == "fakeredis":
            assert await client.dbsize() == before
    finally:
        if env.lease is not None:
            await env.lease.release()


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 35


def _unique_variant(valid: str) -> str:
    """The valid name with a random tail, same length when the name is at the limit."""
    tail = f"|{uuid.uuid4().hex[:8]}"
    if len(valid) + len(tail) > 1000:
        return valid[: 1000 - len(tail)] + tail
    return valid + tail


VALID_NAMES = [
    pytest.param("заказ:42", id="cyrillic"),
    pytest.param("🔒:orders:🚀", id="emoji"),
    pytest.param("🔒" * 1000, id="1000-emoji"),
    pytest.param("x" * 1000, id="1000-chars"),
    pytest.param("a{b}c", id="braces-inside"),
    pytest.param("x}y", id="closing-brace-inside"),
    pytest.param("{leading-open-brace", id="leading-open-brace"),
    pytest.param("has some spaces", id="spaces"),
    pytest.param("tab\tand\nnewline", id="control-chars"),
    pytest.param("a", id="one-char"),
]


@pytest.mark.parametrize("valid", VALID_NAMES)
async def test_valid_names_are_accepted_and_usable(
    valid: str, client: redis.asyncio.Redis, commands: CommandLog
) -> None:
    lock = Lock(client, valid)
    assert lock.name == valid
    assert lock.key == f"aiolock:{{{valid}}}"
    assert commands.commands == []

    unique = _unique_variant(valid)
    assert len(unique) <= 1000
    lock = Lock(client, unique, ttl=5)
    lease = await lock.acquire(timeout=5)
    try:
        assert lease.name == unique
        assert await client.exists(lock.key.encode()) == 1
        info = await lock.info()
        assert info is not None
        assert info.name == unique
        assert info.fencing_token == lease.fencing_token
    finally:
        await lease.release()
    assert not await lock.locked()


@pytest.mark.real_only
async def test_timeout_zero_is_accepted_and_tries_once_on_a_fresh_client(
    server_url: str, commands: CommandLog, name: str
) -> None:
    """`timeout=0` is valid input ("try once"), also for the first command of a new client.

    The single attempt has to connect and, the first time, load the script: it must not be
    bounded by the (zero) time left to wait.
    """
    for i in range(5):
        fresh = make_client(server_url, commands)
        try:
            lease = await Lock(fresh, f"{name}:{i}", timeout=0).acquire()
            await lease.release()
            maybe = await Lock(fresh, f"{name}:{i}:try").try_acquire()
            assert maybe is not None
            await maybe.release()
        finally:
            await fresh.aclose()
