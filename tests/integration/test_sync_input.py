"""Bad input to aiolock.sync: the same exception and message as the asyncio classes give,
at the call that made the mistake, nothing sent; and the clients it takes, whose settings
its asyncio twin carries over."""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import aiolock
import aiolock.sync
from aiolock.sync import _clients

pytestmark = pytest.mark.real_only

NAME = "orders:42"


@pytest.fixture
def clients(server_url: str) -> Iterator[tuple[redis.Redis, redis.asyncio.Redis]]:
    sync = redis.Redis.from_url(server_url)
    aio = redis.asyncio.Redis.from_url(server_url)
    try:
        yield sync, aio
    finally:
        aiolock.sync.shutdown()
        sync.close()


Make = Callable[[Any, Any], object]
"""`make(module, client)`: a call of `aiolock` or `aiolock.sync` with the bad input."""

CASES: dict[str, Make] = {
    "name-bytes": lambda m, c: m.Lock(c, b"orders"),
    "name-empty": lambda m, c: m.Lock(c, ""),
    "name-too-long": lambda m, c: m.Lock(c, "x" * 1001),
    "name-brace": lambda m, c: m.Lock(c, "}x"),
    "ttl-0": lambda m, c: m.Lock(c, NAME, ttl=0),
    "ttl-nan": lambda m, c: m.Lock(c, NAME, ttl=math.nan),
    "ttl-str": lambda m, c: m.Lock(c, NAME, ttl="10"),
    "ttl-bool": lambda m, c: m.Lock(c, NAME, ttl=True),
    "renew_interval-ge-ttl": lambda m, c: m.Lock(c, NAME, ttl=10, renew_interval=10),
    "timeout-negative": lambda m, c: m.Lock(c, NAME, timeout=-1),
    "max_hold-below-ttl": lambda m, c: m.Lock(c, NAME, ttl=10, max_hold=5),
    "prefix-empty": lambda m, c: m.Lock(c, NAME, prefix=""),
    "unknown-keyword": lambda m, c: m.Lock(c, NAME, tll=10),
    "semaphore-limit-0": lambda m, c: m.Semaphore(c, NAME, limit=0),
    "semaphore-limit-str": lambda m, c: m.Semaphore(c, NAME, limit="5"),
    "rw-unknown-keyword": lambda m, c: m.ReadWriteLock(c, NAME, limit=3),
    "redlock-hold-stats": lambda m, c: m.Redlock([c], NAME, hold_stats=True),
    "redlock-drift": lambda m, c: m.Redlock([c], NAME, ttl=10, drift=6),
    "run_once-job-key": lambda m, c: m.run_once(c, "", lambda: None, retention=1),
    "run_once-retention": lambda m, c: m.run_once(c, "job", lambda: None, retention=0),
    "run_once-node_timeout-one-client": lambda m, c: m.run_once(
        c, "job", lambda: None, retention=1, node_timeout=1
    ),
    "locked-on_busy": lambda m, c: m.locked(c, "x:{a}", timeout=0),
    "locked-on_busy-value": lambda m, c: m.locked(c, "x:{a}", on_busy="wait"),
    "locked-positional-field": lambda m, c: m.locked(c, "x:{0}", on_busy="skip", timeout=0),
}


def raised(call: Callable[[], object]) -> BaseException:
    try:
        made = call()
        if inspect.iscoroutine(made):  # aiolock.run_once checks its input when awaited
            asyncio.run(made)
    except (TypeError, ValueError) as exc:
        return exc
    raise AssertionError("nothing was raised")


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_raises_what_the_asyncio_class_raises(
    case: str, clients: tuple[redis.Redis, redis.asyncio.Redis]
) -> None:
    sync, aio = clients
    make = CASES[case]
    expected = raised(lambda: make(aiolock, aio))
    got = raised(lambda: make(aiolock.sync, sync))
    assert type(got) is type(expected)
    assert str(got) == str(expected)
    if isinstance(expected, aiolock.ConfigError):
        assert isinstance(got, aiolock.ConfigError) and got.argument == expected.argument
    assert aiolock.sync._portal.running_portal() is None  # nothing was started, nothing sent


@pytest.mark.parametrize(
    ("timeout", "error"),
    [(-1, aiolock.ConfigError), (math.inf, aiolock.ConfigError), ("1", TypeError)],
)
def test_a_bad_acquire_timeout_raises_what_the_asyncio_acquire_raises(
    clients: tuple[redis.Redis, redis.asyncio.Redis], timeout: Any, error: type[Exception]
) -> None:
    sync, _ = clients
    with pytest.raises(error, match="timeout"):
        aiolock.sync.Lock(sync, NAME).acquire(timeout=timeout)


def test_clients_of_the_wrong_kind_are_refused(
    clients: tuple[redis.Redis, redis.asyncio.Redis],
) -> None:
    _, aio = clients
    with pytest.raises(
        TypeError, match=r"asyncio redis\.asyncio\.client\.Redis: use aiolock\.Lock"
    ):
        aiolock.sync.Lock(aio, NAME)
    with pytest.raises(TypeError, match="got int"):
        aiolock.sync.Lock(42, NAME)  # type: ignore[arg-type]
    with pytest.raises(aiolock.ConfigError, match="not a Redis URL"):
        aiolock.sync.Lock("http://example.invalid", NAME)
    with pytest.raises(TypeError, match="on_lost"):
        aiolock.sync.Lock(clients[0], NAME, on_lost=42)  # type: ignore[arg-type]


def test_the_twin_carries_the_connection_settings_over(server_url: str) -> None:
    address = redis.connection.parse_url(server_url)  # type: ignore[no-untyped-call]
    sync = redis.Redis(
        host=address["host"],
        port=address["port"],
        db=3,
        username="default",
        socket_timeout=2.5,
        socket_connect_timeout=1.5,
        client_name="billing",
        decode_responses=True,
        health_check_interval=7,
        max_connections=17,
    )
    try:
        aio = _clients.twin(sync)
        assert _clients.twin(sync) is aio  # one per client
        assert isinstance(aio, redis.asyncio.Redis)
        pool = aio.connection_pool
        kwargs = pool.connection_kwargs
        for key, value in {
            "db": 3,
            "username": "default",
            "socket_timeout": 2.5,
            "socket_connect_timeout": 1.5,
            "client_name": "billing",
            "decode_responses": True,
            "health_check_interval": 7,
        }.items():
            assert kwargs[key] == value, key
        assert pool.max_connections == 17
        assert pool.connection_class is redis.asyncio.Connection
        assert "retry" not in kwargs
        unix = _clients.twin(redis.Redis(unix_socket_path="/tmp/nothing.sock", db=2))
        assert isinstance(unix, redis.asyncio.Redis)
        assert unix.connection_pool.connection_class is redis.asyncio.UnixDomainSocketConnection
        assert unix.connection_pool.connection_kwargs["path"] == "/tmp/nothing.sock"
        tls = _clients.twin(redis.Redis(ssl=True, ssl_cert_reqs="none", port=1))
        assert isinstance(tls, redis.asyncio.Redis)
        assert tls.connection_pool.connection_class is redis.asyncio.SSLConnection
        assert tls.connection_pool.connection_kwargs["ssl_cert_reqs"] == "none"
    finally:
        aiolock.sync.shutdown()
        sync.close()


def test_a_url_and_a_decoding_client_lock_alike(server_url: str) -> None:
    decoding = redis.Redis.from_url(server_url, decode_responses=True, protocol=3)
    try:
        with aiolock.sync.Lock(server_url, "url-lock", ttl=5) as first:
            assert aiolock.sync.Lock(decoding, "url-lock").try_acquire() is None
        with aiolock.sync.Lock(decoding, "url-lock", ttl=5) as second:
            assert second.fencing_token > first.fencing_token
    finally:
        aiolock.sync.shutdown()
        decoding.close()
