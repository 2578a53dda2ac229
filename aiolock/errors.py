"""The exceptions aiolock raises, all under one root.

```
AiolockError
├── ConfigError(AiolockError, ValueError)        .argument, .value
├── LockError                                    .name
│   ├── AcquireTimeoutError(LockError, TimeoutError)   .timeout, .waited, .attempts,
│   │                                                  .holder, .retry_after
│   └── LeaseLostError                           .reason, .fencing_token, .stalled_for,
│                                                .body_completed
└── BackendError                                 .operation, .name; __cause__ = the redis error
    ├── ReplicationError                         .replicas, .acknowledged
    └── QuorumError                              .quorum, .nodes
```

"Busy" and "broken" never share a class: a lock held by someone else for longer than you
were willing to wait is an `AcquireTimeoutError`; a Redis that cannot be reached, refuses
the command (ACL, OOM, READONLY) or does not answer in time is a `BackendError`, also while
waiting for a lock. `asyncio.CancelledError` is never wrapped.

Wrong *types* (a `bytes` name, a sync client) raise the builtin `TypeError`; wrong *values*
raise `ConfigError`, which is also a `ValueError`.
"""

from __future__ import annotations

import enum
import typing

if typing.TYPE_CHECKING:
    from ._model.holder import LockInfo

__all__ = (
    "AcquireTimeoutError",
    "AiolockError",
    "BackendError",
    "ConfigError",
    "LeaseLostError",
    "LockError",
    "LossReason",
    "QuorumError",
    "ReplicationError",
)


class AiolockError(Exception):
    """Root of every exception aiolock raises on purpose."""


class ConfigError(AiolockError, ValueError):
    """A value outside its accepted range, raised by the call that received it.

    Nothing has been written to Redis when this is raised.
    """

    def __init__(self, message: str, *, argument: str, value: object) -> None:
        super().__init__(message)
        self.argument = argument
        self.value = value


class LockError(AiolockError):
    """Something about one lock; `name` is the lock's name."""

    def __init__(self, message: str, *, name: str) -> None:
        super().__init__(message)
        self.name = name


class AcquireTimeoutError(LockError, TimeoutError):
    """The lock stayed held by someone else for the whole `timeout`.

    Redis answered every attempt: this is contention, not a failure. `timeout` is the
    timeout the caller passed (seconds; 0 for a single try), `waited` the seconds actually
    spent, and `attempts` the number of acquire attempts sent.

    What Redis knew when it last refused, where it is known (None otherwise):

    - `holder`: the holder at that moment, as a `LockInfo`;
    - `retry_after`: seconds until the lock may be free: what is left of the lock's
      typical hold when Redis knows it (a moving average over the holds that refused an
      acquire or handed the lock on; at least 1 ms, never more than the key's ttl left),
      else until the holder's key would expire unless renewed. A hint for a client to come
      back, such as an HTTP `Retry-After` header; not a promise: a long hold stays longer,
      a release frees it sooner.

    Code that stands in for a busy lock (in a test, say) builds one from the name alone:
    `AcquireTimeoutError(name="orders:42", timeout=0)`; the message is made from the rest.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        name: str,
        timeout: float = 0.0,
        waited: float | None = None,
        attempts: int = 1,
        holder: LockInfo | None = None,
        retry_after: float | None = None,
    ) -> None:
        if message is None:
            message = f"lock {name!r} not acquired within {timeout:g}s ({attempts} attempts)"
        super().__init__(message, name=name)
        self.timeout = timeout
        self.waited = timeout if waited is None else waited
        self.attempts = attempts
        self.holder = holder
        self.retry_after = retry_after


class LossReason(enum.Enum):
    """Why a lease stopped being held before it was released."""

    NOT_OWNER = "not_owner"
    """Redis answered that the key no longer holds this lease's token (it expired, was
    deleted, or another holder took it)."""

    DEADLINE = "deadline"
    """No renewal was confirmed before the local deadline: Redis was unreachable, too slow,
    or this process did not run (paused, event loop blocked) until after the deadline; or,
    with `replicas=N`, fewer than N replicas acknowledged the renewals (the cause is then a
    `ReplicationError`)."""

    MAX_HOLD = "max_hold"
    """Renewal stopped because the lease was held for longer than the lock's `max_hold`."""

    LOOP_CLOSED = "loop_closed"
    """The event loop the lease was acquired in was closed: nothing renews it any more, and
    nothing it guarded can run."""

    def __str__(self) -> str:
        return self.value


class LeaseLostError(LockError):
    """The lease ended without being released by its holder.

    Raised by `async with` when the body was cancelled because the lease was lost, or when the
    body finished after the lease was already gone (its last effects were unprotected), and by
    `Lease.extend()` / `Lease.release()` when Redis says the key is no longer this lease's.
    `reason` is a `LossReason`; `fencing_token` identifies the lost lease (both have
    defaults, so that code standing in for a loss can build one from the name alone). The underlying
    cause (a redis error, for example) is chained as `__cause__` where there is one.

    `stalled_for` is set when the deadline was missed because the event loop did not run
    (a blocking call, a paused process): at least that many seconds passed between the
    deadline and the moment this process could act. `body_completed`, for the error raised
    at the end of an `async with` block: True if the body ran to its end after the loss (its
    effects since were not protected), False if it was cancelled midway, None otherwise.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        name: str,
        reason: LossReason = LossReason.NOT_OWNER,
        fencing_token: int = 0,
        stalled_for: float | None = None,
        body_completed: bool | None = None,
    ) -> None:
        if message is None:
            message = f"lease on lock {name!r} (fencing token {fencing_token}) was lost: {reason}"
        super().__init__(message, name=name)
        self.reason = reason
        self.fencing_token = fencing_token
        self.stalled_for = stalled_for
        self.body_completed = body_completed


class BackendError(AiolockError):
    """Redis could not be used: unreachable, no answer in time, or the command was refused.

    `operation` names what aiolock was doing ("acquire", "release", "extend", "renew",
    "subscribe", "inspect"), `name` the lock concerned (None for work on many locks at once).
    The redis-py exception, if any, is `__cause__`.
    """

    def __init__(self, message: str, *, operation: str, name: str | None = None) -> None:
        super().__init__(message)
        self.operation = operation
        self.name = name


class ReplicationError(BackendError):
    """Fewer replicas than asked for (`replicas=N`) acknowledged a write in time.

    Raised by an acquire whose lock was taken on the primary but not confirmed by
    `replicas` replicas within the `replica_timeout`: the lock has been given back (a
    token-guarded release, as for an acquire whose reply was lost), and nothing runs under
    it. As the cause of a lease's loss, it says that its renewals could not be confirmed
    before its deadline. `acknowledged` is how many replicas did confirm.
    """

    def __init__(
        self,
        message: str,
        *,
        operation: str,
        name: str | None = None,
        replicas: int,
        acknowledged: int,
    ) -> None:
        super().__init__(message, operation=operation, name=name)
        self.replicas = replicas
        self.acknowledged = acknowledged


class QuorumError(BackendError):
    """A `Redlock`'s call could not gather a quorum of its servers, for or against.

    Too many of its nodes were unreachable, refused the command or did not answer within
    their `node_timeout`: neither "acquired" (or "renewed", "released") nor "held by
    someone else" can be told. An acquire that raises it has been given back on every node
    that granted it (a token-guarded abort, under a shield), and is given back in the
    background on those that had not answered yet (within their node timeout; as long as
    the ttl on those it reached, which may apply it later); nothing runs under it. As the cause of a lease's loss, it says that no quorum confirmed its renewals
    before its deadline.

    `quorum` is how many nodes must agree (N // 2 + 1); `nodes` maps each node ("host:port")
    to what it answered ("ok", "refused", ...), the error it raised ("error: ..."), or "not
    awaited" (the answer was known without it); `errors` maps each node that failed to its
    own error (a `BackendError`, whose cause is the redis-py exception). `__cause__` is one
    of them: a node's refusal that sending again would not cure (a wrong type, a
    permission, a script error) if there is one.

    Added in 0.1.
    """

    def __init__(
        self,
        message: str,
        *,
        operation: str,
        name: str | None = None,
        quorum: int,
        nodes: dict[str, str],
        errors: dict[str, BaseException] | None = None,
    ) -> None:
        super().__init__(message, operation=operation, name=name)
        self.quorum = quorum
        self.nodes = nodes
        self.errors: dict[str, BaseException] = {} if errors is None else errors
