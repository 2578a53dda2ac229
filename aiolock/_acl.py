"""The commands aiolock needs of a Redis user, and the least-privilege ACL line for them.

The commands are read from the scripts' text (every `redis.call` of the scripts that Lock,
Semaphore, ReadWriteLock and Redlock run), after those aiolock sends itself. `aiolock
doctor` checks a user against them; the documentation's ACL line is `ACL_LINE`.
"""

from __future__ import annotations

import re
from typing import Final

from . import _hash_scripts, _redlock_scripts, _rwlock_scripts, _scripts, _semaphore_scripts

__all__ = ("ACL_LINE", "OUTSIDE_SCRIPTS", "acl_line", "needed_commands")

OUTSIDE_SCRIPTS: Final = (
    "evalsha", "eval", "subscribe", "unsubscribe", "ping", "multi", "exec", "lrange",
)  # fmt: skip
"""Commands aiolock sends itself; the others are called by its Lua scripts. MULTI/EXEC and
LRANGE: a Semaphore's or ReadWriteLock's `info()`, read in one snapshot (whose other
commands the scripts call too)."""

_CALLS: Final = re.compile(r"redis\.p?call\(\s*['\"]([A-Za-z|]+)['\"]")


def _primitive_scripts() -> list[_scripts.Script]:
    """The scripts of Lock, Semaphore, ReadWriteLock and Redlock (a module's tuple of
    scripts included)."""
    found = []
    for module in (_scripts, _hash_scripts, _semaphore_scripts, _rwlock_scripts, _redlock_scripts):
        for value in vars(module).values():
            values = value if isinstance(value, tuple) else (value,)
            found += [v for v in values if isinstance(v, _scripts.Script)]
    return found


def needed_commands() -> tuple[str, ...]:
    """Every command aiolock's locks, semaphores, read-write locks and Redlocks need: those
    it sends, then those their scripts call."""
    inside = {c.lower() for s in _primitive_scripts() for c in _CALLS.findall(s.source)}
    return (*OUTSIDE_SCRIPTS, *sorted(inside - set(OUTSIDE_SCRIPTS)))


def acl_line(user: str = "aiolock-app", prefix: str = "aiolock") -> str:
    """The least-privilege `ACL SETUSER` line for aiolock's primitives with `prefix`."""
    grants = " ".join(f"+{c}" for c in needed_commands())
    return f"ACL SETUSER {user} reset on >PASSWORD ~{prefix}:* resetchannels &{prefix}:* {grants}"


ACL_LINE: Final = acl_line()
