"""LockConfig's derived values and the key layout; pure functions, no Redis."""

from __future__ import annotations

import binascii
import math

import pytest
import redis.asyncio
from redis.crc import key_slot

from aiolock import ConfigError, Lock, ReadWriteLock, Semaphore
from aiolock._lua.layout import LockKeys
from aiolock._model.config import (
    MAX_NAME_LENGTH,
    MAX_SECONDS,
    MIN_TTL,
    LockConfig,
    check_name,
    check_prefix,
    check_timeout,
    replica_wait_ms,
    safety_margin,
)
from aiolock._transport.backend import Backend


def build(
    *,
    ttl: object = 30.0,
    renew: object = True,
    renew_interval: object = None,
    timeout: object = None,
    max_hold: object = None,
    prefix: object = "aiolock",
) -> LockConfig:
    return LockConfig.build(
        ttl=ttl,
        renew=renew,
        renew_interval=renew_interval,
        timeout=timeout,
        max_hold=max_hold,
        prefix=prefix,
    )


# --------------------------------------------------------------------- LockConfig.build
def test_defaults() -> None:
    config = build()
    assert config.ttl == 30.0
    assert config.renew_interval == pytest.approx(10.0)
    assert config.timeout is None
    assert config.max_hold is None
    assert config.prefix == "aiolock"
    assert config.ttl_ms == 30_000


def test_numbers_are_stored_as_floats() -> None:
    config = build(ttl=10, renew_interval=2, timeout=3, max_hold=40)
    for value in (config.ttl, config.renew_interval, config.timeout, config.max_hold):
        assert type(value) is float
    assert (config.ttl, config.renew_interval, config.timeout, config.max_hold) == (10, 2, 3, 40)


@pytest.mark.parametrize(
    ("ttl", "ttl_ms"),
    [
        (0.0101, 11),
        (0.01, 10),
        (0.0109, 11),
        (0.011, 11),
        (1, 1000),
        (1.5, 1500),
        (1.0001, 1001),
        (30, 30_000),
        (MAX_SECONDS, int(MAX_SECONDS * 1000)),
    ],
)
def test_ttl_ms_rounds_up(ttl: float, ttl_ms: int) -> None:
    assert build(ttl=ttl).ttl_ms == ttl_ms


def test_ttl_ms_never_expires_before_the_ttl() -> None:
    for thousandths in range(10, 5000, 7):
        for extra in (0.0, 0.00001, 0.0004, 0.0009):
            ttl = thousandths / 1000 + extra
            ttl_ms = build(ttl=ttl).ttl_ms
            assert ttl_ms >= ttl * 1000
            assert ttl_ms - 1 < ttl * 1000


@pytest.mark.parametrize("ttl", [MIN_TTL, 0.05, 1, 3, 10, 30, 3600, MAX_SECONDS])
def test_default_renew_interval_is_a_third_of_the_ttl(ttl: float) -> None:
    config = build(ttl=ttl)
    assert config.renew_interval == pytest.approx(ttl / 3)
    assert config.renew_interval is not None
    assert 0 < config.renew_interval < config.ttl - config.margin


@pytest.mark.parametrize("ttl", [MIN_TTL, 0.0101, 0.05, 0.2, 1, 10, 30, 3600, MAX_SECONDS])
def test_margin(ttl: float) -> None:
    config = build(ttl=ttl)
    assert config.margin == pytest.approx(min(ttl * 0.01 + 0.002, ttl / 2))
    assert config.margin == safety_margin(config.ttl)
    assert 0 < config.margin < config.ttl


def test_renew_false_has_no_interval() -> None:
    assert build(renew=False).renew_interval is None


def test_renew_interval_up_to_the_validity_is_accepted() -> None:
    # ttl 10 -> margin 0.102 -> validity 9.898
    assert build(ttl=10, renew_interval=9.89).renew_interval == 9.89
    assert build(ttl=10, renew_interval=0.001).renew_interval == 0.001
    with pytest.raises(ConfigError) as info:
        build(ttl=10, renew_interval=9.9)
    assert info.value.argument == "renew_interval"
    assert "9.898" in str(info.value)


def test_max_hold_may_equal_the_ttl() -> None:
    assert build(ttl=10, max_hold=10).max_hold == 10.0
    assert build(ttl=10, max_hold=MAX_SECONDS).max_hold == MAX_SECONDS


def test_ttl_range_ends_are_inclusive() -> None:
    assert build(ttl=MIN_TTL).ttl == MIN_TTL
    assert build(ttl=MAX_SECONDS).ttl == MAX_SECONDS
    with pytest.raises(ConfigError):
        build(ttl=math.nextafter(MIN_TTL, 0))
    with pytest.raises(ConfigError):
        build(ttl=math.nextafter(MAX_SECONDS, math.inf))


def test_config_is_frozen() -> None:
    config = build()
    with pytest.raises(AttributeError):
        config.ttl = 5  # type: ignore[misc]


# --------------------------------------------------------------------- safety_margin
@pytest.mark.parametrize(
    ("ttl", "margin"),
    [
        (10.0, 0.102),
        (30.0, 0.302),
        (1.0, 0.012),
        (0.01, 0.0021),
        (0.004, 0.002),  # half the ttl: 0.002 < 0.00204
        (0.002, 0.001),
        (0.0, 0.0),
    ],
)
def test_safety_margin(ttl: float, margin: float) -> None:
    assert safety_margin(ttl) == pytest.approx(margin)
    assert safety_margin(ttl) <= ttl / 2


# --------------------------------------------------------------------- check_*
def test_check_timeout_accepts_none_zero_and_the_maximum() -> None:
    assert check_timeout(None) is None
    zero = check_timeout(0)
    assert zero == 0.0
    assert type(zero) is float
    assert check_timeout(0.0) == 0.0
    assert check_timeout(2.5) == 2.5
    assert check_timeout(MAX_SECONDS) == MAX_SECONDS


def test_check_timeout_names_its_argument() -> None:
    with pytest.raises(ConfigError) as info:
        check_timeout(-1, argument="wait")
    assert info.value.argument == "wait"
    assert info.value.value == -1
    assert "wait" in str(info.value)


def test_check_name_limits() -> None:
    assert check_name("a") == "a"
    assert check_name("x" * MAX_NAME_LENGTH) == "x" * MAX_NAME_LENGTH
    with pytest.raises(ConfigError):
        check_name("x" * (MAX_NAME_LENGTH + 1))


def test_check_prefix_limits() -> None:
    assert check_prefix("p" * 100) == "p" * 100
    assert check_prefix("my-app:locks") == "my-app:locks"
    with pytest.raises(ConfigError):
        check_prefix("p" * 101)


# --------------------------------------------------------------------- LockKeys
def test_key_layout() -> None:
    keys = LockKeys.build("aiolock", "orders:42")
    assert keys.lock == "aiolock:{orders:42}"
    assert keys.queue == "aiolock:{orders:42}:queue"
    assert keys.waiters == "aiolock:{orders:42}:waiters"
    assert keys.holds == "aiolock:{orders:42}:holds"
    assert keys.channel == "aiolock:{orders:42}:released"
    assert keys.scripts == (keys.lock, keys.queue, keys.waiters, keys.holds)


def test_key_layout_with_a_prefix() -> None:
    keys = LockKeys.build("my-app", "x")
    assert (keys.lock, keys.queue, keys.channel) == (
        "my-app:{x}",
        "my-app:{x}:queue",
        "my-app:{x}:released",
    )


SLOT_NAMES = [
    "orders:42",
    "a{b}c",
    "x}y",
    "a}",
    "{a",
    "{}",
    "{{}}",
    "a{}b",
    "заказ:42",
    "🔒",
    "has space",
    "x" * MAX_NAME_LENGTH,
    "🔒" * MAX_NAME_LENGTH,
]


@pytest.mark.parametrize("lock_name", SLOT_NAMES)
@pytest.mark.parametrize("prefix", ["aiolock", "app:v2"])
def test_all_keys_of_a_lock_share_one_cluster_slot(lock_name: str, prefix: str) -> None:
    check_name(lock_name)  # only names that a Lock accepts
    keys = LockKeys.build(check_prefix(prefix), lock_name)
    slots = {key_slot(key.encode()) for key in (*keys.scripts, keys.channel)}
    assert len(slots) == 1
    if "}" not in lock_name:
        # the hash tag is the whole name
        assert slots == {binascii.crc_hqx(lock_name.encode(), 0) % 16384}


def test_the_slot_depends_on_the_name_not_the_prefix() -> None:
    for lock_name in SLOT_NAMES:
        slots = {key_slot(LockKeys.build(p, lock_name).lock.encode()) for p in ("a", "b:c")}
        assert len(slots) == 1


async def test_the_slot_of_a_key_is_that_of_the_bytes_the_client_writes() -> None:
    """A client with another encoding writes a name outside ASCII as other bytes, in
    another slot: what aiolock groups by slot (a cluster's renewals, one call per slot) is
    grouped by the slot the server finds."""
    key = LockKeys.build("aiolock", "café").lock
    assert key_slot(key.encode("latin-1")) != key_slot(key.encode())
    for encoding in ("utf-8", "latin-1"):
        client = redis.asyncio.Redis(encoding=encoding)
        try:
            assert Backend(client).slot(key) == key_slot(key.encode(encoding)), encoding
        finally:
            await client.aclose()


def test_a_leading_closing_brace_would_split_the_slots() -> None:
    """Why check_name rejects names starting with '}': the tag would be empty."""
    keys = LockKeys.build("aiolock", "}orders")
    slots = {key_slot(key.encode()) for key in (*keys.scripts, keys.channel)}
    assert len(slots) > 1
    with pytest.raises(ConfigError):
        check_name("}orders")


# --------------------------------------------------------------------------- replicas=
def test_replicas_default_to_none_and_their_wait_to_a_quarter_ttl_at_most_a_second() -> None:
    assert (build().replicas, build().replica_timeout) == (0, 0.0)
    assert build().wait_args(10.0) is None
    one = LockConfig.build(
        ttl=2.0, renew=True, renew_interval=None, timeout=None, max_hold=None,
        prefix="aiolock", replicas=1,
    )  # fmt: skip
    assert (one.replicas, one.replica_timeout) == (1, 0.5)
    long = LockConfig.build(
        ttl=30.0, renew=True, renew_interval=None, timeout=None, max_hold=None,
        prefix="aiolock", replicas=2,
    )  # fmt: skip
    assert long.replica_timeout == 1.0
    assert long.wait_args(10.0) == (2, 1000)


@pytest.mark.parametrize(
    ("replica_timeout", "bound", "ms"),
    [
        (1.0, 10.0, 1000),  # the configured wait
        (1.0, 1.0, 500),  # at most half the call's bound
        (1.0, 0.2, 80),  # and the server's lateness short of it
        (1.0, 0.1, 1),  # never 0: WAIT 0 blocks for ever
        (0.001, 5.0, 1),
    ],
)
def test_the_wait_leaves_room_for_its_answer_within_the_call(
    replica_timeout: float, bound: float, ms: int
) -> None:
    assert replica_wait_ms(replica_timeout, bound) == ms


@pytest.mark.parametrize(
    ("arguments", "error", "argument", "words"),
    [
        ({"replicas": -1}, ConfigError, "replicas", "from 0 to 100"),
        ({"replicas": 101}, ConfigError, "replicas", "from 0 to 100"),
        ({"replicas": True}, TypeError, None, "replicas must be an int"),
        ({"replicas": 1.0}, TypeError, None, "replicas must be an int"),
        ({"replica_timeout": 0.1}, ConfigError, "replica_timeout", "replicas=0"),
        ({"replicas": 1, "replica_timeout": 0}, ConfigError, "replica_timeout", "0.001 to 5"),
        ({"replicas": 1, "replica_timeout": 5.01}, ConfigError, "replica_timeout", "0.001 to 5"),
        ({"replicas": 1, "replica_timeout": "1"}, TypeError, None, "replica_timeout must be"),
        ({"renew_on_handoff": 0}, TypeError, None, "renew_on_handoff must be a bool"),
        (
            {"replicas": 1, "renew_on_handoff": False},
            ConfigError,
            "renew_on_handoff",
            "cannot be combined with replicas",
        ),
    ],
)
def test_bad_replicas_arguments_are_refused_by_the_constructor(
    arguments: dict[str, object], error: type[Exception], argument: str | None, words: str
) -> None:
    client = redis.asyncio.Redis()  # never connects: nothing is sent
    for make in (
        lambda: Lock(client, "n", ttl=10, **arguments),  # type: ignore[arg-type]
        lambda: Semaphore(client, "n", limit=2, ttl=10, **arguments),  # type: ignore[arg-type]
        lambda: ReadWriteLock(client, "n", ttl=10, **arguments),  # type: ignore[arg-type]
    ):
        with pytest.raises(error) as info:
            make()
        assert words in str(info.value)
        if argument is not None:
            assert isinstance(info.value, ConfigError) and info.value.argument == argument
