"""`LockOptions`: the settings declared once, taken the same way by every constructor and
helper, with the same defaults, the same checks and the same refusal of an unknown keyword."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_type_hints

import fakeredis
import pytest

import aiolock
from aiolock import (
    ConfigError,
    Lock,
    LockOptions,
    MultiLock,
    ReadWriteLock,
    Semaphore,
    locked,
    run_once,
)
from aiolock._model.options import DEFAULTS
from aiolock.aiohttp import locked_handler
from aiolock.fastapi import locked_request

SETTINGS = (
    "ttl",
    "renew",
    "renew_interval",
    "timeout",
    "max_hold",
    "prefix",
    "retain",
    "hold_stats",
    "replicas",
    "replica_timeout",
    "renew_on_handoff",
    "reply_timeout",
)


@pytest.fixture
def fake() -> fakeredis.FakeAsyncRedis:
    return fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())


def makers(client: Any) -> dict[str, Callable[..., object]]:
    """Each public callable that takes the settings, called with `**settings`."""

    async def job() -> None:
        pass

    return {
        "Lock()": lambda **kw: Lock(client, "n", **kw),
        "Semaphore()": lambda **kw: Semaphore(client, "n", limit=2, **kw),
        "ReadWriteLock()": lambda **kw: ReadWriteLock(client, "n", **kw),
        "MultiLock()": lambda **kw: MultiLock(client, ["a", "b"], **kw),
        "locked()": lambda **kw: locked("n", client=client, on_busy="raise", **kw),
        "locked_request()": lambda **kw: locked_request("n", client=client, **kw),
        "locked_handler()": lambda **kw: locked_handler("n", client=client, **kw),
        # run_once checks its arguments before its first await: the coroutine is not run.
        "run_once()": lambda **kw: _started(run_once(client, "job", job, retention=60, **kw)),
    }


def _started(coroutine: Any) -> None:
    """Run `coroutine` to its first use of Redis, which needs an event loop: its arguments
    were accepted by then."""
    try:
        with pytest.raises(RuntimeError, match="no running event loop"):
            coroutine.send(None)
    finally:
        coroutine.close()


WHERE = tuple(makers(None))


def test_the_settings_are_declared_once_in_order_with_their_defaults() -> None:
    assert tuple(get_type_hints(LockOptions)) == SETTINGS
    assert tuple(DEFAULTS) == SETTINGS
    assert LockOptions.__optional_keys__ == frozenset(SETTINGS)
    assert "LockOptions" in aiolock.__all__
    assert aiolock.LockOptions is LockOptions


@pytest.mark.parametrize(
    "fn",
    [Lock, Semaphore, ReadWriteLock, MultiLock, locked, run_once, locked_request, locked_handler],
)
def test_every_constructor_and_helper_takes_them_as_one_unpacked_keyword(fn: Any) -> None:
    parameters = inspect.signature(fn).parameters
    options = parameters["options"]
    assert options.kind is inspect.Parameter.VAR_KEYWORD
    assert "Unpack[LockOptions]" in str(options.annotation)
    assert not set(parameters) & set(SETTINGS)


@pytest.mark.parametrize("where", WHERE)
def test_an_unknown_keyword_raises_type_error_at_the_call(
    fake: fakeredis.FakeAsyncRedis, where: str
) -> None:
    with pytest.raises(
        TypeError, match=rf"^{where[:-2]}\(\) got an unexpected keyword argument 'tll'$"
    ):
        makers(fake)[where](tll=5)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(
    ("argument", "value", "says"),
    [
        ("ttl", 0, "0.01"),
        ("retain", 1, "5 to 86400"),
        ("replica_timeout", 0.5, "replicas=0"),
        ("max_hold", 1, "max_hold"),
        ("reply_timeout", 0, "0.01 to 60"),
        ("reply_timeout", 61, "0.01 to 60"),
    ],
)
def test_a_bad_value_names_its_argument_at_the_call(
    fake: fakeredis.FakeAsyncRedis, where: str, argument: str, value: object, says: str
) -> None:
    with pytest.raises(ConfigError, match=says) as info:
        makers(fake)[where](**{argument: value})
    assert info.value.argument == argument


@pytest.mark.parametrize("where", WHERE)
def test_a_wrong_type_raises_type_error_naming_the_argument(
    fake: fakeredis.FakeAsyncRedis, where: str
) -> None:
    with pytest.raises(TypeError, match="hold_stats must be a bool"):
        makers(fake)[where](hold_stats="yes")


@pytest.mark.parametrize("where", WHERE)
def test_every_setting_is_accepted_everywhere(fake: fakeredis.FakeAsyncRedis, where: str) -> None:
    options: LockOptions = {
        "ttl": 20,
        "renew": True,
        "renew_interval": 5,
        "timeout": 1,
        "max_hold": 60,
        "prefix": "p",
        "retain": 30,
        "hold_stats": True,
        "replicas": 1,
        "replica_timeout": 0.5,
        "renew_on_handoff": True,
        "reply_timeout": 3,
    }
    makers(fake)[where](**options)


def test_the_defaults_and_the_overrides_that_differ(fake: fakeredis.FakeAsyncRedis) -> None:
    lock = Lock(fake, "n")
    assert (lock._config.ttl, lock._config.timeout, lock._config.prefix) == (30.0, None, "aiolock")
    assert lock._config.retain == DEFAULTS["retain"]
    assert Semaphore(fake, "n", limit=1)._config == lock._config
    assert ReadWriteLock(fake, "n")._config == lock._config
    # A MultiLock's names are taken under its own timeout, each lock without one.
    multi = MultiLock(fake, ["a", "b"], timeout=3)
    assert multi._timeout == 3.0
    assert {each._config.timeout for each in multi.locks} == {None}


def test_an_options_dict_is_reused_across_primitives(fake: fakeredis.FakeAsyncRedis) -> None:
    options: LockOptions = {"ttl": 10, "prefix": "shop"}
    assert Lock(fake, "n", **options).key.startswith("shop:")
    assert Semaphore(fake, "n", limit=3, **options).key.startswith("shop:")
    assert ReadWriteLock(fake, "n", **options).key.startswith("shop:")


# ------------------------------------------------------------------- the client first
async def test_locked_takes_the_client_first_as_lock_does(fake: fakeredis.FakeAsyncRedis) -> None:
    @locked(fake, "orders:{order_id}", timeout=0, on_busy="raise")
    async def ship(lease: aiolock.Lease, order_id: int) -> str:
        return lease.name

    @locked("orders:{order_id}", client=fake)
    async def bill(lease: aiolock.Lease, order_id: int) -> str:
        return lease.name

    @locked(name="orders:{order_id}", client=fake)
    async def pack(lease: aiolock.Lease, order_id: int) -> str:
        return lease.name

    assert [await ship(1), await bill(2), await pack(3)] == ["orders:1", "orders:2", "orders:3"]
    await fake.aclose()


@pytest.mark.parametrize("helper", [locked, locked_request, locked_handler])
def test_the_web_helpers_take_the_client_first_or_by_keyword(
    fake: fakeredis.FakeAsyncRedis, helper: Any
) -> None:
    helper(fake, "orders:{order_id}", ttl=5)
    helper("orders:{order_id}", client=fake, ttl=5)
    helper(name="orders:{order_id}", client=fake, ttl=5)
    where = f"{helper.__name__}()"
    with pytest.raises(TypeError, match=rf"^{where[:-2]}\(\) missing required argument: 'client'"):
        helper("orders:{order_id}")
    with pytest.raises(TypeError, match="missing required argument: 'name'"):
        helper(client=fake)
    with pytest.raises(TypeError, match="multiple values for argument 'client'"):
        helper(fake, "orders:{order_id}", client=fake)
    with pytest.raises(TypeError, match="multiple values for argument 'name'"):
        helper("orders:{order_id}", name="orders:{order_id}", client=fake)
    with pytest.raises(ConfigError) as info:
        helper(fake, "orders:{order_id}", ttl=0)
    assert info.value.argument == "ttl"
