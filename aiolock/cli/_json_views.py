"""The JSON views (`--json`): every command's objects, and what they read of a snapshot
(`LockState`) that the tables read too. Their keys are listed on the documentation's
command-line page (docs/cli.md)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from typing import Any

from .._lua.layout import LockKeys
from .._model.hold_stats import HoldStats
from .._model.holder import LockInfo
from .._model.leader import Leader
from .._ops.doctor import Diagnosis
from .._ops.inspection import ForceRelease, Kind, LockState, QueueEntry, kind_named


def print_json(data: object, *, indent: int | None = 2) -> None:
    sys.stdout.write(json.dumps(data, indent=indent, default=str) + "\n")
    sys.stdout.flush()


def has_sides(state: LockState) -> bool:
    """Whether `state` is a read-write lock's (a writer and readers, two queues)."""
    return kind_named(state.kind).sides


def _side(state: LockState, info: LockInfo) -> str | None:
    """A read-write lock's lease's side, "write" or "read" (None for the other kinds)."""
    if not has_sides(state):
        return None
    return "write" if info == state.holder else "read"


def live_holders(state: LockState) -> list[LockInfo]:
    """The holders that hold (a semaphore's permits handed over and not claimed excluded)."""
    return [info for info in state.holders if info.slot not in state.reserved_slots]


def held_count(state: LockState) -> int:
    """Permits taken: holders, and what was handed over to a queued process."""
    return sum(info.permits for info in state.holders) + (1 if state.reservation is not None else 0)


def limit_of(state: LockState) -> int | None:
    """Holders allowed at once: 1 for a lock, a semaphore's limit in force (None: unknown)."""
    return state.limit if kind_named(state.kind).shared else 1


def soonest_holder(state: LockState) -> LockInfo | None:
    """The holder whose lease expires first."""
    return min(state.holders, key=lambda info: info.expires_in, default=None)


def in_use(state: LockState) -> bool:
    """Held, handed over, or waited for (the holder's lease expired, the waiters have not
    found out yet)."""
    return state.state != "free" or state.waiters > 0


def info_dict(info: LockInfo | None) -> dict[str, Any] | None:
    return None if info is None else dataclasses.asdict(info)


def stats_dict(stats: HoldStats) -> dict[str, Any]:
    return {**dataclasses.asdict(stats), "advice": stats.advice}


def holder_dict(state: LockState, info: LockInfo) -> dict[str, Any]:
    acquired_ms = round(info.acquired_at * 1000)
    age = max(round(state.server_time * 1000) - acquired_ms, 0) / 1000 if acquired_ms else None
    return {
        "slot": info.slot,
        "permits": info.permits,
        "slots": list(info.slots),
        "side": _side(state, info),
        "fencing_token": info.fencing_token,
        "host": info.host,
        "pid": info.pid,
        "task": info.task,
        "acquired_at": info.acquired_at,
        "age": age,
        "ttl": info.ttl,
        "expires_in": info.expires_in,
        "reserved_for": state.reserved_slots.get(info.slot) if info.slot is not None else None,
    }


def row_dict(state: LockState) -> dict[str, Any]:
    """One row of `ls --json` (its keys: docs/cli.md)."""
    holder = state.holder
    soonest = soonest_holder(state)
    expires_in = soonest.expires_in if soonest is not None else None
    if expires_in is None and state.reservation is not None:
        expires_in = state.reservation.expires_in
    return {
        "name": state.name,
        "kind": state.kind,
        "state": state.state,
        "held": held_count(state),
        "limit": limit_of(state),
        "host": holder.host if holder else None,
        "pid": holder.pid if holder else None,
        "task": holder.task if holder else None,
        "fencing_token": holder.fencing_token if holder else None,
        "age": state.age,
        "ttl": holder.ttl if holder else None,
        "expires_in": expires_in,
        "reserved_for": state.reservation.queue_id if state.reservation else None,
        "waiters": state.waiters,
        **_sides_waiting(state),
        "holders": [holder_dict(state, info) for info in state.holders],
        "leader": state.leader.identity if state.leader else None,
    }


def _sides_waiting(state: LockState) -> dict[str, int | None]:
    """`writers_waiting` and `readers_waiting`: a read-write lock's, else null."""
    sides = has_sides(state)
    return {
        "writers_waiting": state.writers_waiting if sides else None,
        "readers_waiting": state.readers_waiting if sides else None,
    }


def show_dict(state: LockState, prefix: str, kind: Kind) -> dict[str, Any]:
    """One kind's object in `show --json` (its keys: docs/cli.md)."""
    return {
        "name": state.name,
        "kind": state.kind,
        "key": LockKeys.build(prefix, state.name, kind.infix).lock,
        "state": state.state,
        "limit": limit_of(state),
        "held": held_count(state),
        "free": state.free if kind.shared else None,
        "holder": info_dict(state.holder),
        "holders": [holder_dict(state, info) for info in state.holders],
        "age": state.age,
        "reservation": dataclasses.asdict(state.reservation) if state.reservation else None,
        "last_fencing_token": state.last_fencing_token,
        "typical_hold": state.typical_hold,
        "waiters": state.waiters,
        **_sides_waiting(state),
        "queue": _queue_list(state.queue),
        "reader_queue": _queue_list(state.reader_queue) if kind.sides else None,
        "recent_holds_ms": list(state.holds_ms),
        "hold_stats": stats_dict(state.hold_stats()),
        "leader": leader_dict(state.leader),
        "server_time": state.server_time,
    }


def leader_dict(leader: Leader | None) -> dict[str, Any] | None:
    """An election's leader in `show --json` (its keys: docs/cli.md). `term` is the
    deprecated old name of `fencing_token`, kept beside it until 0.2."""
    if leader is None:
        return None
    return {**dataclasses.asdict(leader), "term": leader.fencing_token}


def _queue_list(queue: Sequence[QueueEntry]) -> list[dict[str, Any]]:
    return [{**dataclasses.asdict(entry), "expired": entry.expired} for entry in queue]


def release_dict(result: ForceRelease, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "outcome": result.outcome,
        "released": result.outcome == "released",
        "holder": info_dict(result.holder),
        "handed_to": result.handed_to,
    }


def doctor_dict(diagnosis: Diagnosis, where: str) -> dict[str, Any]:
    """`doctor --json`: the server (`where`, its URL without the password), the findings."""
    return {
        "url": where,
        "server": dict(diagnosis.server),
        "problems": diagnosis.problems,
        "warnings": diagnosis.warnings,
        "findings": [dataclasses.asdict(finding) for finding in diagnosis.findings],
    }
