"""Fenced storage in Redis: writes and deletes that a fencing token guards.

A lease's fencing token protects the data only if the storage checks it. `fenced_set`
writes a value only with a token at least the highest accepted so far for its key, and
refuses a lower one: the write of a holder that was superseded (paused past its lease, cut
off by a partition) while a newer holder wrote. `fenced_get` reads the value and that
highest token; `fenced_delete` removes the value under the same rule, keeping the token.

The key's layout (`_lua.fencing`): one hash, `value` and `fence`. Every call is one
script, one round trip, through the client's `Backend` (EVALSHA with its EVAL fallback,
bounded by `timeout`, routed by slot on a cluster).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, final

from .._engine.runtime import runtime_for
from .._lua.fencing import FENCED_DELETE, FENCED_GET, FENCED_SET, MAX_FENCING_TOKEN
from .._lua.lock import Script
from .._model.config import MAX_SECONDS, check_seconds
from .._transport.call_options import CallOptions
from .._transport.clients import AsyncClient, check_client
from ..errors import ConfigError

__all__ = ("FencedValue", "fenced_delete", "fenced_get", "fenced_set")

DEFAULT_TIMEOUT: Final = 5.0
"""Longest wait for Redis to answer one call, seconds, unless the caller says."""

_KEY_SHOWN: Final = 100
"""Characters of a key an error message shows."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class FencedValue:
    """What `fenced_get` read of a fenced key.

    Added in 0.1.
    """

    value: bytes | None
    """The value last written, as bytes (a `str` as the client encodes it, UTF-8 by
    default; a number as its decimal text), or None: never written, deleted
    (`fenced_delete`), or expired."""
    fencing_token: int
    """The highest fencing token a write or delete of the key was accepted with; 0 if none
    is stored (every token is then accepted)."""


def _check_key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(
            f"key must be a str, got {type(key).__name__}"
            + (" (decode it first)" if isinstance(key, bytes | bytearray) else "")
        )
    if not key:
        raise ConfigError("key must not be empty", argument="key", value=key)
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(
            "key must be encodable as UTF-8 (it contains a lone surrogate)",
            argument="key",
            value=key,
        ) from None
    return key


def _check_token(token: object) -> str:
    """A fencing token as the scripts take it: decimal digits, from an int 0 to 2**63 - 1."""
    if isinstance(token, bool) or not isinstance(token, int):
        hint = ""
        if hasattr(type(token), "fencing_token"):
            hint = " (pass its .fencing_token)"
        elif hasattr(type(token), "fencing_tokens"):
            hint = " (pass one of its .fencing_tokens)"
        raise TypeError(f"fencing_token must be an int, got {type(token).__name__}{hint}")
    if not 0 <= token <= MAX_FENCING_TOKEN:
        raise ConfigError(
            f"fencing_token must be an int from 0 to 2**63 - 1 ({MAX_FENCING_TOKEN}), "
            f"got {token!r}",
            argument="fencing_token",
            value=token,
        )
    return str(token)


def _check_value(value: object) -> str | bytes:
    """A value as sent: a str as it is (the client encodes it, UTF-8), bytes-like as bytes,
    an int or a float as its decimal text (as redis-py writes them)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(
                "value must be encodable as UTF-8 (it contains a lone surrogate)",
                argument="value",
                value=value,
            ) from None
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(float(value)) if isinstance(value, float) else str(int(value))
    raise TypeError(
        "value must be bytes (or bytearray, memoryview), str, int or float, got "
        f"{type(value).__name__}; encode it first (json.dumps, for example)"
    )


def _milliseconds(argument: str, seconds: object) -> str:
    """'' for None, else the ms Redis is sent for a number of seconds (at least 1)."""
    if seconds is None:
        return ""
    checked = check_seconds(argument, seconds, minimum=0.001, maximum=MAX_SECONDS)
    return str(max(1, math.ceil(checked * 1000)))


def _operation(what: str, key: str) -> str:
    shown = key if len(key) <= _KEY_SHOWN else key[:_KEY_SHOWN] + "..."
    return f"{what} of key {shown!r}"


async def _run(
    client: AsyncClient,
    script: Script,
    key: str,
    args: list[str | bytes],
    *,
    timeout: object,
) -> Any:
    bound = check_seconds("timeout", timeout, minimum=0.001)
    checked = check_client(client)
    return await runtime_for(checked).backend.run(
        script,
        (key,),
        args,  # type: ignore[arg-type]  # bytes are sent as they are
        CallOptions(timeout=bound, operation=_operation(script.name, key), name=None),
    )


async def fenced_set(
    client: AsyncClient,
    key: str,
    value: bytes | bytearray | memoryview | str | float,
    fencing_token: int,
    *,
    ttl: float | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> bool:
    """Write `value` at `key` if `fencing_token` is at least the highest token accepted for
    `key`; refuse it if a higher one was.

    ```python
    async with Lock(redis, "accounts:1") as lease:
        if not await fenced_set(redis, "accounts:1:balance", 90, lease.fencing_token):
            raise RuntimeError("a newer holder wrote: this one was superseded")
    ```

    The check and the write are one script: atomic, one round trip. An equal token is
    accepted (the same holder writing again), so writing again after an unknown outcome is
    safe. The key is a hash holding the value (field `value`) and the highest token (field
    `fence`): one key, so the token lives exactly as long as the data, on the same server
    or cluster slot (any key name works on a cluster). Read it with `fenced_get` (or
    `HGET key value`).

    Works with any fencing token that only grows: a `Lease`'s, a `Redlock`'s agreed one,
    an `Election` term's, one of a `MultiLease`'s `fencing_tokens` (the data of each name
    fenced with that name's token). Tokens of different lock names are not comparable:
    fence a key with the tokens of one name.

    Redis replicates asynchronously: a failover to a replica that had not received the
    last writes loses them, the highest token with them (both are in the one key), and a
    superseded holder's late write may then be accepted.

    Args:
        client: a `redis.asyncio.Redis` (one server, or Sentinel's `master_for`) or
            `RedisCluster`, or valkey-py's `Valkey` or `ValkeyCluster`; fakeredis's
            `FakeAsyncRedis` too (with its Lua extra).
        key: the data's key (a non-empty str). It must be a hash written by these
            functions, or not exist.
        value: `bytes` (or `bytearray`, `memoryview`), `str` (stored as UTF-8), `int` or
            `float` (stored as decimal text). Anything else, `bool` and None included,
            raises `TypeError`: encode it first.
        fencing_token: an int from 0 to 2**63 - 1 (a signed 64-bit integer, as SQL's
            BIGINT).
        ttl: seconds until the key (value and highest token) expires, from 0.001 to one
            year; None (the default): it does not expire, and an expiry it had is removed,
            as `SET` without `EX` does. Once the key has expired, a late write with any
            token is accepted: give a ttl longer than a superseded holder may write late,
            or none.
        timeout: seconds to wait for Redis's answer (default 5).

    Returns:
        True if written; False if refused (a higher token was accepted: nothing changed).

    Raises:
        TypeError: `client`, `key`, `value`, `fencing_token` or `ttl` of the wrong type.
        ConfigError: `key` empty, `key` or a str `value` not encodable as UTF-8,
            `fencing_token` out of range, `ttl` or `timeout` out of range; nothing was
            sent.
        BackendError: Redis could not be reached, did not answer within `timeout`, or
            refused the command (`key` holds another type: WRONGTYPE; its field `fence`
            is not a number). A timeout or a broken connection leaves the outcome unknown:
            the write may have been applied.

    Cancellation:
        A cancelled call may or may not have written: the script may have run before the
        cancellation landed. Writing again with the same token is safe: it is accepted
        again, unless a higher one came meanwhile.

    Added in 0.1.
    """
    key = _check_key(key)
    sent = _check_value(value)
    token = _check_token(fencing_token)
    ttl_ms = _milliseconds("ttl", ttl)
    reply = await _run(client, FENCED_SET, key, [token, sent, ttl_ms], timeout=timeout)
    return int(reply) == 1


async def fenced_delete(
    client: AsyncClient,
    key: str,
    fencing_token: int,
    *,
    keep: float | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> bool:
    """Remove the value at `key` if `fencing_token` is at least the highest token accepted
    for `key`; refuse it if a higher one was.

    The key's highest token stays (set to `fencing_token`), so that a superseded holder's
    late write, with a lower token, is still refused: deleting the whole key would forget
    it. `fenced_get` then reads no value and that token. A delete of a key that does not
    exist records the token all the same. One script, one round trip, as `fenced_set`.

    Args:
        client: as for `fenced_set`.
        key: as for `fenced_set`.
        fencing_token: as for `fenced_set`.
        keep: seconds the key keeps its highest token from now (0.001 to one year), after
            which it is gone; None (the default): the expiry it had stays, and a key that
            had none (or did not exist) keeps its token until it is written again or
            deleted by other means.
        timeout: seconds to wait for Redis's answer (default 5).

    Returns:
        True if deleted (or nothing was there, the token recorded); False if refused (a
        higher token was accepted: nothing changed).

    Raises:
        TypeError, ConfigError, BackendError: as for `fenced_set`.

    Cancellation:
        A cancelled call may or may not have deleted the value; deleting again with the
        same token is safe.

    Added in 0.1.
    """
    key = _check_key(key)
    token = _check_token(fencing_token)
    keep_ms = _milliseconds("keep", keep)
    reply = await _run(client, FENCED_DELETE, key, [token, keep_ms], timeout=timeout)
    return int(reply) == 1


async def fenced_get(
    client: AsyncClient, key: str, *, timeout: float = DEFAULT_TIMEOUT
) -> FencedValue:
    """The value at `key` and the highest fencing token accepted for it, read together.

    One round trip. Works on keys written by `fenced_set` and `fenced_delete`; a key that
    does not exist reads as no value and token 0.

    Args:
        client: as for `fenced_set`.
        key: as for `fenced_set`.
        timeout: seconds to wait for Redis's answer (default 5).

    Returns:
        A `FencedValue`: `value` (bytes, or None) and `fencing_token` (0 if none).

    Raises:
        TypeError, ConfigError: `client` or `key` (or `timeout`) refused; nothing sent.
        BackendError: Redis could not be reached, did not answer in time, or refused the
            command (`key` holds another type: WRONGTYPE).

    Cancellation:
        Safe to cancel: it only reads.

    Added in 0.1.
    """
    key = _check_key(key)
    value, fence = await _run(client, FENCED_GET, key, [], timeout=timeout)
    if isinstance(value, str):  # a client that decodes its replies: encoded back as it was
        value = check_client(client).get_encoder().encode(value)
    if isinstance(fence, bytes):
        fence = fence.decode()
    token = int(fence) if fence is not None and str(fence).isdigit() else 0
    return FencedValue(value=value, fencing_token=token)
