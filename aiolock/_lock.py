"""`Lock`: one holder at a time. Its keys and scripts; the engine (`_engine`) does the rest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

from ._clients import AsyncClient, check_client
from ._config import LockConfig, check_name
from ._engine import Call, Primitive
from ._info import HOST, PID, LockInfo, text
from ._layout import RETAIN_DEFAULT, LockKeys
from ._runtime import runtime_for
from ._scripts import ACQUIRE, INSPECT, RELEASE, acquire_args

__all__ = ("Lock", "LockInfo")


@final
class Lock(Primitive):
    """A named lock in Redis, granting `Lease`s: one holder at a time, across processes.

    Use one `Lock` per request (cheap: it holds no connection and sends nothing until used),
    or share one between tasks: each `async with` is its own lease with its own token, and
    no task can release another's.

    ```python
    async with Lock(redis, "orders:42", ttl=10) as lease:
        await db.write(..., fence=lease.fencing_token)
    ```

    While held, the lease is renewed every `renew_interval` (ttl/3 by default) by a
    background task shared by all leases of the client. If it is lost (renewal refused,
    or Redis unreachable until the local deadline) the body of `async with` is cancelled
    and `LeaseLostError` is raised. If the process dies, the key expires within `ttl`.

    Args:
        client: a `redis.asyncio.Redis` (fakeredis's async client works too), or a
            `redis.asyncio.RedisCluster`; or valkey-py's `valkey.asyncio.Valkey` or
            `ValkeyCluster` (the `valkey` extra). aiolock opens its own connections with the same
            settings for renewals and notifications, so an exhausted pool cannot starve
            them (on a cluster, renewals go through the cluster client).
        name: the lock's name; any non-empty text up to 1000 characters not starting
            with "}".
        ttl: seconds the key lives without renewal (0.01 to 1 year). Bounds how long a
            crashed holder blocks others.
        renew: renew the lease in the background while held.
        renew_interval: seconds between renewals; default ttl/3. Must be less than the ttl.
        timeout: seconds `async with` and `acquire()` wait for the lock; None waits
            forever, 0 tries once.
        max_hold: seconds (≥ ttl) after which renewal stops: the last renewal sets the
            expiry up to this point, so a hung holder keeps the lock at most this long
            (its lease is lost then, `LossReason.MAX_HOLD`) instead of forever.
        prefix: prefix of every Redis key of this lock (see ARCHITECTURE.md for the layout).
        retain: seconds (5 to 86400) the lock's state (its last fencing token and the
            records that recognise late copies of commands, about 190 bytes) stays after
            a release, when the ttl is shorter than this or longer than an hour; otherwise
            it stays until the released lease would have expired. See `_layout`.
        hold_stats: record every hold's duration for `aiolock stats` and `hold_stats()`
            (one more command per release).
        replicas: replicas (0 to 100) that must have each acquire and each renewal
            before it counts: a `WAIT` follows the script on the same connection, in the
            same round trip. An acquire not confirmed in time is given back and raises
            `ReplicationError`; a renewal not confirmed is retried, and the lease is lost
            at its deadline if none is. A failover to a replica that acknowledged cannot
            lose the key (see the README's "Deployments"). 0 (the default) waits for none.
        replica_timeout: seconds (0.001 to ttl/2) to wait for those acknowledgements;
            default a quarter of the ttl, at most 1 s. Only with `replicas`.

    Raises:
        TypeError: a wrong type (a `bytes` name, a synchronous client, ...).
        ConfigError: a value out of range; the message names the argument and the range.
    """

    __slots__ = ("_keys",)

    _release_script = RELEASE

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        *,
        ttl: float = 30.0,
        renew: bool = True,
        renew_interval: float | None = None,
        timeout: float | None = None,
        max_hold: float | None = None,
        prefix: str = "aiolock",
        retain: float = RETAIN_DEFAULT,
        hold_stats: bool = False,
        replicas: int = 0,
        replica_timeout: float | None = None,
    ) -> None:
        checked_client, checked_name = check_client(client), check_name(name)
        config = LockConfig.cached(
            ttl=ttl,
            renew=renew,
            renew_interval=renew_interval,
            timeout=timeout,
            max_hold=max_hold,
            prefix=prefix,
            retain=retain,
            hold_stats=hold_stats,
            replicas=replicas,
            replica_timeout=replica_timeout,
        )
        keys = self._keys = LockKeys.build(config.prefix, checked_name)
        super().__init__(
            checked_client,
            checked_name,
            config,
            key=keys.lock,
            channel=keys.channel,
            release_keys=keys.scripts,
        )

    @property
    def key(self) -> str:
        """The Redis key that exists while the lock is held."""
        return self._keys.lock

    def __repr__(self) -> str:
        held = len(self._held)
        return f"<Lock {self._name!r} ttl={self._config.ttl:g}s held_here={held}>"

    # ----------------------------------------------------------------- the engine's calls
    def _acquire_call(
        self, token: str, task: str, queue: tuple[str, int, str] | None, claims: Sequence[str]
    ) -> Call:
        holder = f"{HOST} {PID} {task}"
        args = acquire_args(token, self._config.ttl_ms, holder, queue=queue, claims=claims)
        # An attempt that does not queue touches the state alone: one key (cheaper to pass).
        return ACQUIRE, self._keys.scripts if queue is not None else self._keys.state, args

    # ----------------------------------------------------------------- inspection
    async def locked(self) -> bool:
        """Whether anyone holds the lock right now, or it is kept for a queued process (one
        round trip).

        Raises:
            BackendError: Redis could not be reached.
        """
        holder, reserved = await self._inspect()
        return holder is not None or reserved

    async def info(self) -> LockInfo | None:
        """The current holder as recorded in Redis, or None if the lock is free.

        Raises:
            BackendError: Redis could not be reached.
        """
        return (await self._inspect())[0]

    async def force_release(self) -> LockInfo | None:
        """Evict the current holder (a stuck lock), as `aiolock release --force` does.

        Token-guarded: the holder's token is read, then the ordinary release runs with it,
        so the lock is handed to the first queued process as on a normal release, and if
        the holder changed in between, nothing is released (a new holder is never
        evicted). The evicted holder's watchdog finds out at its next renewal
        (`LossReason.NOT_OWNER`) and its work is cancelled. Two round trips.

        Returns:
            The evicted holder, or None if nothing was released (free, or the holder
            changed meanwhile).

        Raises:
            BackendError: Redis could not be reached or refused the command.

        Added in 0.2.
        """
        holder, fields = await self._inspect_fields()
        if holder is None:
            return None
        runtime = runtime_for(self._client)
        call = self._release_call(token=fields["token"], forced=True)
        reply = await self._run_release(runtime, call, timeout=5.0)
        return holder if reply.status == 1 else None

    async def _inspect(self) -> tuple[LockInfo | None, bool]:
        """The holder (or None), and whether the lock is kept for a queued process."""
        holder, fields = await self._inspect_fields()
        return holder, "reserved" in fields

    async def _inspect_fields(self) -> tuple[LockInfo | None, dict[str, str]]:
        reply = await runtime_for(self._client).backend.run(
            INSPECT, self._keys.state, [], timeout=5.0, operation="inspect", name=self._name
        )
        fields = {text(k): text(v) for k, v in zip(reply[1::2], reply[2::2], strict=True)}
        return LockInfo.from_fields(self._name, fields, int(reply[0])), fields
