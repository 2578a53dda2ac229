"""The Lua scripts, each one atomic round trip, each safe to apply twice.

redis-py retries a command after a connection error, so any script may run twice for one
call; each script below gives the same answer the second time. Scripts are sent by EVALSHA
and fall back to EVAL (which also caches them) on NOSCRIPT, so a `SCRIPT FLUSH` or a
restarted server costs one extra round trip and is otherwise invisible. No state is kept per
client: the SHA1 is computed here, from the text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = ("ACQUIRE", "INSPECT", "RELEASE", "RENEW", "Script")


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


ACQUIRE = Script(
    "acquire",
    """
-- KEYS[1] holder hash, KEYS[2] fence hash
-- ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] host, ARGV[4] pid, ARGV[5] task name,
-- ARGV[6] fence hash ttl (ms)
-- Returns {1, fencing token}: acquired (also when a retry finds the key already ours);
--         {0, pttl ms of the current holder}: held by someone else;
--         {-1, 0}: this token was aborted by its owner, it must never be granted.
local current = redis.call('HGET', KEYS[1], 'token')
if current == ARGV[1] then
  return {1, tonumber(redis.call('HGET', KEYS[1], 'fence'))}
end
if current then
  return {0, redis.call('PTTL', KEYS[1])}
end
if redis.call('HGET', KEYS[2], 'aborted') == ARGV[1] then
  return {-1, 0}
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local fence = tonumber(redis.call('HGET', KEYS[2], 'n') or '0') + 1
if fence < now_us then
  fence = now_us
end
local fence_s = string.format('%.0f', fence)
redis.call('HSET', KEYS[2], 'n', fence_s)
redis.call('PEXPIRE', KEYS[2], ARGV[6])
redis.call('HSET', KEYS[1], 'v', '1', 'token', ARGV[1], 'fence', fence_s,
  'host', ARGV[3], 'pid', ARGV[4], 'task', ARGV[5],
  'acquired_ms', string.format('%.0f', math.floor(now_us / 1000)), 'ttl_ms', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, fence}
""",
)

RELEASE = Script(
    "release",
    """
-- KEYS[1] holder hash, KEYS[2] fence hash
-- ARGV[1] token, ARGV[2] release channel, ARGV[3] fence hash ttl (ms),
-- ARGV[4] '1' to abort: also forbid a later acquire with this token (its outcome is unknown)
-- Returns 1: released now (and announced on the channel);
--         2: released already, by an earlier attempt of this same call;
--         0: not the owner (expired, deleted, or someone else holds it).
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  local fence = redis.call('HGET', KEYS[1], 'fence')
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[2], 'released', ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  redis.call('PUBLISH', ARGV[2], fence)
  return 1
end
if redis.call('HGET', KEYS[2], 'released') == ARGV[1] then
  return 2
end
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[2], 'aborted', ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 0
""",
)

RENEW = Script(
    "renew",
    """
-- KEYS[1..N] holder hashes (one slot per call on Cluster)
-- ARGV[2i-1] token of KEYS[i], ARGV[2i] its ttl (ms)
-- Returns {r1..rN}: 1 = expiry reset to the ttl, 0 = not the owner (nothing changed).
local out = {}
for i = 1, #KEYS do
  if redis.call('HGET', KEYS[i], 'token') == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
""",
)

INSPECT = Script(
    "inspect",
    """
-- KEYS[1] holder hash
-- Returns {pttl ms, field1, value1, ...}: pttl -2 and no fields when the lock is free.
local out = {redis.call('PTTL', KEYS[1])}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields do
  out[i + 1] = fields[i]
end
return out
""",
)
