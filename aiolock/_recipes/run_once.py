"""`run_once`: a job that runs once per key across every process, with a done marker.

A lock alone makes runs *exclusive*, not *unique*: when several servers start tonight's
job a little apart, the second one gets the lock after the first released it and runs the
job again. `run_once` adds a done marker, written under the lock when the job finishes
while the lease is still valid, and checked before and after taking the lock.

Keys (prefix `aiolock`, job key JOB): the lock `once:JOB` (its keys are the layout's, such
as `aiolock:{once:JOB}`), and the marker `aiolock:{once:JOB}:done`, a string with a JSON
object (`finished_at`, `host`, `pid`, `fencing_token`), expiring after `retention`.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import json
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar, Unpack, cast, final

from .._engine.lease import Lease
from .._model.config import MAX_NAME_LENGTH, MAX_SECONDS, check_seconds
from .._model.holder import LockInfo
from .._model.options import LockOptions, lock_config
from .._primitives.lock import Lock
from .._primitives.redlock import Redlock, check_clients
from .._transport.backend import Backend
from .._transport.clients import AsyncClient, AsyncRedis, check_client, translate_errors
from .._transport.quorum import Votes
from ..errors import AcquireTimeoutError, ConfigError

__all__ = (
    "NAME_PREFIX",
    "DoneMarker",
    "Markers",
    "OnceResult",
    "OnceStatus",
    "check_job_key",
    "check_node_timeout",
    "done_marker",
    "run_once",
    "takes_lease",
)

T = TypeVar("T")

NAME_PREFIX: Final = "once:"
_MARKER_TIMEOUT: Final = 5.0
"""Longest wait for Redis to answer a marker read or write, seconds."""


class OnceStatus(enum.Enum):
    """What `run_once` did."""

    RAN = "ran"
    """This call ran the job, and it finished while the lease was valid: marked done."""
    ALREADY_DONE = "already_done"
    """The job's done marker was there (before or after taking the lock): not run."""
    RUNNING_ELSEWHERE = "running_elsewhere"
    """Another process held the job's lock for the whole `timeout`: not run here."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DoneMarker:
    """The record of a finished job, as stored in Redis."""

    finished_at: float
    """Unix seconds (the finishing process's clock)."""
    host: str
    pid: int
    fencing_token: int
    """The fencing token of the lease the job ran under."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class OnceResult(Generic[T]):
    """The outcome of `run_once`.

    Added in 0.1.
    """

    status: OnceStatus
    job_key: str
    value: T | None = None
    """What the job returned (status RAN), else None."""
    marker: DoneMarker | None = None
    """The marker written (RAN) or found (ALREADY_DONE), else None."""
    holder: LockInfo | None = None
    """RUNNING_ELSEWHERE: the lock's holder when it was last refused, where known."""

    @property
    def ran(self) -> bool:
        """True if this call ran the job."""
        return self.status is OnceStatus.RAN


def check_job_key(job_key: object) -> str:
    if not isinstance(job_key, str):
        raise TypeError(f"job_key must be a str, got {type(job_key).__name__}")
    limit = MAX_NAME_LENGTH - len(NAME_PREFIX)
    if not job_key or len(job_key) > limit:
        raise ConfigError(
            f"job_key must be 1 to {limit} characters, got {len(job_key)}",
            argument="job_key",
            value=job_key,
        )
    return job_key


def _is_async(fn: object) -> bool:
    """Whether calling `fn` is sure to return a coroutine: an `async def` function or
    method, a `functools.partial` of one (nested too), a function marked with
    `inspect.markcoroutinefunction` (Python 3.12), or an object whose class's `__call__`
    is one."""
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - what calling the object runs
    return not isinstance(fn, type) and inspect.iscoroutinefunction(call)


def _is_lambda(fn: object) -> bool:
    """Whether `fn` is a lambda (or a `functools.partial` of one): an expression, such as
    `lambda: job(order_id)`, whose result is checked when it is called."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.isfunction(fn) and fn.__name__ == "<lambda>"


def _check_fn(fn: Callable[..., object]) -> bool:
    """`TypeError` unless `fn` is async (see `_is_async`) or a lambda; whether it is called
    with the lease (one required positional parameter) or with nothing.

    Anything else (a plain `def`, a builtin, an object with a plain `__call__`, an async
    generator function) would run the job, or fail, only once called under the lock: it
    is refused before anything is sent to Redis."""
    if not _is_async(fn) and not _is_lambda(fn):
        if inspect.isasyncgenfunction(fn):
            what = f"the async generator function {fn.__qualname__}"
        elif inspect.isfunction(fn) or inspect.ismethod(fn):
            what = f"the plain function {fn.__qualname__}"
        else:
            what = f"{type(fn).__name__} {fn!r}"[:200]
        raise TypeError(
            "fn must be an async function (async def), a functools.partial of one, an "
            "object with an async __call__, or a lambda returning a coroutine, got "
            f"{what}; make it async def"
        )
    return takes_lease(fn)


def takes_lease(fn: Callable[..., object]) -> bool:
    """Whether a job `fn` is called with the lease (one required positional parameter) or
    with nothing (none, or no signature to read); `TypeError` if it requires more. Shared
    by `aiolock.sync.run_once`."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (a builtin): call it bare
        return False
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(positional) > 1:
        raise TypeError(
            "fn must take no arguments, or one (the Lease), got "
            f"{len(positional)} required positional parameters"
        )
    return len(positional) == 1


def check_node_timeout(several: bool, node_timeout: float | None) -> None:
    """`node_timeout` is a Redlock's setting: refused with one client (`ConfigError`)."""
    if node_timeout is not None and not several:
        raise ConfigError(
            "node_timeout is taken with a list of clients (a Redlock's servers), not with "
            "one client",
            argument="node_timeout",
            value=node_timeout,
        )


def done_marker(fencing_token: int) -> tuple[DoneMarker, str]:
    """The marker of a job finished now by this process under `fencing_token`, and its
    stored form."""
    marker = DoneMarker(
        finished_at=time.time(),
        host=socket.gethostname(),
        pid=os.getpid(),
        fencing_token=fencing_token,
    )
    payload = json.dumps(
        {
            "finished_at": marker.finished_at,
            "host": marker.host,
            "pid": marker.pid,
            "fencing_token": marker.fencing_token,
        }
    )
    return marker, payload


def _parse_marker(raw: bytes | str | None) -> DoneMarker | None:
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return DoneMarker(
            finished_at=float(data["finished_at"]),
            host=str(data["host"]),
            pid=int(data["pid"]),
            fencing_token=int(data["fencing_token"]),
        )
    except (ValueError, KeyError, TypeError):
        # Written by something else, or a future format: it still says "done".
        return DoneMarker(finished_at=0.0, host="", pid=0, fencing_token=0)


class Markers:
    """Where the done marker lives: one client's server, each call bounded by
    _MARKER_TIMEOUT; or a Redlock's nodes, through its quorum (written to every node,
    stored once a majority stored it; read from every node, done as soon as one has it,
    not done once a majority answered without it; each node's call bounded by the node
    timeout, a slow or failed minority's left to end in the background)."""

    __slots__ = ("backend", "client", "key", "name")

    def __init__(self, lock: Lock | Redlock, client: AsyncClient) -> None:
        self.client = cast(AsyncRedis, client)  # (a cluster client reads and writes alike)
        self.backend = lock._nodes_backend() if isinstance(lock, Redlock) else None
        self.key, self.name = f"{lock.key}:done", lock.name

    async def read(self) -> DoneMarker | None:
        operation = "read the done marker"
        if self.backend is None:
            with translate_errors(operation, self.name, _MARKER_TIMEOUT):
                async with asyncio.timeout(_MARKER_TIMEOUT):
                    return _parse_marker(await self.client.get(self.key))
        quorum = self.backend.size

        def decided(replies: Votes, pending: int) -> bool:
            absent = sum(1 for raw in replies.values() if raw is None)
            return absent < len(replies) or absent >= quorum or absent + pending < quorum

        replies = await self._each(decided, operation, "GET", self.key)
        found = [raw for raw in replies.values() if raw is not None]
        return _parse_marker(found[0]) if found else None

    async def write(self, payload: str, px: int) -> None:
        operation = "write the done marker"
        if self.backend is None:
            with translate_errors(operation, self.name, _MARKER_TIMEOUT):
                async with asyncio.timeout(_MARKER_TIMEOUT):
                    await self.client.set(self.key, payload, px=px)
            return
        quorum = self.backend.size

        def decided(replies: Votes, pending: int) -> bool:
            return len(replies) >= quorum or len(replies) + pending < quorum

        await self._each(decided, operation, "SET", self.key, payload, "PX", px)

    async def _each(
        self, decided: Callable[[Votes, int], bool], operation: str, *command: str | int
    ) -> Votes:
        """`command` on every node, until `decided`: the replies; `QuorumError` if the
        answers decide nothing (fewer than a majority answered)."""
        backend = self.backend
        assert backend is not None

        def send(index: int, node: Backend, timeout: float) -> Awaitable[Any]:
            return node.command(
                *command, timeout=timeout, operation=operation, name=self.name, again_apart=True
            )

        replies, errors = await backend.spread(
            send, decided, bound=backend.node_timeout, operation=operation, name=self.name
        )
        found = any(raw is not None for raw in replies.values())
        if len(replies) < backend.size and not (command[0] == "GET" and found):
            what = "fewer than a quorum answered"
            raise backend.no_quorum(
                what, replies, errors, _stored, operation=operation, name=self.name
            )
        return replies


def _stored(reply: Any) -> str:
    """What a node's answer to a marker's read or write says (for `QuorumError.nodes`)."""
    return "absent" if reply is None else "ok"


async def run_once(
    client: AsyncClient | Sequence[AsyncClient],
    job_key: str,
    fn: Callable[[], Awaitable[T]] | Callable[[Lease], Awaitable[T]],
    *,
    retention: float,
    node_timeout: float | None = None,
    **options: Unpack[LockOptions],
) -> OnceResult[T]:
    """Run `fn` unless the job `job_key` is done or running elsewhere; mark it done.

    ```python
    day = datetime.date.today().isoformat()
    result = await run_once(redis, f"nightly-report:{day}", send_report, retention=2 * 86400)
    if result.status is OnceStatus.ALREADY_DONE: ...
    ```

    In order: if the done marker exists, ALREADY_DONE. Otherwise take the lock `once:JOB`
    (waiting up to `timeout`; still held by another process then: RUNNING_ELSEWHERE) and
    look for the marker again (the job may have finished between the two looks). Then run
    `fn` guarded by the lease, confirm that the lease is still this process's (one
    token-guarded renewal), write the marker with an expiry of `retention`, release: RAN.

    One key per run: a key per period (`report:2026-11-23`) runs once per period, a key
    per id (`welcome-mail:user-42`) once per id. Keep the marker (`retention`) for at
    least as long as another process may still start the same key: a daily job started by
    cron on several servers needs more than the spread of their start times, and a day is
    a safe choice.

    Exactly once holds as long as the process that finished the job lives to write the
    marker (one command after the job). If it dies in between, or the write fails, the job
    is not marked and runs again on the next try: make its effects idempotent, or fence
    them with the lease's `fencing_token`, for that window.

    Args:
        client: a `redis.asyncio.Redis` or `RedisCluster` (or valkey-py's
            `valkey.asyncio.Valkey` or `ValkeyCluster`); or a list or tuple of clients of
            independent servers: the job's lock is then a `Redlock` over them, and the
            marker is decided on a majority, the rest in the background: written to every
            node (stored once a majority stored it), read from every node (done as soon
            as one has it, not done once a majority answered without it; `QuorumError`
            if fewer than a majority answer), each node's call bounded by `node_timeout`.
        job_key: the job's identity for this run (1 to 995 characters).
        fn: the job, called with no arguments, or with one: the `Lease` (for its
            `fencing_token`). An `async def` function or method, a `functools.partial`
            of one (to pass arguments), an object with an `async def __call__`, or a
            lambda returning a coroutine (`lambda: job(order_id)`). Anything else, a plain
            `def` first, is refused with `TypeError` before anything is sent to Redis;
            a lambda's result is checked when it is called, under the lock: one that is
            not awaitable raises `TypeError` there (released, not marked done).
        retention: seconds the done marker is kept (0.001 to 1 year).
        node_timeout: with a list of clients, the `Redlock`'s `node_timeout`: seconds each
            node's call may take (its lock's and its markers'); default None, as
            `Redlock`'s. Refused with one client (`ConfigError`).
        options: the settings of the job's `Lock`, `LockOptions`, with their defaults but
            one: `timeout`, the seconds to wait for a job running elsewhere, is 0 (do not
            wait). After a wait, a job that finished there is ALREADY_DONE, and one that
            failed there runs here. `ttl`, `renew`, `renew_interval`, `timeout`,
            `max_hold`, `prefix`, `retain`, `hold_stats`, `replicas`, `replica_timeout`.

    Returns:
        An `OnceResult`: `status`, and `value` (what `fn` returned) when it ran.

    Raises:
        LeaseLostError: the lease was lost while `fn` ran (it was cancelled) or before the
            marker could be written: not marked done.
        BackendError: Redis could not be reached; if `fn` ran, it is not marked done.
        TypeError, ConfigError: bad arguments, before anything is sent to Redis (a job
            that is not async included).
        Whatever `fn` raised: not marked done (the next try runs it again).

    Cancellation:
        A cancelled call leaves no lock held and writes no marker.

    Added in 0.1.
    """
    several = isinstance(client, (list, tuple))
    clients = check_clients(client) if several else (check_client(client),)
    job_key = check_job_key(job_key)
    pass_lease = _check_fn(fn)
    retention_s = check_seconds("retention", retention, minimum=0.001, maximum=MAX_SECONDS)
    lock_config("run_once()", options, timeout=0)
    settings: LockOptions = {"timeout": 0, **options}
    lock: Lock | Redlock
    check_node_timeout(several, node_timeout)
    if several:
        lock = Redlock(clients, NAME_PREFIX + job_key, node_timeout=node_timeout, **settings)
    else:
        lock = Lock(clients[0], NAME_PREFIX + job_key, **settings)
    markers = Markers(lock, clients[0])
    read_marker = markers.read

    found = await read_marker()
    if found is not None:
        return OnceResult(status=OnceStatus.ALREADY_DONE, job_key=job_key, marker=found)
    try:
        lease = await lock.acquire()
    except AcquireTimeoutError as exc:
        return OnceResult(status=OnceStatus.RUNNING_ELSEWHERE, job_key=job_key, holder=exc.holder)
    async with lease:
        found = await read_marker()
        if found is not None:
            return OnceResult(status=OnceStatus.ALREADY_DONE, job_key=job_key, marker=found)
        job = fn(lease) if pass_lease else fn()  # type: ignore[call-arg]
        if not inspect.isawaitable(job):  # a lambda that did its work: not marked done
            raise TypeError(
                f"fn must return an awaitable (a lambda returning a coroutine), got "
                f"{type(job).__name__} from {fn!r}"[:300]
            )
        value = await job
        # Still ours? (LeaseLostError if not: no marker.) The renewal also gives the write
        # below a full ttl to land in while the lease is valid.
        await lease.extend()
        marker, payload = done_marker(lease.fencing_token)
        await markers.write(payload, max(1, round(retention_s * 1000)))
    return OnceResult(status=OnceStatus.RAN, job_key=job_key, value=value, marker=marker)
