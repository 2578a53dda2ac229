"""`LockOptions`: the settings of a leased primitive, declared once for every constructor and
helper that takes them (`Lock`, `Semaphore`, `ReadWriteLock`, `MultiLock`, `@locked`,
`run_once`, `locked_request`, `locked_handler`), and their defaults."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, TypedDict

from .._lua.layout import RETAIN_DEFAULT
from .config import REPLY_TIMEOUT, LockConfig

__all__ = ("DEFAULTS", "LockOptions", "lock_config", "lock_options")


class LockOptions(TypedDict, total=False):
    """The settings every leased primitive and helper takes as keyword arguments, in this
    order, with the same names, meanings and defaults everywhere:

    ```python
    options: LockOptions = {"ttl": 10, "timeout": 0}
    lock = Lock(redis, "orders:42", **options)
    ```

    Attributes:
        ttl: seconds a lease's key lives without renewal (0.01 to 1 year). Default 30.
            Bounds how long a crashed holder blocks others.
        renew: renew each lease in the background while it is held. Default True.
        renew_interval: seconds between renewals; default None: a third of the ttl. Must
            be less than the ttl minus its safety margin; only with `renew`.
        timeout: seconds `async with` and `acquire()` wait; None (the default) waits
            forever, 0 tries once. Default 0 for `run_once`, `locked_request` and
            `locked_handler`, which fail fast.
        max_hold: seconds (≥ ttl) after which renewal stops, so that a hung holder keeps
            its lease at most this long (`LossReason.MAX_HOLD`). Default None: no limit.
        prefix: prefix of every Redis key (see ARCHITECTURE.md for the layout). Default
            "aiolock".
        retain: seconds (5 to 86400) the state (the last fencing token and the records
            that recognise late copies of commands) stays after a release. Default 10.
        hold_stats: record every hold's duration for `aiolock stats` and `hold_stats()`
            (one more command per release). Default False.
        replicas: replicas (0 to 100) that must acknowledge each acquire and renewal
            (`WAIT`) before it counts. Default 0: none.
        replica_timeout: seconds (0.001 to ttl/2) to wait for those acknowledgements;
            default None: a quarter of the ttl, at most 1 s. Only with `replicas`.
        renew_on_handoff: renew a lease handed over by another process's release to the
            full ttl before the block starts (one command, not awaited). Default True: a
            stall of up to about 2/3 of the ttl right after the hand-off is survived. False
            saves that command on every hand-off between processes; the lease then holds
            the grant's 0.9 s until the watchdog renews it (within 0.3 s), so a stall of
            more than about half a second right after the hand-off can lose it. A crashed
            process still blocks the others for at most 1 s either way. Not with
            `replicas` (a handed-over lease counts only once they have its renewal).
        reply_timeout: seconds (0.01 to 60) an acquire attempt gives Redis to answer, even
            when the acquire's own `timeout` is shorter or 0 (a try): connecting and the
            server's reply within it, else `BackendError` ("no reply from Redis within
            ..."). Default 1. A web handler's try on a loaded host may need more; an
            attempt never outlives the lease it asks for (the ttl minus its margin).

    An `Election` takes five of them as its own keywords, with the same meanings: `ttl`
    (default 10 there), `renew_interval`, `prefix`, `replicas` and `replica_timeout` (a
    term is always renewed, and a candidate waits as long as its campaign runs).

    A type checker checks the names and types of these keywords at every call (PEP 692);
    at run time an unknown keyword raises `TypeError` and a value out of range
    `ConfigError` naming the argument and the range, at the call.

    Added in 0.1.
    """

    ttl: float
    renew: bool
    renew_interval: float | None
    timeout: float | None
    max_hold: float | None
    prefix: str
    retain: float
    hold_stats: bool
    replicas: int
    replica_timeout: float | None
    renew_on_handoff: bool
    reply_timeout: float


DEFAULTS: Final[LockOptions] = {
    "ttl": 30.0,
    "renew": True,
    "renew_interval": None,
    "timeout": None,
    "max_hold": None,
    "prefix": "aiolock",
    "retain": RETAIN_DEFAULT,
    "hold_stats": False,
    "replicas": 0,
    "replica_timeout": None,
    "renew_on_handoff": True,
    "reply_timeout": REPLY_TIMEOUT,
}
"""Each setting's default, for a `Lock`, a `Semaphore`, a `ReadWriteLock`, a `MultiLock` and
`@locked` (the other helpers override `timeout`)."""

_NAMES: Final = frozenset(LockOptions.__annotations__)


def lock_options(where: str, given: Mapping[str, object], **overrides: object) -> dict[str, object]:
    """Every setting: those `given` at a call of `where` (a name such as "Lock()"), else the
    call's `overrides` of the defaults, else the defaults. An unknown keyword raises
    `TypeError` as Python does for a function that does not take it."""
    for key in given:
        if key not in _NAMES:
            raise TypeError(f"{where} got an unexpected keyword argument {key!r}")
    return {**DEFAULTS, **overrides, **given}


def lock_config(where: str, given: Mapping[str, object], **overrides: object) -> LockConfig:
    """The validated configuration of the settings `given` at a call of `where` (see
    `lock_options`); a value out of range raises `ConfigError` naming the argument."""
    return LockConfig.cached(**lock_options(where, given, **overrides))
