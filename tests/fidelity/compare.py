"""Normalising replies and states so that two servers' can be compared, and comparing them.

Two servers never read the same clock at the same instant, so what the scripts derive from
`TIME` differs between them; nothing else may. The rule:

- **Times.** A TIME reply (seconds and microseconds) is one time, in microseconds. An integer (a reply's, a hash field's, a list element's, a zset's score, or a
  run of 9 digits or more inside a text: a queue entry's expiry, a stream id's term)
  within ±120 s of the server's own clock at the call, read as seconds, milliseconds or
  microseconds, is a time: it becomes `Timed(unit, offset from that clock in ms)`. Two
  times match when their units are the same and their offsets differ by at most
  `TOLERANCE_MS` plus the unit's resolution (1 s for a time in seconds: a script's
  `math.ceil(ms / 1000)` rounds two readings an instant apart a second apart).
- **Durations the scripts measure on the clock**: a key's PTTL; in a refusal (a reply
  {0, ...} of at least 7 elements: acquires of every primitive) its elements 2, 7 and 8 (the
  key's PTTL, the typical hold, when to check again); INSPECT's and EL_READ's first element
  (a PTTL); a state hash's field `h` (the typical hold); a holds list's elements. They match
  when they differ by at most `TOLERANCE_MS` (a negative PTTL, -1 or -2, must be equal).
- **Order.** The fields of a hash (INSPECT's HGETALLs, every hash of the state) are
  compared in the order of their names, the members of a set sorted: Redis keeps no order
  for them once a hash is not a listpack (its table's order, seeded per process).
- **Iteration order.** A semaphore's or a read-write lock's `r` (the tokens of leases
  ended early, "<token>.<until s>" each) is compared as a set of entries, and its `xr`
  (the first entry of `r` when the permits' index was written) as whether it is the first
  entry of `r` on its own server: the scripts append to `r` in the order Lua's `pairs()`
  gives, which Redis 7.0, Valkey 8 and stock Lua 5.1 (fakeredis's, through lupa) each give
  differently (one order each, the same from run to run).
- Everything else must be equal: types (an integer reply is not a text), lengths, texts,
  every other integer, error or not, and what a script raised (its line and text: the
  servers word the rest of an error their own way).

`TOLERANCE_MS` covers the time between the real server's TIME read before a call (the
simulated server's clock at the call) and the call's own reading; the runner adds the
longest time a call and its state's read took on the real server in the sequence so far
(TIME before the call to TIME after the read), which a loaded machine can stretch.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .backends import ErrorReply, KeyState, State

__all__ = (
    "TOLERANCE_MS",
    "Dur",
    "Timed",
    "differences",
    "normal_reply",
    "normal_state",
)

TOLERANCE_MS = 25.0
WINDOW_US = 120_000_000
UNITS = (("s", 1_000_000), ("ms", 1_000), ("us", 1))
RESOLUTION_MS = {"s": 1000.0, "ms": 1.0, "us": 0.0}
"""A time's resolution: two readings an instant apart may round to values this far apart."""
REFUSAL_DURATIONS = (1, 6, 7)
FIRST_IS_PTTL = ("inspect", "el_read")
HGETALL_IN_INSPECT = (1, 3)
FIRST_OF_R = "<the first entry of r>"

_DIGITS = re.compile(r"\d{9,}")
_NUMBER = re.compile(r"-?\d+")


@dataclass(frozen=True, slots=True)
class Timed:
    """A time: its unit and its offset (ms) from the server's clock at the call."""

    unit: str
    offset_ms: float

    def __repr__(self) -> str:
        return f"<time {self.unit} {self.offset_ms:+.1f}ms>"


@dataclass(frozen=True, slots=True)
class Dur:
    """A duration (ms) the script measured on the server's clock."""

    ms: int

    def __repr__(self) -> str:
        return f"<duration {self.ms}ms>"


@dataclass(frozen=True, slots=True)
class Text:
    """A text with times in it: its parts, texts and `Timed`s."""

    parts: tuple[str | Timed, ...]


@dataclass(frozen=True, slots=True)
class Error:
    message: str


def timed(number: int, now_us: int) -> Timed | None:
    for unit, per in UNITS:
        delta = number * per - now_us
        if abs(delta) <= WINDOW_US:
            return Timed(unit, delta / 1000)
    return None


def _int(number: int, now_us: int) -> Any:
    return timed(number, now_us) or number


def _text(text: str, now_us: int) -> Any:
    parts: list[str | Timed] = []
    at = 0
    for match in _DIGITS.finditer(text):
        time = timed(int(match.group()), now_us)
        if time is None:
            continue
        parts += (text[at : match.start()], time)
        at = match.end()
    if not parts:
        return text
    parts.append(text[at:])
    return Text(tuple(p for p in parts if p != ""))


def _clock(value: list[Any] | tuple[Any, ...], now_us: int) -> Any:
    """A TIME reply, [seconds, microseconds], as the one time it is (or None)."""
    if len(value) != 2 or not all(isinstance(v, bytes) and v.isdigit() for v in value):
        return None
    seconds, micros = int(value[0]), int(value[1])
    if micros >= 1_000_000 or timed(seconds, now_us) is None:
        return None
    return ["TIME", timed(seconds * 1_000_000 + micros, now_us)]


_RAISED = re.compile(
    r"(?:user_script|\])?:(?P<line>\d+): (?P<text>.*?)"
    r"(?: script: [0-9a-f]{40}, on @user_script:\d+\.|\nstack traceback:.*)?$",
    re.DOTALL,
)
"""What a script raised (its line and text), in Redis's and Valkey's wording ("user_script:
426: TEXT script: SHA, on @user_script:426.") and fakeredis's ("Error running script (call
to f_SHA): @user_script:?: [string "<python>"]:426: TEXT\nstack traceback: ...")."""


def _error(message: str) -> Error:
    raised = _RAISED.search(message)
    if raised is None:
        return Error(message.strip())
    return Error(f"line {raised.group('line')}: {raised.group('text').strip()}")


def normal(value: Any, now_us: int) -> Any:
    """`value` (a reply, or a part of one) normalised: times found, texts decoded."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return _int(value, now_us)
    if isinstance(value, bytes):
        return _text(value.decode(errors="backslashreplace"), now_us)
    if isinstance(value, str):
        return _text(value, now_us)
    if isinstance(value, (list, tuple)):
        clock = _clock(value, now_us)
        return clock if clock is not None else [normal(v, now_us) for v in value]
    if isinstance(value, dict):
        return sorted(((normal(k, now_us), normal(v, now_us)) for k, v in value.items()), key=repr)
    if isinstance(value, (set, frozenset)):
        return sorted((normal(v, now_us) for v in value), key=repr)
    if isinstance(value, ErrorReply):
        return _error(value.message)
    return value


def _duration(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return Dur(value) if value >= 0 else value
    if isinstance(value, bytes) and _NUMBER.fullmatch(value.decode(errors="replace")):
        number = int(value)
        return ("text", Dur(number)) if number >= 0 else ("text", number)
    return value


def normal_reply(script: str, reply: Any, now_us: int) -> Any:
    """A script's reply normalised (see the module docstring)."""
    if isinstance(reply, list):
        reply = list(reply)
        positions: tuple[int, ...] = ()
        if len(reply) >= 7 and reply[0] == 0:
            positions = REFUSAL_DURATIONS
        elif script in FIRST_IS_PTTL and reply:
            positions = (0,)
        for i in positions:
            if i < len(reply):
                reply[i] = _duration(reply[i])
        if script == "inspect":
            for at in HGETALL_IN_INSPECT:
                if at < len(reply) and isinstance(reply[at], list):
                    reply[at] = _fields(reply[at])
    return _normal_keep(reply, now_us)


def _natural(entry: bytes) -> list[Any]:
    """An order of texts that two servers' readings of their clocks keep: numbers by value."""
    return [int(part) if part.isdigit() else part for part in re.split(rb"(\d+)", entry)]


def _fields(flat: list[Any]) -> list[Any]:
    """An HGETALL's flat list of fields and values, in the order of the fields' names (a
    hash's order is unspecified: in Redis, that of its table's buckets, seeded per process,
    once it is not a listpack), the typical hold `h` as a duration."""
    pairs = sorted(zip(flat[::2], flat[1::2], strict=True))
    out: list[Any] = []
    for name, value in pairs:
        out += (name, _duration(value) if name == b"h" else value)
    return out


def _normal_keep(value: Any, now_us: int) -> Any:
    """`normal`, leaving `Dur`s and ("text", Dur) as they are."""
    if isinstance(value, (Dur, tuple)):
        return value
    if isinstance(value, list):
        clock = _clock(value, now_us)
        return clock if clock is not None else [_normal_keep(v, now_us) for v in value]
    return normal(value, now_us)


def _score(raw: Any, now_us: int) -> Any:
    """A zset's score (a float, as redis-py reads it) as an integer when it is one."""
    number = float(raw)
    return _int(int(number), now_us) if number.is_integer() else number


def normal_key(key: str, state: KeyState, now_us: int) -> Any:
    """One key's state normalised: its type, PTTL (a duration) and value."""
    value = state.value
    if state.type == "hash" and isinstance(value, dict):
        fields = {k.decode() if isinstance(k, bytes) else k: v for k, v in value.items()}
        pairs = []
        for name, field in sorted(fields.items()):
            if name == "h":
                pairs.append((name, _duration(field)))
            elif name == "r":
                entries = sorted(field.split(b" ") if field else [], key=_natural)
                pairs.append((name, [normal(e, now_us) for e in entries]))
            elif name == "xr" and field == (fields.get("r") or b"").split(b" ")[0]:
                pairs.append((name, FIRST_OF_R))
            else:
                pairs.append((name, normal(field, now_us)))
        normalised: Any = pairs
    elif state.type == "list" and key.endswith(":holds"):
        normalised = [_duration(v) for v in value]
    elif state.type == "zset":
        normalised = [(normal(m, now_us), _score(s, now_us)) for m, s in value]
    else:
        normalised = normal(value, now_us)
    pttl: Any = Dur(state.pttl) if state.pttl >= 0 else state.pttl
    return (state.type, pttl, normalised)


def normal_state(state: State, now_us: int) -> dict[str, Any]:
    return {key: normal_key(key, s, now_us) for key, s in state.items()}


def _match(a: Any, b: Any, tol: float) -> bool:
    if isinstance(a, Timed) and isinstance(b, Timed):
        grain = RESOLUTION_MS[a.unit]
        return a.unit == b.unit and abs(a.offset_ms - b.offset_ms) <= tol + grain
    if isinstance(a, Dur) and isinstance(b, Dur):
        return abs(a.ms - b.ms) <= tol
    if type(a) is not type(b):
        return False
    if isinstance(a, Text):
        return _match(list(a.parts), list(b.parts), tol)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_match(x, y, tol) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_match(a[k], b[k], tol) for k in a)
    return bool(a == b)


def differences(
    fake: Any, real: Any, where: str = "", tol: float = TOLERANCE_MS
) -> Iterator[tuple[str, Any, Any]]:
    """Where two normalised values differ: (path, fake's, real's), outermost first; times
    and durations within `tol` ms match."""
    if _match(fake, real, tol):
        return
    if isinstance(fake, dict) and isinstance(real, dict):
        for key in sorted(fake.keys() | real.keys()):
            if key not in fake or key not in real:
                yield f"{where}{key}", fake.get(key, "<absent>"), real.get(key, "<absent>")
            else:
                yield from differences(fake[key], real[key], f"{where}{key}", tol)
        return
    yield where or "reply", fake, real
