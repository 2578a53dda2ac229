"""What every leased primitive is made of: its calls, and what their replies mean.

`PrimitiveBase` holds a primitive's client, name, configuration and keys, the calls it
supplies (acquire, release, renew, resume: a script, its keys and its arguments, in the
common conventions of `_lua.lock`), and the reading of their replies (a release's
`Released`, a refusal's `Busy`, a timeout's `AcquireTimeoutError`). The release path
(`_engine.release`), the leases taken from grants (`_engine.lease_issuing`) and the acquisition (`_engine.acquisition`)
build on it, one layer each.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, NamedTuple, final

from .._aio.task_blocks import Blocks
from .._lua.layout import GRANT_MS
from .._lua.lease import RENEW, RENEW_HOLDER, RESUME
from .._lua.lock import Join, Script, release_args, released
from .._model import events
from .._model.config import LockConfig
from .._model.holder import HOST, LockInfo, pid, text
from .._model.quorum_rules import Rule, VoteRules
from .._transport.call_options import CallOptions
from .._transport.clients import AsyncClient, is_cluster
from .._transport.quorum import Quorum
from ..errors import AcquireTimeoutError, ConfigError, ReplicationError
from .lease import Lease
from .runtime import Runtime, runtime_for
from .wait_queue import Registration, Released

RELEASED_ALONE: Final = Released(1, "", "", "", 0)
"""A release that handed the lock to nobody: what the uncontended path's reply (1) means."""

__all__ = (
    "UNSET",
    "Attempt",
    "Busy",
    "Call",
    "PrimitiveBase",
    "Unset",
    "busy_hint",
    "check_within_ms",
)

Call = tuple[Script, Sequence[str], list[str | int]]
"""One script call: the script, its KEYS and its ARGV."""


class Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<the primitive's timeout>"


UNSET: Final = Unset()


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Busy:
    """Someone else holds it: what Redis said when it refused a single try.

    Added in 0.1.
    """

    name: str
    holder: LockInfo | None
    """The holder, when the refusal named one (not for a lock kept for a queued process)."""
    retry_after: float | None
    """Seconds until it may be free: what is left of its typical hold when that is known
    (see `AcquireTimeoutError.retry_after`), else until the holder's key expires unless
    renewed. A hint, not a promise."""


class Attempt(NamedTuple):
    """What one acquire attempt got: a lease, or what Redis said when it refused (a tuple:
    one is made per attempt, and a frozen dataclass's fields cost a call each to set)."""

    lease: Lease | None
    pttl_ms: int
    busy: Sequence[Any] = ()
    """An answer "held": {0, pttl, fencing token, holder, acquired ms, ttl ms, typical}."""
    free: int = 0
    """Leases still free after this one was acquired (a semaphore's permits)."""


def check_within_ms(busy: Sequence[Any]) -> int:
    """When a waiting head checks the lock again unless told of a release, from an answer
    "held" (see ACQUIRE): the holder's remaining ttl, or sooner if grants are being told to
    their processes alone (`check`); <= 0 if neither is known."""
    pttl_ms = int(busy[1])
    check = text(busy[7]) if len(busy) > 7 else ""
    if check.isdigit():
        return min(pttl_ms, int(check)) if pttl_ms > 0 else int(check)
    return pttl_ms


def busy_hint(name: str, busy: Sequence[Any]) -> tuple[LockInfo | None, float | None]:
    """The holder and a retry hint (seconds) from an answer "held" (see ACQUIRE).

    The hint is the holder's typical remaining hold when the lock's typical hold is known
    (what is left of it, at least 1 ms, never more than the key's remaining ttl), else the
    key's ttl. The typical hold is a moving average (1/8 each) over the holds whose
    release handed the lock on, or that refused an acquire of a caller that did not queue
    (a single try: each such hold is marked by the refusal, see ACQUIRE, and measured by
    its release): a lock only ever tried once, as a web endpoint's, learns it too.
    """
    if len(busy) < 7:
        return None, None
    pttl_ms = int(busy[1])
    fence, holder, acquired, ttl, typical = (text(value) for value in busy[2:7])
    info = None
    if fence and holder:
        info = LockInfo.of(
            name, fence=fence, holder=holder, acquired_ms=acquired, ttl_ms=ttl, pttl_ms=pttl_ms
        )
    if pttl_ms < 0:
        return info, None
    hint = pttl_ms / 1000
    if typical.isdigit() and info is not None and acquired.isdigit():
        held = max(time.time() - int(acquired) / 1000, 0.0)
        hint = min(hint, max(int(typical) / 1000 - held, 0.001))
    return info, hint


class PrimitiveBase(abc.ABC):
    """A named primitive on one Redis server whose holders get `Lease`s: its state, its
    calls and the reading of their replies.

    Subclasses call `__init__` with their client, name, configuration and keys, set the
    class attributes below, and supply `_acquire_call`.
    """

    __slots__ = ("_channel", "_client", "_config", "_held", "_key", "_name", "_release_keys")

    _what: ClassVar[str] = "lock"
    """What the primitive is called in messages."""
    _release_script: ClassVar[Script]
    """The release script: RELEASE's ARGV and replies (see `_lua.lock`)."""
    _renew_kind: ClassVar[str] = ""
    """How `_key` holds a lease, for RENEW and RESUME (see `_lua.lock`)."""
    _exclusive: ClassVar[bool] = True
    """One holder at a time (else, once a waiter got in, the next may get in too)."""
    _guard_reentry: ClassVar[bool] = True
    """A task that holds it and waits for it again would wait forever: refused."""
    _requeued_on_grant: ClassVar[bool] = False
    """The scripts put a queue that was granted a lease back in line (a semaphore's)."""
    _direct_grants: ClassVar[bool] = False
    """The release script tells a grant to a queue whose id says so on its process's own
    channel (RELEASE's, see DIRECT_PREFIX): its queues listen there too."""
    _oldest_first: ClassVar[bool] = False
    """A release that puts this process's queue in line tells how long its oldest waiter has
    waited, and the release script serves the oldest waiter of any process first
    (RELEASE's ARGV[9])."""
    _hands_over: ClassVar[bool] = False
    """A release of this process hands its lease straight to a task of this process waiting
    for one, in the same call, while another command of the process is putting the queue
    in line (the release script's hand-over: SEM_RELEASE's)."""
    _max_poll: ClassVar[float | None] = None
    """Longest sleep of a waiting head between its tries (a waiting writer's refresh)."""
    _queued_in_redis: ClassVar[bool] = True
    """Its waiters are queued in Redis (a process's queue is withdrawn when it empties)."""
    _votes: ClassVar[VoteRules | None] = None
    """The rules of a quorum's votes on each of its calls (`_model.quorum_rules`), for a
    primitive whose client is a quorum of servers (a Redlock's)."""

    _client: AsyncClient | Quorum
    _name: str
    _config: LockConfig
    _key: str
    _channel: str
    _release_keys: Sequence[str]
    _held: Blocks[Lease]

    def __init__(
        self,
        client: AsyncClient | Quorum,
        name: str,
        config: LockConfig,
        *,
        key: str,
        channel: str,
        release_keys: Sequence[str],
    ) -> None:
        """`client`: a client, or a Redlock's `Quorum` of clients; `key`: the key a lease's token lives in, which its renewals extend; `channel`:
        where grants to this primitive's waiters are announced; `release_keys`: KEYS of its
        release script (as RELEASE's). The client and the name are checked already."""
        if config.replicas and is_cluster(client):
            raise ConfigError(
                "replicas cannot be used with a redis.asyncio.RedisCluster client (WAIT must "
                "follow the script on the same connection); use replicas=0",
                argument="replicas",
                value=config.replicas,
            )
        self._client = client
        self._name = name
        self._config = config
        self._key = key
        self._channel = channel
        self._release_keys = release_keys
        self._held = Blocks()  # the lease of each `async with` block in progress

    # ----------------------------------------------------------------- what a primitive supplies
    @abc.abstractmethod
    def _acquire_call(
        self, token: str, task: str, queue: tuple[str, int, str] | None, claims: Sequence[str]
    ) -> Call:
        """The acquire script call for `token` (see ACQUIRE's ARGV conventions)."""

    def _release_call(
        self,
        *,
        token: str = "",
        retain_ms: int | None = None,
        held_ms: int | None = None,
        renewed: bool = True,
        abort: bool = False,
        forced: bool = False,
        look_at_queue: bool = False,
        withdraw: str = "",
        join: Join | None = None,
        claims: Sequence[str] = (),
    ) -> Call:
        """The release script call (see RELEASE's ARGV conventions)."""
        args = release_args(
            token=token,
            retain_ms=retain_ms,
            held_ms=held_ms,
            renewed=renewed,
            abort=abort,
            forced=forced,
            look_at_queue=look_at_queue,
            withdraw=withdraw,
            join=join,
            claims=claims,
        )
        return self._release_script, self._release_keys, args

    def _renew_call(self, token: str, ttl_ms: int, permits: int = 1) -> Call:
        """The call that resets the expiry of the lease under `token` (of `permits`
        permits) to `ttl_ms`: RENEW_HOLDER where the state's `token` holds it (the same
        reply from a text a twelfth as long: a grant's first renewal is sent with it)."""
        kind = self._renewal_kind(0, permits)
        if kind == "":
            return RENEW_HOLDER, (self._key,), [token, ttl_ms]
        return RENEW, (self._key,), [token, ttl_ms, kind]

    def _renewal_kind(self, fencing_token: int, permits: int = 1) -> str:
        """The kind of a lease's renewals (RENEW's ARGV[3]) once its fencing token is
        known; a semaphore's lease of several permits says how many (RENEW's 'ps<n>')."""
        if permits > 1:
            return f"{self._renew_kind}{permits}"
        return self._renew_kind

    def _resume_call(self, token: str, ttl_ms: int) -> Call:
        """The call answering {1, fencing token[, slot]} if a lease is held under `token`
        (its expiry then reset to `ttl_ms`), else {0}."""
        return RESUME, (self._key,), [token, ttl_ms, self._renew_kind]

    # ----------------------------------------------------------------- properties
    @property
    def name(self) -> str:
        return self._name

    @property
    def ttl(self) -> float:
        return self._config.ttl

    @property
    def timeout(self) -> float | None:
        return self._config.timeout

    @property
    def _grant_ms(self) -> int:
        """How long a grant to this primitive's waiters is held before it is renewed."""
        return min(self._config.ttl_ms, GRANT_MS)

    def _entry(self, registration: Registration, task: str) -> str:
        """The tail of this process's entry in the wait queue in Redis (see ACQUIRE)."""
        r = registration
        ttl_ms = self._config.ttl_ms
        return f"{HOST} {pid()} {r.seq} {r.grant_ms} {ttl_ms} {r.token} {task}"

    async def _run_waiting(
        self, runtime: Runtime, call: Call, *, timeout: float, operation: str, votes: Rule | None
    ) -> tuple[Any, int]:
        """Run `call`, followed by a WAIT for the replicas if this primitive needs any
        (`replicas=N`): its reply, and how many replicas acknowledged (`replicas` when it
        needs none). `votes`: the call's rule on a quorum (`_votes`)."""
        script, keys, args = call
        wait = self._config.wait_args(timeout)
        options = CallOptions(
            timeout=timeout, operation=operation, name=self._name, wait=wait, votes=votes
        )
        reply = await runtime.backend.run(script, keys, args, options)
        if wait is None:
            return reply, self._config.replicas
        answer, acked = reply
        return answer, acked

    def _check_replicated(self, operation: str, acked: int) -> None:
        """Raise `ReplicationError` if fewer than `replicas` replicas acknowledged."""
        config = self._config
        if acked < config.replicas:
            raise ReplicationError(
                f"{operation} of {self._what} {self._name!r}: {acked} of the {config.replicas} "
                f"replicas required acknowledged within {config.replica_timeout:g}s",
                operation=operation,
                name=self._name,
                replicas=config.replicas,
                acknowledged=acked,
            )

    async def _run_release(
        self,
        runtime: Runtime,
        call: Call,
        *,
        timeout: float,
        background: bool = False,
        fresh: bool = False,
        on_sent: Callable[[], None] | None = None,
    ) -> Released:
        """One release call, and what it did."""
        script, keys, args = call
        reply = await runtime.backend.run(
            script,
            keys,
            args,
            CallOptions(
                timeout=timeout,
                operation="release",
                name=self._name,
                background=background,
                fresh=fresh,
                on_sent=on_sent,
                votes=None if self._votes is None else self._votes.release,
            ),
        )
        if reply == 1 and isinstance(reply, int):
            return RELEASED_ALONE  # the uncontended path's plain integer
        reply = released(reply)
        slot = text(reply[5]) if len(reply) > 5 else ""
        after = int(reply[6]) if len(reply) > 6 else -1
        return Released(
            int(reply[0]),
            text(reply[1]),
            text(reply[2]),
            text(reply[3]),
            int(reply[4]),
            slot,
            after,
        )

    def _granted(self, lease: Lease, waited: float, attempts: int) -> Lease:
        if events.enabled():
            events.emit(
                events.LockEvent(
                    kind=events.EventKind.ACQUIRED,
                    name=self._name,
                    fencing_token=lease.fencing_token,
                    wait=waited,
                    attempts=attempts,
                )
            )
        return lease

    def _timeout_error(
        self,
        timeout: float | None,
        waited: float,
        attempts: int,
        busy: Sequence[Any] = (),
        *,
        migrating: bool = False,
    ) -> AcquireTimeoutError:
        holder, retry_after = busy_hint(self._name, busy)
        if events.enabled():
            events.emit(
                events.LockEvent(
                    kind=events.EventKind.ACQUIRE_TIMED_OUT,
                    name=self._name,
                    wait=waited,
                    attempts=attempts,
                )
            )
        why = "; its cluster slot was migrating, Redis refused the attempts" if migrating else ""
        return AcquireTimeoutError(
            f"{self._what} {self._name!r} not acquired within {timeout or 0:g}s "
            f"(waited {waited:.3g}s, {attempts} attempts{why})",
            name=self._name,
            timeout=timeout or 0.0,
            waited=waited,
            attempts=attempts,
            holder=holder,
            retry_after=retry_after,
        )

    # ----------------------------------------------------------------- the LeaseIssuer side (extend; release is in `_engine.release`)
    @abc.abstractmethod
    async def _release_lease(self, lease: Lease, *, timeout: float) -> bool:
        """Release `lease` if it is still ours (the release path's, `_engine.release`)."""

    async def _extend_lease(self, lease: Lease, *, timeout: float, ttl_ms: int) -> bool:
        reply, acked = await self._run_waiting(
            runtime_for(self._client),
            self._renew_call(lease.token, ttl_ms, lease.permits),
            timeout=timeout,
            operation="extend",
            votes=None if self._votes is None else self._votes.renew,
        )
        if int(reply[0]) == 1:
            self._check_replicated("extend", acked)
        return int(reply[0]) == 1

    def _guarding(self, lease: Lease, task: asyncio.Task[Any], *, entered: bool) -> None:
        runtime_for(self._client).guard(self._key, task, entered=entered)
