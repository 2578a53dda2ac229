"""`Semaphore`: at most `limit` holders at once. Its keys and scripts; the engine does the rest."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Unpack, final

from .._engine.acquisition import Call, Primitive
from .._engine.runtime import runtime_for
from .._lua.layout import LockKeys, permits_key
from .._lua.semaphore import SEM_ACQUIRE, SEM_RELEASE, SEM_SET_LIMIT, sem_acquire_args
from .._model.config import check_limit, check_name
from .._model.holder import HOST, PID, LockInfo
from .._model.options import LockOptions, lock_config
from .._ops.inspection import read_locks
from .._transport.call_options import CallOptions
from .._transport.clients import AsyncClient, check_client

__all__ = ("Semaphore", "SemaphoreInfo")


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
    """The permits held, by slot; each holder's `slot` is set."""
    waiting: int
    """Tasks waiting, summed over the queued processes whose entries have not expired."""
    last_fencing_token: int | None
    """The last fencing token issued (None: no state kept)."""

    @property
    def free(self) -> int:
        """Permits that may be taken now (0 while a lowered limit is still exceeded)."""
        return max(self.limit - len(self.holders), 0)


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
        holder = f"{HOST} {PID} {task}"
        args = sem_acquire_args(
            token, self._config.ttl_ms, holder, self._limit, queue=queue, claims=claims
        )
        # Every acquire may serve the queue (a permit that expired goes to its head first).
        return SEM_ACQUIRE, self._script_keys, args

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
