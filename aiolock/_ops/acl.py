"""The commands aiolock needs of a Redis user, the least-privilege ACL line for them, and
what `aiolock doctor` probes them with.

The commands are read from the scripts' text (every `redis.call` of the scripts that Lock,
Semaphore, ReadWriteLock and Redlock run), after those aiolock sends itself. `aiolock
doctor` checks a user against them (with ACL DRYRUN, or by running them on scratch keys
with `PROBE`); the documentation's ACL line is `ACL_LINE`.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Final

from .._lua import hash_leases, lease, lock, redlock, rwlock, semaphore
from .._lua.layout import LockKeys
from .._lua.lock import Script

__all__ = (
    "ACL_LINE",
    "OUTSIDE_SCRIPTS",
    "PROBE",
    "PROBE_ORDER",
    "PROBE_SHA",
    "SHARDED",
    "Scratch",
    "acl_line",
    "needed_commands",
    "short",
)

OUTSIDE_SCRIPTS: Final = (
    "evalsha", "eval", "subscribe", "unsubscribe", "ping", "multi", "exec", "lrange",
)  # fmt: skip
"""Commands aiolock sends itself; the others are called by its Lua scripts. MULTI/EXEC and
LRANGE: a Semaphore's or ReadWriteLock's `info()`, read in one snapshot (whose other
commands the scripts call too)."""

SHARDED: Final = ("spublish", "ssubscribe", "sunsubscribe")
"""Sharded pub/sub, which release notifications use on a cluster of Redis 7+ or Valkey;
without them they fall back to classic pub/sub, heard on every node over the bus."""

_CALLS: Final = re.compile(r"redis\.p?call\(\s*['\"]([A-Za-z|]+)['\"]")


def _primitive_scripts() -> list[Script]:
    """The scripts of Lock, Semaphore, ReadWriteLock and Redlock (a module's tuple of
    scripts included)."""
    found = []
    modules = (lock, lease, hash_leases, semaphore, rwlock)
    for module in (*modules, redlock):
        for value in vars(module).values():
            values = value if isinstance(value, tuple) else (value,)
            found += [v for v in values if isinstance(v, Script)]
    return found


def needed_commands() -> tuple[str, ...]:
    """Every command aiolock's locks, semaphores, read-write locks and Redlocks need: those
    it sends, then those their scripts call."""
    inside = {c.lower() for s in _primitive_scripts() for c in _CALLS.findall(s.source)}
    return (*OUTSIDE_SCRIPTS, *sorted(inside - set(OUTSIDE_SCRIPTS)))


def acl_line(user: str = "aiolock-app", prefix: str = "aiolock", *, sharded: bool = False) -> str:
    """The least-privilege `ACL SETUSER` line for aiolock's primitives with `prefix` (and
    sharded pub/sub if `sharded`: a cluster of Redis 7+ or Valkey)."""
    commands = (*needed_commands(), *(SHARDED if sharded else ()))
    grants = " ".join(f"+{c}" for c in commands)
    return f"ACL SETUSER {user} reset on >PASSWORD ~{prefix}:* resetchannels &{prefix}:* {grants}"


ACL_LINE: Final = acl_line()


# --------------------------------------------------------------------------- the probe
PROBE: Final = """
-- ARGV: command, number of arguments, arguments..., repeated. Runs each with pcall.
-- Returns the failures: "command: error", one per command that failed.
local failed = {}
local i = 1
while i <= #ARGV do
  local n = tonumber(ARGV[i + 1])
  local call = {ARGV[i]}
  for j = 1, n do call[#call + 1] = ARGV[i + 1 + j] end
  local reply = redis.pcall(unpack(call))
  if type(reply) == 'table' and reply.err then
    failed[#failed + 1] = ARGV[i] .. ': ' .. reply.err
  end
  i = i + 2 + n
end
return failed
"""
PROBE_SHA: Final = hashlib.sha1(PROBE.encode(), usedforsecurity=False).hexdigest()


@dataclass(frozen=True, slots=True)
class Scratch:
    """Keys and a channel under the prefix, for probing; they expire within seconds."""

    lock: str
    holds: str
    queue: str
    channel: str

    @classmethod
    def make(cls, prefix: str) -> Scratch:
        keys = LockKeys.build(prefix, f"doctor-{secrets.token_hex(6)}")
        return cls(
            lock=keys.lock, holds=f"{keys.lock}:holds", queue=f"{keys.lock}:queue",
            channel=keys.channel,
        )  # fmt: skip

    def arguments(self, command: str) -> list[str] | None:
        """Arguments that make `command` succeed on the scratch keys (in `PROBE_ORDER`),
        or None for a command this table does not know."""
        lock, holds, queue = self.lock, self.holds, self.queue
        return {
            "hset": [lock, "doctor", "1"],
            "hsetnx": [lock, "doctor-nx", "1"],
            "hincrby": [lock, "doctor", "1"],
            "hget": [lock, "doctor"],
            "hmget": [lock, "doctor"],
            "hexists": [lock, "doctor"],
            "hgetall": [lock],
            "hlen": [lock],
            "hdel": [lock, "doctor"],
            "lpush": [holds, "1"],
            "rpush": [holds, "1"],
            "lrange": [holds, "0", "0"],
            "llen": [holds],
            "ltrim": [holds, "1", "0"],  # empties the list: the key goes
            "zadd": [queue, "1", "doctor"],
            "zrange": [queue, "0", "-1"],
            "zrangebyscore": [queue, "-inf", "+inf"],
            "zcard": [queue],
            "zscore": [queue, "doctor"],
            "zrem": [queue, "doctor"],
            "publish": [self.channel, "doctor"],
            "spublish": [self.channel, "doctor"],
            "ssubscribe": [self.channel],
            "sunsubscribe": [self.channel],
            "time": [],
            "ping": [],
            "exists": [lock],
            "pexpire": [lock, "5000"],
            "pttl": [lock],
            "del": [lock, holds, queue],
            "subscribe": [self.channel],
            "unsubscribe": [self.channel],
            "multi": [],
            "exec": [],
            "eval": ["return 1", "1", lock],
            "evalsha": ["e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "1", lock],
        }.get(command)


PROBE_ORDER: Final = (
    "hset", "hsetnx", "hincrby", "hget", "hmget", "hexists", "hgetall", "hlen", "hdel",
    "lpush", "rpush", "lrange", "llen", "ltrim", "zadd", "zrange", "zrangebyscore", "zcard",
    "zscore", "zrem", "publish", "time", "ping", "exists", "pexpire", "pttl", "del",
)  # fmt: skip
"""Commands the probe knows, in an order where each finds the key it needs, `del` last."""


def short(failure: str) -> str:
    """`"hset: ... no permissions to run the 'hset' command"` → `"hset"`; others whole."""
    command, _, reason = failure.partition(": ")
    refusal = "no permissions to run" in reason or "can't run this command" in reason
    return command if refusal else failure
