"""What Redis records of an election's leader (`Leader`) and of its changes (`Change`), read
back from the fields and log entries `_lua.election` writes. No I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, final, overload

from .deprecation import renamed_argument, warn_renamed
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
@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class Leader:
    """The leader of an election, as Redis records it: who, which term (by its fencing
    token), since when, and the value it proclaimed.

    Added in 0.1. `term`, the fencing token's old name, is a deprecated alias (removed in
    0.2).
    """

    name: str
    """The election's name."""
    identity: str
    """The leader's identity, as its `Election` was given it (default "<host>:<pid>")."""
    fencing_token: int
    """The term's number: its lease's fencing token (`Term.fencing_token`), larger for every
    later term (across a restart of Redis too, as for any fencing token). Added in 0.1
    (before: `term`)."""
    since: float
    """When the term was announced, Unix seconds on the server's clock."""
    value: str | None
    """What the leader proclaimed (`campaign(value=...)`, `Term.proclaim()`), or None."""

    @overload
    def __init__(
        self, *, name: str, identity: str, fencing_token: int, since: float, value: str | None
    ) -> None: ...

    @overload
    def __init__(
        self, *, name: str, identity: str, term: int, since: float, value: str | None
    ) -> None: ...

    def __init__(
        self,
        *,
        name: str,
        identity: str,
        fencing_token: int | None = None,
        since: float,
        value: str | None,
        term: int | None = None,
    ) -> None:
        """`term=` (deprecated, removed in 0.2) is the old name of `fencing_token=`."""
        token = renamed_argument("Leader", fencing_token, term, new="fencing_token")
        for field, given in (
            ("name", name),
            ("identity", identity),
            ("fencing_token", token),
            ("since", since),
            ("value", value),
        ):
            object.__setattr__(self, field, given)

    @property
    def term(self) -> int:
        """Deprecated alias of `fencing_token` (removed in 0.2): it warns."""
        warn_renamed("Leader.term", "Leader.fencing_token")
        return self.fencing_token

    @classmethod
    def from_fields(cls, name: str, fields: Mapping[str, str]) -> Leader | None:
        """The leader a state hash's fields name (None unless a term is held and announced)."""
        return cls.recorded(
            name,
            held=bool(fields.get("token")),
            fence=fields.get("fence", ""),
            announced=fields.get("et", ""),
            identity=fields.get("ei", ""),
            since_ms=fields.get("es", ""),
            value=fields.get("ev", ""),
        )

    @overload
    @classmethod
    def recorded(
        cls,
        name: str,
        *,
        held: bool,
        fence: str,
        announced: str,
        identity: str,
        since_ms: str,
        value: str,
    ) -> Leader | None: ...

    @overload
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
    ) -> Leader | None: ...

    @classmethod
    def recorded(
        cls,
        name: str,
        *,
        held: bool,
        fence: str,
        announced: str | None = None,
        identity: str,
        since_ms: str,
        value: str,
        term: str | None = None,
    ) -> Leader | None:
        """The leader, if a lease is `held` and its fencing token (`fence`) is the one
        `announced` (the record's `et` field). `term=` (deprecated, removed in 0.2) is the
        old name of `announced=`."""
        announced = renamed_argument("Leader.recorded", announced, term, new="announced")
        if not held or not announced or announced != fence or not announced.isdigit():
            return None
        return cls(
            name=name,
            identity=identity,
            fencing_token=int(announced),
            since=_int(since_ms) / 1000,
            value=value_of(value),
        )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One entry of an election's change log."""

    id: str
    """Its log id, "<fencing token>-<n>"."""
    event: Literal["won", "value", "ended"]
    fencing_token: int
    """The fencing token of the term the entry is about."""
    identity: str = ""
    since: float = 0.0
    value: str | None = None
    reason: str = ""


def parse_change(entry: Sequence[Any]) -> Change | None:
    """A log entry as XRANGE gives it ([id, [field, value, ...]]); None if unreadable."""
    entry_id = text(entry[0])
    token, _, _ = entry_id.partition("-")
    raw = [text(item) for item in entry[1]]
    fields = dict(zip(raw[::2], raw[1::2], strict=False))
    event = fields.get("e", "")
    if not token.isdigit() or event not in ("won", "value", "ended"):
        return None
    return Change(
        id=entry_id,
        event=event,  # type: ignore[arg-type]  # checked just above
        fencing_token=int(token),
        identity=fields.get("i", ""),
        since=_int(fields.get("s", "")) / 1000,
        value=value_of(fields.get("v", "")),
        reason=fields.get("r", ""),
    )


def next_id(entry_id: str) -> str:
    """The first log id after `entry_id` ("<token>-<n>" → "<token>-<n + 1>")."""
    token, _, n = entry_id.partition("-")
    return f"{token}-{_int(n) + 1}"
