"""What Redis records of an election's leader (`Leader`) and of its changes (`Change`), read
back from the fields and log entries `_lua.election` writes. No I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, final

from .holder import text

__all__ = ("Change", "Leader", "next_id", "parse_change", "value_of")


def value_of(stored: str) -> str | None:
    """A proclaimed value as the record keeps it ("" for none, else "=" and the value)."""
    return stored[1:] if stored.startswith("=") else None


def _int(value: str, default: int = 0) -> int:
    try:
        return int(value)
    except ValueError:
        return default


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Leader:
    """The leader of an election, as Redis records it: who, which term, since when, and
    the value it proclaimed.

    Added in 0.1.
    """

    name: str
    """The election's name."""
    identity: str
    """The leader's identity, as its `Election` was given it (default "<host>:<pid>")."""
    term: int
    """The term's number: its lease's fencing token. Every later term has a larger one
    (across a restart of Redis too, as for any fencing token)."""
    since: float
    """When the term was announced, Unix seconds on the server's clock."""
    value: str | None
    """What the leader proclaimed (`campaign(value=...)`, `Term.proclaim()`), or None."""

    @classmethod
    def from_fields(cls, name: str, fields: Mapping[str, str]) -> Leader | None:
        """The leader a state hash's fields name (None unless a term is held and announced)."""
        return cls.recorded(
            name,
            held=bool(fields.get("token")),
            fence=fields.get("fence", ""),
            term=fields.get("et", ""),
            identity=fields.get("ei", ""),
            since_ms=fields.get("es", ""),
            value=fields.get("ev", ""),
        )

    @classmethod
    def recorded(
        cls,
        name: str,
        *,
        held: bool,
        fence: str,
        term: str,
        identity: str,
        since_ms: str,
        value: str,
    ) -> Leader | None:
        """The leader, if a lease is `held` and its fencing token is the announced `term`."""
        if not held or not term or term != fence or not term.isdigit():
            return None
        return cls(
            name=name,
            identity=identity,
            term=int(term),
            since=_int(since_ms) / 1000,
            value=value_of(value),
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One entry of an election's change log."""

    id: str
    """Its log id, "<term>-<n>"."""
    event: Literal["won", "value", "ended"]
    term: int
    identity: str = ""
    since: float = 0.0
    value: str | None = None
    reason: str = ""


def parse_change(entry: Sequence[Any]) -> Change | None:
    """A log entry as XRANGE gives it ([id, [field, value, ...]]); None if unreadable."""
    entry_id = text(entry[0])
    term, _, _ = entry_id.partition("-")
    raw = [text(item) for item in entry[1]]
    fields = dict(zip(raw[::2], raw[1::2], strict=False))
    event = fields.get("e", "")
    if not term.isdigit() or event not in ("won", "value", "ended"):
        return None
    return Change(
        id=entry_id,
        event=event,  # type: ignore[arg-type]  # checked just above
        term=int(term),
        identity=fields.get("i", ""),
        since=_int(fields.get("s", "")) / 1000,
        value=value_of(fields.get("v", "")),
        reason=fields.get("r", ""),
    )


def next_id(entry_id: str) -> str:
    """The first log id after `entry_id` ("<term>-<n>" → "<term>-<n + 1>")."""
    term, _, n = entry_id.partition("-")
    return f"{term}-{_int(n) + 1}"
