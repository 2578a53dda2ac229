"""Who holds a lock: this process's identity as recorded in Redis, and `LockInfo`."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, final

__all__ = ("HOST", "PID", "LockInfo", "task_name", "text")

HOST: Final = socket.gethostname()[:255].replace(" ", "_") or "?"
"""This machine's name, as recorded with every holder and waiter (no spaces)."""

PID: Final = os.getpid()


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
    """What Redis knows about the current holder of a lock (never the secret token)."""

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

    @classmethod
    def from_fields(cls, name: str, fields: Mapping[str, str], pttl_ms: int) -> LockInfo | None:
        """The holder described by a holder hash's `fields` (None if it holds no lease)."""
        if pttl_ms == -2 or "fence" not in fields:
            return None
        return cls(
            name=name,
            fencing_token=int(fields["fence"]),
            host=fields.get("host", ""),
            pid=int(fields.get("pid", "0") or 0),
            task=fields.get("task", ""),
            acquired_at=int(fields.get("acquired_ms", "0") or 0) / 1000,
            ttl=int(fields.get("ttl_ms", "0") or 0) / 1000,
            expires_in=max(pttl_ms, 0) / 1000,
        )
