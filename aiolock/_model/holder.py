"""Who holds a lock: this process's identity as recorded in Redis, and `LockInfo`."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, final

__all__ = ("HOST", "LockInfo", "pid", "task_name", "text")

HOST: Final = socket.gethostname()[:255].replace(" ", "_") or "?"
"""This machine's name, as recorded with every holder and waiter (no spaces)."""


def pid() -> int:
    """This process's id, as recorded with every holder and waiter: read at each use, so
    that a worker forked after the import (a prefork pool, gunicorn's `--preload`) records
    its own, not its parent's."""
    return os.getpid()


def text(value: object) -> str:
    """A reply field as text (bytes that are not UTF-8 are shown with replacements)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def task_name(task: asyncio.Task[object] | None = None) -> str:
    """The name of `task` (default: the current task), as recorded in Redis."""
    task = task if task is not None else asyncio.current_task()
    return task.get_name()[:200] if task is not None else ""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LockInfo:
    """What Redis knows about the current holder of a lock (never the secret token).

    `holders`, `waiting` and `free` are the fields every primitive's `info()` has, with
    the same meanings (`SemaphoreInfo`, `ReadWriteInfo`).
    """

    name: str
    fencing_token: int
    host: str
    pid: int
    task: str
    acquired_at: float
    """Server time of the acquisition, Unix seconds."""
    ttl: float
    """The lease's ttl, seconds."""
    expires_in: float
    """Seconds until the key expires unless renewed."""
    slot: int | None = None
    """A semaphore permit's slot (None for a lock's holder); a lease of several permits
    is listed once, at its first slot (`slots` has them all)."""
    permits: int = 1
    """The permits the holder's lease holds (a semaphore's lease of several permits, see
    `Semaphore.acquire`; else 1).

    Added in 0.1."""
    slots: tuple[int, ...] = ()
    """A semaphore lease's slots, its first one first (empty for other holders).

    Added in 0.1."""
    waiting: int = dataclasses.field(default=0, compare=False)
    """Tasks waiting for the lock, summed over the queued processes whose entries have
    not expired, as `Lock.info()` reads them; 0 in a holder listed by a `SemaphoreInfo` or
    a `ReadWriteInfo`, whose own `waiting` counts them."""

    @property
    def holders(self) -> tuple[LockInfo, ...]:
        """This holder alone: the holders of a lock, as `SemaphoreInfo.holders` and
        `ReadWriteInfo.holders` give theirs."""
        return (self,)

    @property
    def free(self) -> int:
        """0: a lock that has a holder has no place free (`Lock.info()` returns None when
        the lock is free), as `SemaphoreInfo.free` counts permits."""
        return 0

    @classmethod
    def from_fields(cls, name: str, fields: Mapping[str, str], pttl_ms: int) -> LockInfo | None:
        """The holder described by a state hash's `fields` (None if it holds no lease).

        Reads the holder as layout 2 writes it (`m`, `a`, `t`) or as layout 1 did (`host`,
        `pid`, `task`, `acquired_ms`, `ttl_ms`).
        """
        if pttl_ms == -2 or "token" not in fields or "fence" not in fields:
            return None
        return cls.of(
            name,
            fence=fields["fence"],
            holder=fields.get("m")
            or f"{fields.get('host', '')} {fields.get('pid', '0')} {fields.get('task', '')}",
            acquired_ms=fields.get("a") or fields.get("acquired_ms") or "0",
            ttl_ms=fields.get("t") or fields.get("ttl_ms") or "0",
            pttl_ms=pttl_ms,
        )

    @classmethod
    def of(
        cls,
        name: str,
        *,
        fence: str,
        holder: str,
        acquired_ms: str,
        ttl_ms: str,
        pttl_ms: int,
        slot: int | None = None,
    ) -> LockInfo:
        """A holder from the state's fields: `holder` is "<host> <pid> <task>"."""
        host, _, rest = holder.partition(" ")
        pid, _, task = rest.partition(" ")
        return cls(
            name=name,
            fencing_token=_number(fence),
            host=host,
            pid=_number(pid),
            task=task,
            acquired_at=_number(acquired_ms) / 1000,
            ttl=_number(ttl_ms) / 1000,
            expires_in=max(pttl_ms, 0) / 1000,
            slot=slot,
        )

    @classmethod
    def from_permits(
        cls, name: str, fields: Mapping[str, str], now_ms: int
    ) -> tuple[LockInfo, ...]:
        """The live leases among a semaphore state's `fields` ("p:<token>" = "<slot>
        <expires at, ms> <fencing token> <acquired at, ms> <ttl ms> <host> <pid> <task>";
        a lease of several permits also has "p:<token>~2" to "p:<token>~n", one per extra
        permit), by first slot; `now_ms` is the server's clock. The permits parked for a
        waiting request for several permits ("p:<token>~w<k>", fencing token 0) are listed
        as one holder of theirs."""
        leases: dict[str, LockInfo] = {}
        for field, value in sorted(fields.items()):
            parts = value.split(" ", 5)
            if not field.startswith("p:") or len(parts) < 6 or not parts[0].isdigit():
                continue
            slot, expires, fence, acquired, ttl, holder = parts
            if _number(expires) <= now_ms:
                continue
            base, _, extra = field.partition("~")
            key = base + ("~w" if extra.startswith("w") else "")
            if key in leases:
                known = leases[key]
                leases[key] = dataclasses.replace(
                    known, permits=known.permits + 1, slots=(*known.slots, int(slot))
                )
                continue
            info = cls.of(
                name,
                fence=fence,
                holder=holder,
                acquired_ms=acquired,
                ttl_ms=ttl,
                pttl_ms=_number(expires) - now_ms,
                slot=int(slot),
            )
            leases[key] = dataclasses.replace(info, slots=(int(slot),))
        ordered = []
        for key, info in leases.items():
            # A lease's first slot is its first permit's ("p:<token>", read first).
            first = min(info.slots) if key.endswith("~w") else info.slots[0]
            slots = (first, *sorted(info.slots[1:] if first == info.slots[0] else info.slots))
            ordered.append(dataclasses.replace(info, slot=first, slots=tuple(dict.fromkeys(slots))))
        return tuple(sorted(ordered, key=lambda info: info.slot or 0))


def _number(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0
