"""Validation of user input and the frozen configuration of one lock.

Every check raises at the call that received the bad value: `TypeError` for a wrong type,
`ConfigError` (also a `ValueError`) for a value outside its range, naming the argument and
the accepted range. Nothing here touches Redis.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from .._lua.layout import ABORT_RETAIN_MS, RETAIN_CAP, RETAIN_DEFAULT, RETAIN_MIN
from ..errors import ConfigError
from .renewal_policy import default_interval, safety_margin

__all__ = (
    "MAX_IDENTITY_LENGTH",
    "MAX_NAMES",
    "MAX_NAME_LENGTH",
    "MAX_SECONDS",
    "MAX_VALUE_LENGTH",
    "MIN_TTL",
    "REPLY_TIMEOUT",
    "REPLY_TIMEOUT_MAX",
    "LockConfig",
    "check_identity",
    "check_limit",
    "check_name",
    "check_names",
    "check_prefix",
    "check_replicas",
    "check_timeout",
    "check_token",
    "check_value",
    "replica_wait_ms",
    "safety_margin",
)

MIN_TTL = 0.01
"""Shortest accepted ttl in seconds; below it the safety margin would eat the lease."""

MAX_SECONDS = 365 * 86400.0
"""Longest accepted ttl, renewal interval, timeout or max_hold, in seconds."""

MAX_NAME_LENGTH = 1000
"""Longest accepted lock name, in characters."""

MAX_NAMES = 1000
"""Most names a `MultiLock` takes."""

MAX_IDENTITY_LENGTH = 1000
"""Longest accepted identity of an election's candidate, in characters."""

MAX_VALUE_LENGTH = 65536
"""Longest accepted value an election's leader proclaims, in characters."""

SERVE_LAYOUT1_WAITERS = os.environ.get("AIOLOCK_SERVE_LAYOUT1_WAITERS", "") not in ("", "0")
"""Set (`AIOLOCK_SERVE_LAYOUT1_WAITERS=1`) while processes of an older version, which write
data layout 1, share locks with this one: every release then serves the wait queue even
when the state says nobody queued (one more command per release). See the README's
upgrade procedure."""


def _number(argument: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"{argument} must be a number of seconds (int or float), got {type(value).__name__}"
        )
    try:
        return float(value)
    except OverflowError:  # an int beyond float range is outside every accepted range
        return math.inf


def check_seconds(
    argument: str, value: object, *, minimum: float, maximum: float = MAX_SECONDS
) -> float:
    """A finite number of seconds in [minimum, maximum]."""
    seconds = _number(argument, value)
    if not math.isfinite(seconds) or not minimum <= seconds <= maximum:
        raise ConfigError(
            f"{argument} must be a finite number of seconds from {minimum:g} to "
            f"{maximum:g}, got {value!r}",
            argument=argument,
            value=value,
        )
    return seconds


def check_timeout(value: object, *, argument: str = "timeout") -> float | None:
    """None (wait forever), 0 (one attempt) or a finite positive number of seconds."""
    if value is None:
        return None
    seconds = _number(argument, value)
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_SECONDS:
        raise ConfigError(
            f"{argument} must be None (wait forever) or a finite number of seconds from 0 "
            f"to {MAX_SECONDS:g}, got {value!r}",
            argument=argument,
            value=value,
        )
    return seconds


_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def check_token(token: object) -> str:
    """A lease token chosen by the caller: 16 to 128 characters from [A-Za-z0-9_-]."""
    if not isinstance(token, str):
        raise TypeError(f"token must be a str, got {type(token).__name__}")
    if not 16 <= len(token) <= 128 or not _TOKEN_CHARS.issuperset(token):
        raise ConfigError(
            "token must be 16 to 128 characters from [A-Za-z0-9_-] (for example "
            f"secrets.token_hex(16)), got {token!r}",
            argument="token",
            value=token,
        )
    return token


MAX_REPLICAS = 100
"""Most replicas an acquire may wait for (`replicas=`)."""

REPLICA_TIMEOUT_CAP = 1.0
"""Longest default wait for the replicas' acknowledgement, in seconds."""

REPLY_TIMEOUT = 1.0
"""The default `reply_timeout`: the least time an acquire attempt gives Redis to answer."""
REPLY_TIMEOUT_MAX = 60.0
"""The longest `reply_timeout` accepted, in seconds."""


WAIT_LATENESS = 0.12
"""Seconds by which a server may answer a `WAIT` after its timeout: Redis checks blocked
clients' timeouts once per event-loop turn, which sleeps up to 1/hz (100 ms by default)."""


def replica_wait_ms(replica_timeout: float, bound: float) -> int:
    """The `WAIT` timeout, in ms, for a call bounded by `bound` seconds: the
    `replica_timeout`, but at most half the bound and WAIT_LATENESS short of it, so that
    WAIT's own answer (how many acknowledged) comes before the call is given up; never 0,
    which waits for ever."""
    return max(1, math.floor(min(replica_timeout, bound / 2, bound - WAIT_LATENESS) * 1000))


def check_replicas(value: object) -> int:
    """How many replicas must acknowledge: an int from 0 (none: the default) to MAX_REPLICAS."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"replicas must be an int, got {type(value).__name__}")
    if not 0 <= value <= MAX_REPLICAS:
        raise ConfigError(
            f"replicas must be an int from 0 to {MAX_REPLICAS}, got {value!r}",
            argument="replicas",
            value=value,
        )
    return value


MAX_LIMIT = 10_000
"""Largest accepted semaphore limit: each acquire reads every permit held."""


def check_limit(value: object, *, argument: str = "limit") -> int:
    """A semaphore's limit: an int from 1 to MAX_LIMIT."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, got {type(value).__name__}")
    if not 1 <= value <= MAX_LIMIT:
        raise ConfigError(
            f"{argument} must be an int from 1 to {MAX_LIMIT}, got {value!r}",
            argument=argument,
            value=value,
        )
    return value


def check_name(name: object) -> str:
    """A lock name: a non-empty `str` of at most MAX_NAME_LENGTH characters.

    Any text is accepted (it is stored UTF-8 encoded) except a name starting with "}", which
    would break the Redis Cluster hash tag that keeps one lock's keys in one slot.
    """
    if not isinstance(name, str):
        raise TypeError(
            f"name must be a str, got {type(name).__name__}"
            + (" (decode it first)" if isinstance(name, bytes | bytearray) else "")
        )
    if not name:
        raise ConfigError("name must not be empty", argument="name", value=name)
    if len(name) > MAX_NAME_LENGTH:
        raise ConfigError(
            f"name must be at most {MAX_NAME_LENGTH} characters, got {len(name)}",
            argument="name",
            value=name,
        )
    if name.startswith("}"):
        raise ConfigError(
            "name must not start with '}' (it would break the Redis Cluster hash tag)",
            argument="name",
            value=name,
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(
            "name must be encodable as UTF-8 (it contains a lone surrogate)",
            argument="name",
            value=name,
        ) from None
    return name


def check_names(names: object) -> tuple[str, ...]:
    """A `MultiLock`'s names: a collection (not a single `str`) of 1 to MAX_NAMES lock names,
    each as `check_name`; duplicates merged, sorted (the order every holder takes them in)."""
    if isinstance(names, str | bytes | bytearray) or not isinstance(names, Iterable):
        raise TypeError(
            "names must be a collection of lock names (a list, a set...), got "
            f"{type(names).__name__}"
            + (": wrap a single name in a list" if isinstance(names, str) else "")
        )
    unique = {check_name(name) for name in names}
    if not 1 <= len(unique) <= MAX_NAMES:
        raise ConfigError(
            f"names must hold 1 to {MAX_NAMES} distinct names, got {len(unique)}",
            argument="names",
            value=names,
        )
    return tuple(sorted(unique))


def _check_text(argument: str, value: object, maximum: int, *, empty: bool) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, got {type(value).__name__}")
    if not (0 if empty else 1) <= len(value) <= maximum:
        raise ConfigError(
            f"{argument} must be {0 if empty else 1} to {maximum} characters, got {len(value)}",
            argument=argument,
            value=value,
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(
            f"{argument} must be encodable as UTF-8 (it contains a lone surrogate)",
            argument=argument,
            value=value,
        ) from None
    return value


def check_identity(identity: object) -> str:
    """An election candidate's identity: 1 to MAX_IDENTITY_LENGTH characters of text."""
    return _check_text("identity", identity, MAX_IDENTITY_LENGTH, empty=False)


def check_value(value: object) -> str | None:
    """A value a leader proclaims: None, or 0 to MAX_VALUE_LENGTH characters of text."""
    return None if value is None else _check_text("value", value, MAX_VALUE_LENGTH, empty=True)


def check_prefix(prefix: object) -> str:
    """A key prefix: non-empty text without braces or whitespace, at most 100 characters."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if not prefix or len(prefix) > 100 or any(c in prefix for c in "{} \t\r\n"):
        raise ConfigError(
            f"prefix must be 1 to 100 characters with no braces or whitespace, got {prefix!r}",
            argument="prefix",
            value=prefix,
        )
    return prefix


@dataclass(frozen=True, slots=True, kw_only=True)
class LockConfig:
    """The validated settings of one `Lock`; shared by every lease it grants."""

    ttl: float
    renew_interval: float | None
    timeout: float | None
    max_hold: float | None
    prefix: str
    retain: float = RETAIN_DEFAULT
    hold_stats: bool = False
    serve_layout1: bool = SERVE_LAYOUT1_WAITERS
    replicas: int = 0
    """Replicas that must acknowledge each acquire and renewal (`WAIT`) before it counts."""
    replica_timeout: float = 0.0
    """Longest wait for that acknowledgement, in seconds (0 when `replicas` is 0)."""
    renew_on_handoff: bool = True
    """Whether a lease handed over by another process's release (a grant shorter than the
    ttl) is renewed to the full ttl before the block starts, or left to the watchdog."""
    reply_timeout: float = REPLY_TIMEOUT
    """The least time an acquire attempt gives Redis to answer, its own timeout reached or
    not (`REPLY_TIMEOUT` by default)."""
    drift: float | None = None
    """Seconds subtracted from a lease's validity instead of the safety margin (a
    `Redlock`'s `drift`); None: the safety margin."""
    ttl_ms: int = field(init=False)
    """The ttl sent to Redis, rounded up so the server never expires before we think."""
    margin: float = field(init=False)
    retain_ms: int | None = field(init=False)
    """The retention a release sets, or None when the released lease's own expiry serves
    (its ttl is between `retain` and RETAIN_CAP): one command less per release."""
    abort_retain_ms: int = field(init=False)
    """How long the state lives (unless held) after an abort recorded an acquire's token:
    twice the ttl, at least `retain`, at most ABORT_RETAIN_MS. Every copy of the acquire
    is written within its call's bound (shorter than the ttl) and before the abort, so
    the record outlives them by a ttl."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ttl_ms", math.ceil(self.ttl * 1000))
        margin = safety_margin(self.ttl) if self.drift is None else self.drift
        object.__setattr__(self, "margin", margin)
        own_expiry = self.retain <= self.ttl <= RETAIN_CAP
        object.__setattr__(self, "retain_ms", None if own_expiry else math.ceil(self.retain * 1000))
        abort_ms = max(math.ceil(self.retain * 1000), min(2 * self.ttl_ms, ABORT_RETAIN_MS))
        object.__setattr__(self, "abort_retain_ms", abort_ms)

    def wait_args(self, bound: float) -> tuple[int, int] | None:
        """WAIT's arguments for a call bounded by `bound` seconds: (replicas, ms), or None
        without `replicas`. See `replica_wait`."""
        if not self.replicas:
            return None
        return self.replicas, replica_wait_ms(self.replica_timeout, bound)

    @staticmethod
    def cached(**arguments: object) -> LockConfig:
        """`build`, remembered for recently used argument values: a Lock per request is the
        usual pattern, and its arguments rarely change."""
        try:
            return _cached_build(**arguments)
        except TypeError as exc:  # an unhashable argument: validate it the slow way
            if "unhashable" not in str(exc):
                raise
        return LockConfig.build(**arguments)

    @classmethod
    def build(
        cls,
        *,
        ttl: object,
        renew: object,
        renew_interval: object,
        timeout: object,
        max_hold: object,
        prefix: object,
        retain: object = RETAIN_DEFAULT,
        hold_stats: object = False,
        replicas: object = 0,
        replica_timeout: object = None,
        renew_on_handoff: object = True,
        reply_timeout: object = REPLY_TIMEOUT,
    ) -> LockConfig:
        ttl_s = check_seconds("ttl", ttl, minimum=MIN_TTL)
        if not isinstance(renew, bool):
            raise TypeError(f"renew must be a bool, got {type(renew).__name__}")
        interval: float | None = None
        if renew:
            if renew_interval is None:
                interval = default_interval(ttl_s)
            else:
                interval = _number("renew_interval", renew_interval)
                validity = ttl_s - safety_margin(ttl_s)
                if not math.isfinite(interval) or not 0 < interval < validity:
                    raise ConfigError(
                        f"renew_interval must be more than 0 and less than the ttl minus its "
                        f"safety margin ({validity:g}s for ttl={ttl_s:g}), got "
                        f"{renew_interval!r}",
                        argument="renew_interval",
                        value=renew_interval,
                    )
        elif renew_interval is not None:
            raise ConfigError(
                "renew_interval cannot be set when renew=False",
                argument="renew_interval",
                value=renew_interval,
            )
        hold = None if max_hold is None else check_seconds("max_hold", max_hold, minimum=ttl_s)
        if not isinstance(hold_stats, bool):
            raise TypeError(f"hold_stats must be a bool, got {type(hold_stats).__name__}")
        needed = check_replicas(replicas)
        if replica_timeout is None:
            wait = min(ttl_s / 4, REPLICA_TIMEOUT_CAP) if needed else 0.0
        elif not needed:
            raise ConfigError(
                "replica_timeout cannot be set when replicas=0",
                argument="replica_timeout",
                value=replica_timeout,
            )
        else:
            wait = check_seconds(
                "replica_timeout", replica_timeout, minimum=0.001, maximum=ttl_s / 2
            )
        if not isinstance(renew_on_handoff, bool):
            raise TypeError(
                f"renew_on_handoff must be a bool, got {type(renew_on_handoff).__name__}"
            )
        if not renew_on_handoff and needed:
            raise ConfigError(
                "renew_on_handoff=False cannot be combined with replicas: a handed-over "
                "lease counts only once the replicas have its renewal",
                argument="renew_on_handoff",
                value=renew_on_handoff,
            )
        return cls(
            ttl=ttl_s,
            renew_interval=interval,
            timeout=check_timeout(timeout),
            max_hold=hold,
            prefix=check_prefix(prefix),
            retain=check_seconds("retain", retain, minimum=RETAIN_MIN, maximum=86400.0),
            hold_stats=hold_stats,
            replicas=needed,
            replica_timeout=wait,
            renew_on_handoff=renew_on_handoff,
            reply_timeout=check_seconds(
                "reply_timeout", reply_timeout, minimum=0.01, maximum=REPLY_TIMEOUT_MAX
            ),
        )


# typed=True: True and 1, or 1 and 1.0, are equal keys but not equally valid arguments.
_cached_build = functools.lru_cache(maxsize=128, typed=True)(LockConfig.build)
