"""`Lock`: one holder at a time. Its keys and scripts; the engine (`_engine.acquisition`) does the rest."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Unpack, final

from .._engine.acquisition import Call, Primitive
from .._engine.runtime import runtime_for
from .._lua.layout import LockKeys
from .._lua.lock import ACQUIRE, INSPECT, RELEASE, acquire_args
from .._model.config import check_name
from .._model.holder import HOST, LockInfo, pid, text
from .._model.options import LockOptions, lock_config
from .._ops.inspection import _queue as read_queue
from .._transport.call_options import CallOptions
from .._transport.clients import AsyncClient, check_client

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
        options: the lock's settings, `LockOptions` (their meanings, ranges and defaults
            there): `ttl`, `renew`, `renew_interval`, `timeout`, `max_hold`, `prefix`,
            `retain`, `hold_stats`, `replicas`, `replica_timeout`.

    Raises:
        TypeError: a wrong type (a `bytes` name, a synchronous client, ...), or an unknown
            keyword.
        ConfigError: a value out of range; the message names the argument and the range.
    """

    __slots__ = ("_keys",)

    _release_script = RELEASE
    _direct_grants = True
    _oldest_first = True

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        **options: Unpack[LockOptions],
    ) -> None:
        checked_client, checked_name = check_client(client), check_name(name)
        config = lock_config("Lock()", options)
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
        holder = f"{HOST} {pid()} {task}"
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
        """The current holder as recorded in Redis, with the tasks waiting (`waiting`), or
        None if the lock is free. One round trip.

        Its `holders`, `waiting` and `free` answer as a `SemaphoreInfo`'s and a
        `ReadWriteInfo`'s do.

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

        Added in 0.1.
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
        """The holder (or None), with the tasks waiting, and the fields of the state."""
        keys = self._keys
        pttl, raw, queue, entries, (seconds, micros) = await runtime_for(self._client).backend.run(
            INSPECT,
            (keys.lock, keys.queue, keys.waiters),
            [],
            CallOptions(timeout=5.0, operation="inspect", name=self._name),
        )
        fields = {text(k): text(v) for k, v in zip(raw[::2], raw[1::2], strict=True)}
        holder = LockInfo.from_fields(self._name, fields, int(pttl))
        if holder is None:
            return None, fields
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        waiting = sum(
            entry.count
            for entry in read_queue(queue, zip(entries[::2], entries[1::2], strict=True), now_ms)
            if not entry.expired
        )
        return dataclasses.replace(holder, waiting=waiting), fields
