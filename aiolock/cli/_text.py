"""Values as text: what a terminal may show of a value from Redis (escaped, cut short),
durations, times, lists of words. No rich: the parser uses it too."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Final

from .._model.config import MAX_NAME_LENGTH


def and_list(words: Sequence[str], last: str = "and") -> str:
    """ "a", "a and b", "a, b and c"."""
    return f" {last} ".join(filter(None, (", ".join(words[:-1]), words[-1]))) if words else ""


_SHOWN_LIMIT: Final = MAX_NAME_LENGTH
"""Characters of one value shown in a message or by `show`: a longer one (never a name the
library takes) is cut short, with its length; `--json` gives it whole."""
CELL_LIMIT: Final = 60
"""Characters of a name shown in a row of `ls`, `watch` and `stats` (the table stays
readable beside a long one); `show` shows up to `_SHOWN_LIMIT`."""

_ESCAPES: Final = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escaped(char: str) -> str:
    """One character that is not printable as an escape: `\\n`, `\\x1b` (a control
    character, an ANSI sequence's ESC), `\\u202e` (a bidirectional override, a line
    separator, a zero-width character), `\\xff` for a byte that was not UTF-8 (decoded with
    `surrogateescape`)."""
    code = ord(char)
    if char in _ESCAPES:
        return _ESCAPES[char]
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(value: object, limit: int = _SHOWN_LIMIT) -> str:
    """A value from Redis (or the command line) as a terminal may show it: every character
    that `str.isprintable` calls unprintable escaped (see `_escaped`; the terminal acts on
    none of it), cut short past `limit` characters. Printed as text, never as markup (see
    `make_console`)."""
    text = str(value)
    shown = text[:limit]
    if not shown.isprintable():
        shown = "".join(char if char.isprintable() else _escaped(char) for char in shown)
    if len(text) > limit:
        shown += f"… ({len(text)} characters)"
    return shown


def quoted(value: object) -> str:
    """`printable(value)` in quotes, as a name appears in a sentence."""
    return f"'{printable(value)}'"


def article(label: str) -> str:
    """The article before a kind's label: "a lock", "an rwlock"."""
    return "an" if label[0] in "aeiour" else "a"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def utc(unix: float) -> str:
    moment = datetime.datetime.fromtimestamp(unix, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
