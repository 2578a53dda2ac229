"""`Semaphore`: at most `limit` holders at once. Its keys and scripts; the engine does the rest."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Unpack, final

from .._engine.acquisition import UNSET, Call, Primitive, Unset
from .._engine.lease import Lease
from .._engine.release import ABORT_TIMEOUT
from .._engine.runtime import Runtime, runtime_for
from .._lua.layout import GRACE_MS, LockKeys, permits_key
from .._lua.semaphore import (
    SEM_ACQUIRE,
    SEM_ACQUIRE_SEVERAL,
    SEM_RELEASE,
    SEM_SET_LIMIT,
    sem_acquire_args,
)
from .._model import renewal_policy as renewal
from .._model.config import check_limit, check_name, check_timeout, check_token
from .._model.holder import HOST, LockInfo, pid, task_name
from .._model.options import LockOptions, lock_config
from .._ops.inspection import read_locks
from .._transport.call_options import CallOptions
from .._transport.clients import AsyncClient, check_client, outcome_unknown
from ..errors import AcquireTimeoutError, ConfigError, LeaseLostError, LossReason

__all__ = ("Semaphore", "SemaphoreInfo")

POLL_FIRST, POLL_MAX = 0.005, 0.1
"""Seconds between the tries of a request for several permits: from the first, doubled
up to the most (and never past the soonest expiry Redis reports)."""

BARRIER_MS = GRACE_MS + round(POLL_MAX * 1000)
"""How long a refused request for several permits keeps later ones from the permits freed
unless it tries again (it does every POLL_MAX at the latest): a crashed one delays the
others by this much at most."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class SemaphoreInfo:
    """What Redis says about a semaphore right now (never a secret token).

    `holders`, `waiting` and `free` are the fields every primitive's `info()` has, with
    the same meanings (`LockInfo`, `ReadWriteInfo`).

    Added in 0.1.
    """

    name: str
    limit: int
    """The limit in force: the one stored in Redis while the semaphore is in use (see
    `Semaphore`), else this object's."""
    holders: tuple[LockInfo, ...]
    """The leases held, by slot; each holder's `slot` is set (a lease of several permits
    is listed once, at its first slot, with its `permits` and `slots`)."""
    waiting: int
    """Tasks waiting, summed over the queued processes whose entries have not expired."""
    last_fencing_token: int | None
    """The last fencing token issued (None: no state kept)."""

    @property
    def free(self) -> int:
        """Permits that may be taken now (0 while a lowered limit is still exceeded)."""
        return max(self.limit - self.held, 0)

    @property
    def held(self) -> int:
        """Permits held: the sum of the holders' `permits`. Added in 0.1."""
        return sum(holder.permits for holder in self.holders)


@final
class Semaphore(Primitive):
    """A named semaphore in Redis: at most `limit` permits held at once, across processes.
    Each permit is a `Lease`, renewed, lost and released like a lock's.

    ```python
    api_calls = Semaphore(redis, "partner-api", limit=5, ttl=30)
    async with api_calls as permit:
        await call_partner(fence=(permit.slot, permit.fencing_token))
    ```

    Waiters are served first come, first served across processes: a release (or a permit
    that expired, found by the next command that reads the semaphore) hands its permit
    straight to the first queued process, and each permit freed at once goes to the next
    in line. Waiting sends nothing while no permit is freed, except a check when the
    soonest permit would expire unrenewed.

    The limit lives in Redis: the first acquirer of a semaphore not in use stores its
    `limit`, and every process obeys the stored one until the semaphore is idle again (no
    permit held, nobody queued, its state expired after `retain`). Processes configured
    with different limits therefore never exceed the stored one. `set_limit()` changes it
    while in use: permits held are kept, a lowered limit lets no new permit in until enough
    are released, a raised one hands the new permits to waiters at once.

    Several permits at once: `acquire(permits=n)` takes n as one lease, and a large
    request is not starved by single ones (see `acquire`).

    Fencing: each permit gets a fencing token from one sequence per semaphore, and a
    `slot`, from 0 to the limit minus 1, that no other permit holds meanwhile. Storage that
    remembers the highest token per slot rejects a holder whose permit expired and whose
    slot was taken again.

    Args:
        client: a redis-py or valkey-py asyncio client, of one server or of a cluster,
            as for `Lock`.
        name: the semaphore's name, as for `Lock` (its keys do not clash with a lock's).
        limit: permits held at once at most (1 to 10,000), if no other limit is stored.
        options: the settings of each permit, `LockOptions`, as for `Lock`: `ttl`,
            `renew`, `renew_interval`, `timeout`, `max_hold`, `prefix`, `retain`,
            `hold_stats`, `replicas`, `replica_timeout`. `limit` is the semaphore's own.

    Raises:
        TypeError: a wrong type, or an unknown keyword.
        ConfigError: a value out of range; the message names the argument and the range.

    Added in 0.1.
    """

    __slots__ = ("_keys", "_limit", "_script_keys")

    _what = "semaphore"
    _release_script = SEM_RELEASE
    _renew_kind = "ps"  # a permit, and its slot in the index (`_lua.permit_index`)
    _exclusive = False
    _guard_reentry = False  # a task may hold several permits
    _requeued_on_grant = True
    _hands_over = True

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        *,
        limit: int,
        **options: Unpack[LockOptions],
    ) -> None:
        checked_client, checked_name = check_client(client), check_name(name)
        self._limit = check_limit(limit)
        config = lock_config("Semaphore()", options)
        keys = self._keys = LockKeys.build(config.prefix, checked_name, "sem:")
        self._script_keys = (*keys.scripts, permits_key(keys.lock))
        super().__init__(
            checked_client,
            checked_name,
            config,
            key=keys.lock,
            channel=keys.channel,
            release_keys=self._script_keys,
        )

    @property
    def limit(self) -> int:
        """The limit this object stores when the semaphore is not in use (see `info()` for
        the one in force)."""
        return self._limit

    @property
    def key(self) -> str:
        """The Redis key of the semaphore's state and permits."""
        return self._keys.lock

    def __repr__(self) -> str:
        held = len(self._held)
        return (
            f"<Semaphore {self._name!r} limit={self._limit} ttl={self._config.ttl:g}s "
            f"held_here={held}>"
        )

    # ----------------------------------------------------------------- the engine's calls
    def _acquire_call(
        self, token: str, task: str, queue: tuple[str, int, str] | None, claims: Sequence[str]
    ) -> Call:
        holder = f"{HOST} {pid()} {task}"
        args = sem_acquire_args(
            token, self._config.ttl_ms, holder, self._limit, queue=queue, claims=claims
        )
        # Every acquire may serve the queue (a permit that expired goes to its head first).
        return SEM_ACQUIRE, self._script_keys, args

    # ----------------------------------------------------------------- several permits
    async def acquire(
        self,
        *,
        permits: int = 1,
        timeout: float | Unset | None = UNSET,
        token: str | None = None,
    ) -> Lease:
        """Wait for `permits` permits and return them as one `Lease` (`lease.permits`).

        One permit is `Primitive.acquire`'s (see `Lock.acquire`). Several
        are taken all at once or not at all, held in as many slots (`lease.slot` is the
        first; every slot's fencing order takes `lease.fencing_token`), renewed, lost and
        released together. Fairness: the first request for several permits that is refused
        keeps every later request (of one or several permits, queued or not) from the
        permits freed until it has its own, so a stream of single permits does not starve
        it; requests queued before it are served first. It waits by trying again, every
        POLL_FIRST to POLL_MAX seconds (sooner if a permit expires sooner); it stops
        keeping the others out BARRIER_MS after its last try.

        Args:
            permits: permits to hold, from 1 to the limit in force (at most 10,000).
            timeout: as for `Lock.acquire`.
            token: as for `Lock.acquire`.

        Raises:
            ConfigError: `permits` out of range: below 1 or above 10,000 (nothing sent),
                or above the limit in force (nothing held, the message names it).
            AcquireTimeoutError, BackendError, LeaseLostError: as for `Lock.acquire`.

        Cancellation:
            As for `Lock.acquire`: nothing is left held, and a refused request stops
            keeping the others out.
        """
        permits = check_limit(permits, argument="permits")
        if permits == 1:
            return await super().acquire(timeout=timeout, token=token)
        wait = self._config.timeout if isinstance(timeout, Unset) else check_timeout(timeout)
        return await self._acquire_several(
            permits, wait, None if token is None else check_token(token)
        )

    async def try_acquire(self, *, permits: int = 1) -> Lease | None:
        """Try once, without waiting: a `Lease` of `permits` permits, or None if fewer are
        free (see `acquire`).

        Raises:
            ConfigError: `permits` out of range (see `acquire`).
            BackendError: Redis could not be reached or refused the command.

        Cancellation:
            As for `acquire()`.
        """
        try:
            return await self.acquire(permits=permits, timeout=0)
        except AcquireTimeoutError:
            return None

    async def _acquire_several(self, permits: int, wait: float | None, token: str | None) -> Lease:
        """`acquire` of several permits: tried until taken or `wait` is spent."""
        runtime = runtime_for(self._client)
        loop = runtime.loop
        started, attempts, pause = loop.time(), 0, POLL_FIRST
        chosen = token is not None
        token = token if token is not None else secrets.token_hex(16)
        while True:
            attempts += 1
            left = None if wait is None else wait - (loop.time() - started)
            answer = await self._try_several(
                runtime, token, permits, left, chosen=chosen, barrier=wait != 0
            )
            if answer is None:  # answered too late, given back: a fresh token for the next
                token = token if chosen else secrets.token_hex(16)
                reply: list[object] = [0, 0]
            else:
                reply, sent_at = answer
            status = int(str(reply[0]))
            if status == 1:
                lease = self._leases.new_lease(
                    runtime, token, int(str(reply[1])), sent_at, permits=permits,
                    first_due=renewal.first_due(sent_at, self._config.renew_interval),
                    slot=int(str(reply[2])),
                )  # fmt: skip
                return self._granted(lease, loop.time() - started, attempts)
            if status == -2:
                raise ConfigError(
                    f"permits must be from 1 to the limit in force of semaphore "
                    f"{self._name!r}, {int(str(reply[1]))}; got {permits}",
                    argument="permits",
                    value=permits,
                )
            if status == -1:
                raise LeaseLostError(
                    f"semaphore {self._name!r}: the token given was used for a lease that "
                    "has ended; a token is never granted twice",
                    name=self._name,
                    reason=LossReason.NOT_OWNER,
                )
            left = None if wait is None else wait - (loop.time() - started)
            if left is not None and left <= 0:
                if wait != 0:  # the request kept the others out: it no longer does
                    await self._release.abort(runtime, token, timeout=ABORT_TIMEOUT)
                raise self._timeout_error(wait, loop.time() - started, attempts)
            soonest = int(str(reply[1]))
            hint = soonest / 1000 if soonest > 0 else pause
            delay = min(pause, max(hint, 0.001), POLL_MAX if left is None else left)
            pause = min(pause * 2, POLL_MAX)
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                # Cancelled between tries: the request stops keeping the others out now.
                await self._release.abort(runtime, token, timeout=ABORT_TIMEOUT)
                raise

    async def _try_several(
        self,
        runtime: Runtime,
        token: str,
        permits: int,
        left: float | None,
        *,
        chosen: bool,
        barrier: bool,
    ) -> tuple[list[object], float] | None:
        """One SEM_ACQUIRE_SEVERAL call (`barrier`: a refusal keeps later requests out):
        its reply and the time it was sent; None if it was answered too late to count on
        (the permits given back). An acquire whose outcome is unknown (cancelled, no
        answer) is aborted, unless the token is the caller's own."""
        config = self._config
        bound = config.ttl - config.margin
        if left is not None:
            # At least the reply window every attempt gets (`reply_timeout`), past the
            # timeout too, as a single permit's attempt.
            bound = min(bound, max(left, config.reply_timeout))
        holder = f"{HOST} {pid()} {task_name()}"
        args: list[str | int] = [
            token,
            config.ttl_ms,
            holder,
            self._limit,
            permits,
            BARRIER_MS,
            "1" if barrier else "",
        ]
        sent_at = runtime.loop.time()
        try:
            reply = await runtime.backend.run(
                SEM_ACQUIRE_SEVERAL,
                self._script_keys,
                args,
                CallOptions(timeout=bound, operation="acquire", name=self._name),
            )
        except BaseException as exc:
            if not chosen and (isinstance(exc, asyncio.CancelledError) or outcome_unknown(exc)):
                await self._release.abort(runtime, token, timeout=ABORT_TIMEOUT)
            raise
        if int(reply[0]) == 1 and runtime.loop.time() >= sent_at + config.ttl - config.margin:
            await self._release.abort(runtime, token, timeout=ABORT_TIMEOUT)
            return None
        return list(reply), sent_at

    # ----------------------------------------------------------------- limit, inspection
    async def set_limit(self, limit: int) -> int | None:
        """Change the limit in force (stored in Redis) to `limit`. One round trip.

        Permits held are kept. A lowered limit lets no new permit in until fewer than
        `limit` are held; a raised one hands the new permits to the first queued processes
        at once. The stored limit lasts while the semaphore is in use; once it is idle and
        its state has expired, the next acquirer stores its own `limit` again.

        Returns:
            The limit that was in force, or None if none was stored.

        Raises:
            ConfigError: `limit` out of range (nothing is sent).
            BackendError: Redis could not be reached or refused the command.

        Cancellation:
            Safe to cancel: the limit is changed or not.
        """
        limit = check_limit(limit)
        retain_ms = round(self._config.retain * 1000)
        reply = await runtime_for(self._client).backend.run(
            SEM_SET_LIMIT,
            self._script_keys,
            ["", limit, retain_ms],
            CallOptions(timeout=5.0, operation="set_limit", name=self._name),
        )
        previous = reply[0]
        return int(previous) if previous not in (b"", "", None) else None

    async def info(self) -> SemaphoreInfo:
        """The limit in force, the permits held and the tasks waiting. One round trip.

        Raises:
            BackendError: Redis could not be reached or refused the command.
        """
        async with runtime_for(self._client).backend.node_client(self._keys.lock) as client:
            (state,) = await read_locks(
                client, [self._name], prefix=self._config.prefix, kind="sem:"
            )
        return SemaphoreInfo(
            name=self._name,
            limit=state.limit if state.limit is not None else self._limit,
            holders=state.holders,
            waiting=state.waiters,
            last_fencing_token=state.last_fencing_token,
        )

    async def locked(self) -> bool:
        """Whether no permit is free right now (one round trip).

        Raises:
            BackendError: Redis could not be reached or refused the command.
        """
        return (await self.info()).free == 0
