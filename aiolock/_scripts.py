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

from ._layout import FENCE_KEY_TTL_MS, RESERVATION_MS

__all__ = ("ACQUIRE", "INSPECT", "RELEASE", "RENEW", "Script", "release_args")


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
-- KEYS[1] holder hash, KEYS[2] fence hash, KEYS[3] waiter queue (zset), KEYS[4] waiter entries
-- ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] host, ARGV[4] pid, ARGV[5] task name,
-- ARGV[6] fence hash ttl (ms), ARGV[7] id of the caller's process-local wait queue
-- ('' = do not queue), ARGV[8] waiters of that process queued behind the caller,
-- ARGV[9] grace (ms) a queue entry outlives the holder's expiry
-- Returns {1, fencing token}: acquired (also when a retry finds the key already ours);
--         {0, pttl ms}: held, or reserved for another queue; the caller's queue entry is
--           added (at the back) or refreshed, and lives until pttl + grace;
--         {-1, 0}: this token was aborted by its owner, it must never be granted.
local holder = redis.call('HMGET', KEYS[1], 'token', 'reserved', 'fence')
local current, reserved = holder[1], holder[2]
if current == ARGV[1] then
  return {1, tonumber(holder[3])}
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local wid = ARGV[7]
local function enqueue(until_ms, count)
  if not redis.call('ZSCORE', KEYS[3], wid) then
    redis.call('ZADD', KEYS[3], now_us, wid)
  end
  redis.call('HSET', KEYS[4], wid,
    string.format('%.0f %d %s %s', until_ms, count, ARGV[3], ARGV[4]))
  local window = until_ms - now_ms + 1000
  if redis.call('PTTL', KEYS[3]) < window then
    redis.call('PEXPIRE', KEYS[3], window)
    redis.call('PEXPIRE', KEYS[4], window)
  end
end
if current or (reserved and reserved ~= wid) then
  local pttl = redis.call('PTTL', KEYS[1])
  if wid ~= '' then
    enqueue(now_ms + math.max(pttl, 0) + tonumber(ARGV[9]), tonumber(ARGV[8]) + 1)
  end
  return {0, pttl}
end
local counter = redis.call('HMGET', KEYS[2], 'n', 'aborted')
if counter[2] == ARGV[1] then
  return {-1, 0}
end
-- Free, or reserved for the caller's queue: take it.
local fence = tonumber(counter[1] or '0') + 1
if fence < now_us then
  fence = now_us
end
local fence_s = string.format('%.0f', fence)
redis.call('HSET', KEYS[2], 'n', fence_s)
redis.call('PEXPIRE', KEYS[2], ARGV[6])
if reserved then
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'v', '1', 'token', ARGV[1], 'fence', fence_s,
  'host', ARGV[3], 'pid', ARGV[4], 'task', ARGV[5],
  'acquired_ms', string.format('%.0f', now_ms), 'ttl_ms', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if wid ~= '' then
  redis.call('ZREM', KEYS[3], wid)
  redis.call('HDEL', KEYS[4], wid)
  if tonumber(ARGV[8]) > 0 then
    -- More waiters in the caller's process: back of the queue, for after this hold.
    enqueue(now_ms + tonumber(ARGV[2]) + tonumber(ARGV[9]), tonumber(ARGV[8]))
  end
end
return {1, fence}
""",
)

RELEASE = Script(
    "release",
    """
-- KEYS[1] holder hash, KEYS[2] fence hash, KEYS[3] waiter queue, KEYS[4] waiter entries,
-- KEYS[5] recent hold durations (list)
-- ARGV[1] token ('' when only withdrawing a queue), ARGV[2] release channel,
-- ARGV[3] fence hash ttl (ms),
-- ARGV[4] '1' to abort: also forbid a later acquire with this token (its outcome is unknown),
-- ARGV[5] reservation (ms): how long the lock waits for the first queued waiter to claim it,
-- ARGV[6] id of a wait queue to withdraw ('' for none): its process stopped waiting,
-- ARGV[7] '1' when evicting the holder (aiolock release --force): its token is not recorded
-- as released, so the evicted holder's own release reports the loss
-- Returns {1, queue id}: released now, reserved for that waiter queue ('' if none waited),
--           and announced on the channel as "<fencing token> <queue id>";
--         {2, ''}: released already, by an earlier attempt of this same call;
--         {3, queue id}: the queue was withdrawn; if the lock was reserved for it, it was
--           handed on (to the returned queue id, or '' for nobody) and announced;
--         {0, ''}: not the owner (expired, deleted, or someone else holds it).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Give the lock to the first queue whose entry has not expired, and announce it.
local function hand_over(fence)
  local wid = ''
  while true do
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not head then
      break
    end
    local entry = redis.call('HGET', KEYS[4], head)
    local until_ms = tonumber(entry and string.match(entry, '^(%d+)') or '0')
    redis.call('ZREM', KEYS[3], head)
    redis.call('HDEL', KEYS[4], head)
    if until_ms >= now_ms then
      wid = head
      break
    end
  end
  if wid ~= '' then
    -- Announce it only if someone waits: a waiter that is subscribed but not queued yet
    -- always tries again after subscribing, and finds the lock free.
    redis.call('HSET', KEYS[1], 'reserved', wid)
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
    redis.call('PUBLISH', ARGV[2], fence .. ' ' .. wid)
  end
  return wid
end

local holder = redis.call('HMGET', KEYS[1], 'token', 'fence', 'acquired_ms')
if ARGV[1] ~= '' and holder[1] == ARGV[1] then
  local acquired = tonumber(holder[3] or '0')
  redis.call('DEL', KEYS[1])
  if ARGV[7] ~= '1' then
    redis.call('HSET', KEYS[2], 'released', ARGV[1])
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
  end
  if acquired > 0 and ARGV[4] ~= '1' then
    local held = redis.call('LPUSH', KEYS[5], string.format('%.0f', now_ms - acquired))
    if held == 1 or held > 100 then
      redis.call('LTRIM', KEYS[5], 0, 99)
      redis.call('PEXPIRE', KEYS[5], ARGV[3])
    end
  end
  return {1, hand_over(holder[2])}
end
if ARGV[6] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[6])
  redis.call('HDEL', KEYS[4], ARGV[6])
  if redis.call('HGET', KEYS[1], 'reserved') == ARGV[6] then
    redis.call('DEL', KEYS[1])
    return {3, hand_over('w' .. ARGV[6])}
  end
  return {3, ''}
end
if redis.call('HGET', KEYS[2], 'released') == ARGV[1] then
  return {2, ''}
end
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[2], 'aborted', ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return {0, ''}
""",
)


def release_args(
    channel: str,
    *,
    token: str = "",
    abort: bool = False,
    withdraw: str = "",
    forced: bool = False,
) -> list[str | int]:
    """ARGV for RELEASE (see its header): release `token`, or `withdraw` a wait queue."""
    return [
        token,
        channel,
        FENCE_KEY_TTL_MS,
        "1" if abort else "0",
        RESERVATION_MS,
        withdraw,
        "1" if forced else "0",
    ]


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
