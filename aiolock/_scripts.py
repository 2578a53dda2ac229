"""The Lua scripts, each one atomic round trip, each safe to apply twice.

redis-py retries a command after a connection error, so any script may run twice for one
call; each script below gives the same answer the second time. Scripts are sent by EVALSHA
and fall back to EVAL (which also caches them) on NOSCRIPT, so a `SCRIPT FLUSH` or a
restarted server costs one extra round trip and is otherwise invisible. No state is kept per
client: the SHA1 is computed here, from the text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from ._layout import FENCE_KEY_TTL_MS, GRACE_MS, RESERVATION_MS

__all__ = ("ACQUIRE", "INSPECT", "RELEASE", "RENEW", "Script", "release_args")


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


_ENQUEUE = """
-- Put queue `wid` at the back of the waiter queue (or keep its place) with entry
-- "<until ms> <count> <tail>"; both queue keys live as long as their longest entry.
local function enqueue(wid, now_us, until_ms, count, tail)
  if not redis.call('ZSCORE', KEYS[3], wid) then
    redis.call('ZADD', KEYS[3], now_us, wid)
  end
  redis.call('HSET', KEYS[4], wid, string.format('%.0f %d ', until_ms, count) .. tail)
  local window = until_ms - math.floor(now_us / 1000) + 1000
  if redis.call('PTTL', KEYS[3]) < window then
    redis.call('PEXPIRE', KEYS[3], window)
    redis.call('PEXPIRE', KEYS[4], window)
  end
end
-- Issue the next fencing token: above the last one, and above the server clock in µs (so
-- a counter lost in a restart resumes above every earlier token).
local function next_fence(now_us, fence_ttl, last)
  local fence = tonumber(last or redis.call('HGET', KEYS[2], 'n') or '0') + 1
  if fence < now_us then
    fence = now_us
  end
  local fence_s = string.format('%.0f', fence)
  redis.call('HSET', KEYS[2], 'n', fence_s)
  redis.call('PEXPIRE', KEYS[2], fence_ttl)
  return fence_s
end
"""

ACQUIRE = Script(
    "acquire",
    """
-- KEYS[1] holder hash, KEYS[2] fence hash, KEYS[3] waiter queue (zset), KEYS[4] waiter entries
-- ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] host, ARGV[4] pid, ARGV[5] task name,
-- ARGV[6] fence hash ttl (ms), ARGV[7] id of the caller's process-local wait queue
-- ('' = do not queue), ARGV[8] waiters of that process queued behind the caller,
-- ARGV[9] grace (ms) a queue entry outlives the holder's expiry,
-- ARGV[10] the rest of the queue entry: "<host> <pid>", then, if the lock may be granted
-- to the queue directly, " <seq> <grant ms> <ttl ms> <grant token> <task>",
-- ARGV[11..] tokens the lock may have been granted to (earlier entries of the same queue):
-- a lock held under one of them is claimed, keeping its fencing token
-- Returns {1, fencing token}: acquired (also when a retry finds the key already ours);
--         {0, pttl ms}: held, or reserved for another queue; the caller's queue entry is
--           added (at the back) or refreshed, and lives until pttl + grace;
--         {-1, 0}: this token was aborted by its owner, it must never be granted.
"""
    + _ENQUEUE
    + """
local holder = redis.call('HMGET', KEYS[1], 'token', 'reserved', 'fence')
local current, reserved = holder[1], holder[2]
if current == ARGV[1] then
  return {1, tonumber(holder[3])}
end
local counter = redis.call('HMGET', KEYS[2], 'n', 'aborted')
if counter[2] == ARGV[1] then
  return {-1, 0}
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local wid = ARGV[7]
local claimed = false
if current then
  for i = 11, #ARGV do
    if ARGV[i] == current then
      claimed = true
    end
  end
end
if not claimed and (current or (reserved and reserved ~= wid)) then
  local pttl = redis.call('PTTL', KEYS[1])
  if wid ~= '' then
    enqueue(wid, now_us, now_ms + math.max(pttl, 0) + tonumber(ARGV[9]),
      tonumber(ARGV[8]) + 1, ARGV[10])
  end
  return {0, pttl}
end
-- Free, reserved for the caller's queue, or granted to it: take it.
local fence_s
if claimed then
  fence_s = holder[3]
  redis.call('PEXPIRE', KEYS[2], ARGV[6])
else
  fence_s = next_fence(now_us, ARGV[6], counter[1] or '0')
end
if reserved or claimed then
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
    enqueue(wid, now_us, now_ms + tonumber(ARGV[2]) + tonumber(ARGV[9]),
      tonumber(ARGV[8]), ARGV[10])
  end
end
return {1, tonumber(fence_s)}
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
-- ARGV[5] reservation (ms): how long a lock handed to a queued process waits for that
-- process to confirm it,
-- ARGV[6] id of a wait queue to withdraw ('' for none): its process stopped waiting,
-- ARGV[7] '1' when evicting the holder (aiolock release --force): its token is not recorded
-- as released, so the evicted holder's own release reports the loss,
-- ARGV[8] the releasing process's wait queue for this lock ('' if none waits there): it
-- joins the waiter queue (or keeps its place) before the lock is handed on,
-- ARGV[9] that queue's entry (as ARGV[10] of ACQUIRE), ARGV[10] its waiter count,
-- ARGV[11] how long (ms) that entry lives,
-- ARGV[12..] when withdrawing: tokens the lock may have been granted to under that queue
-- Returns {status, queue id, granted fencing token, granted seq}, status being
--         1: released now and handed to that queue ('' if none waited);
--         2: released already, by an earlier attempt of this same call;
--         3: the queue was withdrawn; if the lock was reserved or granted to it, it was
--           handed on;
--         0: not the owner (expired, deleted, or someone else holds it).
-- A lock is handed to the first queue whose entry has not expired: granted to the token in
-- the entry (held under it for ARGV[5] ms, until its process renews it), or, for an entry
-- without one, reserved for the queue's next acquire. Unless the queue is the releasing
-- process's own, this is announced on the channel as
-- "<released fencing token> <queue id>[ <granted fencing token> <granted seq>]".
"""
    + _ENQUEUE
    + """
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)

-- Give the lock to queue `wid`, whose entry ends with `tail` ("<host> <pid>[ <grant>]"):
-- granted to the entry's token, or reserved for the queue if it has none. Returns the
-- granted fencing token and registration seq ('' if reserved).
local function give(wid, tail)
  local host, pid, seq, g_ms, g_ttl, token, task = string.match(tail,
    '^(%S+) (%S+) (%d+) (%d+) (%d+) (%x+) (.*)$')
  if not token then
    redis.call('HSET', KEYS[1], 'reserved', wid)
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
    return '', ''
  end
  local fence = next_fence(now_us, ARGV[3])
  redis.call('HSET', KEYS[1], 'v', '1', 'token', token, 'fence', fence,
    'host', host, 'pid', pid, 'task', task,
    'acquired_ms', string.format('%.0f', now_ms), 'ttl_ms', g_ttl)
  redis.call('PEXPIRE', KEYS[1], math.min(tonumber(g_ms), tonumber(ARGV[5])))
  return fence, seq
end

-- Hand the lock to the first queue whose entry has not expired, and announce it.
local function hand_over(fence)
  local wid, granted, seq = '', '', ''
  while true do
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not head then
      break
    end
    local entry = redis.call('HGET', KEYS[4], head) or '0'
    redis.call('ZREM', KEYS[3], head)
    redis.call('HDEL', KEYS[4], head)
    local until_ms, tail = string.match(entry, '^(%d+) %d+ (.*)$')
    if until_ms and tonumber(until_ms) >= now_ms then
      wid = head
      granted, seq = give(wid, tail)
      break
    end
  end
  if wid ~= '' and wid ~= ARGV[8] then
    -- A waiter that is subscribed but not queued yet always tries again after subscribing,
    -- and finds the lock free: nothing is published when nobody is queued.
    local message = fence .. ' ' .. wid
    if granted ~= '' then
      message = message .. ' ' .. granted .. ' ' .. seq
    end
    redis.call('PUBLISH', ARGV[2], message)
  end
  return wid, granted, seq
end

local holder = redis.call('HMGET', KEYS[1], 'token', 'fence', 'acquired_ms', 'reserved')
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
  if ARGV[8] ~= '' then
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not head or head == ARGV[8] then
      -- Nobody is ahead of the releasing process's own waiters: straight to them.
      if head then
        redis.call('ZREM', KEYS[3], head)
        redis.call('HDEL', KEYS[4], head)
      end
      return {1, ARGV[8], give(ARGV[8], ARGV[9])}
    end
    enqueue(ARGV[8], now_us, now_ms + tonumber(ARGV[11]), tonumber(ARGV[10]), ARGV[9])
  end
  return {1, hand_over(holder[2])}
end
if ARGV[6] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[6])
  redis.call('HDEL', KEYS[4], ARGV[6])
  local ours = holder[4] == ARGV[6]
  if holder[1] then
    for i = 12, #ARGV do
      if ARGV[i] == holder[1] then
        ours = true
      end
    end
  end
  if ours then
    redis.call('DEL', KEYS[1])
    return {3, hand_over('w' .. ARGV[6])}
  end
  return {3, '', '', ''}
end
if redis.call('HGET', KEYS[2], 'released') == ARGV[1] then
  return {2, '', '', ''}
end
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[2], 'aborted', ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return {0, '', '', ''}
""",
)


def release_args(
    channel: str,
    *,
    token: str = "",
    abort: bool = False,
    withdraw: str = "",
    forced: bool = False,
    join: tuple[str, str, int] | None = None,
    claims: Sequence[str] = (),
) -> list[str | int]:
    """ARGV for RELEASE (see its header): release `token`, or `withdraw` a wait queue.

    `join` is (queue id, entry, waiter count) of the releasing process's own wait queue;
    `claims` the tokens a withdrawn queue may have been granted the lock under.
    """
    wid, entry, count = join if join is not None else ("", "", 0)
    return [
        token,
        channel,
        FENCE_KEY_TTL_MS,
        "1" if abort else "0",
        RESERVATION_MS,
        withdraw,
        "1" if forced else "0",
        wid,
        entry,
        count,
        RESERVATION_MS + GRACE_MS,
        *claims,
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
