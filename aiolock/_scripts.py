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

from ._layout import ABORTS_KEPT, FENCE_KEY_TTL_MS, GRACE_MS, RESERVATION_MS

__all__ = ("ACQUIRE", "INSPECT", "RELEASE", "RENEW", "Script", "acquire_args", "release_args")


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


# The layout's constants, as Lua locals at the top of the scripts that need them. Those
# scripts read the server clock (TIME) before they write: Redis 6.2 configured with
# `lua-replicate-commands no` refuses that unless the script asks for its effects to be
# replicated (always the case, and the call a no-op, from Redis 7 on; fakeredis lacks it).
_CONSTANTS = (
    "if redis.replicate_commands then redis.replicate_commands() end\n"
    f"local FENCE_TTL, GRACE, RESERVATION = {FENCE_KEY_TTL_MS}, {GRACE_MS}, {RESERVATION_MS}\n"
    f"local ABORTS_KEPT = {ABORTS_KEPT}\n"
)

# Numbers are handed to redis.call as Lua numbers, which Redis writes as their exact
# decimal digits (below 1e17); Lua's own `..` would round them to 14 digits.
_ENQUEUE = """
-- Take queue `wid` out of the waiter queue.
local function dequeue(wid)
  redis.call('ZREM', KEYS[3], wid)
  redis.call('HDEL', KEYS[4], wid)
end
-- Whether `token` is one of ARGV[first..]: the tokens a queue's lock may be granted under.
local function listed(token, first)
  for i = first, #ARGV do
    if ARGV[i] == token then
      return true
    end
  end
  return false
end
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
-- Issue the next fencing token (a number): above the last one, and above the server clock
-- in µs, so a counter lost in a restart resumes above every earlier token. `counter` is
-- {n, x} of the fence hash (read here if nil), x being when (ms) its expiry was last set:
-- it is set again only once half of it has passed, so after this the hash lives at least
-- FENCE_TTL / 2 more.
local function next_fence(now_us, counter)
  counter = counter or redis.call('HMGET', KEYS[2], 'n', 'x')
  local fence = (tonumber(counter[1] or '') or 0) + 1
  if fence < now_us then
    fence = now_us
  end
  local now_ms = math.floor(now_us / 1000)
  if now_ms - (tonumber(counter[2] or '') or 0) > FENCE_TTL / 2 then
    redis.call('HSET', KEYS[2], 'n', fence, 'x', now_ms)
    redis.call('PEXPIRE', KEYS[2], FENCE_TTL)
  else
    redis.call('HSET', KEYS[2], 'n', fence)
  end
  return fence
end
"""

ACQUIRE = Script(
    "acquire",
    """
-- KEYS[1] holder hash, KEYS[2] fence hash, KEYS[3] waiter queue (zset), KEYS[4] waiter entries
-- ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] host, ARGV[4] pid, ARGV[5] task name; only when
-- the caller queues: ARGV[6] id of the caller's process-local wait queue, ARGV[7] waiters
-- of that process queued behind the caller, ARGV[8] the rest of the queue entry:
-- "<host> <pid>", then, if the lock may be granted to the queue directly,
-- " <seq> <grant ms> <ttl ms> <grant token> <task>", ARGV[9..] tokens the lock may have
-- been granted to (earlier entries of the same queue): a lock held under one of them is
-- claimed, keeping its fencing token
-- Returns {1, fencing token}: acquired (also when a retry finds the key already ours);
--         {0, pttl ms}: held, or reserved for another queue; the caller's queue entry is
--           added (at the back) or refreshed, and lives until pttl + GRACE;
--         {-1, 0}: this token was aborted by its owner, or already released: it must never
--           be granted (a late copy of an acquire whose caller gave up on it).
"""
    + _CONSTANTS
    + _ENQUEUE
    + """
local holder = redis.call('HMGET', KEYS[1], 'token', 'reserved', 'fence')
local current, reserved = holder[1], holder[2]
if current == ARGV[1] then
  return {1, tonumber(holder[3])}
end
local counter = redis.call('HMGET', KEYS[2], 'n', 'x', 'released', 'a:' .. ARGV[1])
if counter[3] == ARGV[1] or counter[4] then
  return {-1, 0}
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local wid = ARGV[6] or ''
local claimed = current and listed(current, 9)
if not claimed and (current or (reserved and reserved ~= wid)) then
  local pttl = redis.call('PTTL', KEYS[1])
  if wid ~= '' then
    enqueue(wid, now_us, now_ms + math.max(pttl, 0) + GRACE, tonumber(ARGV[7]) + 1, ARGV[8])
  end
  return {0, pttl}
end
-- Free, reserved for the caller's queue, or granted to it: take it.
local fence
if claimed then
  fence = tonumber(holder[3])
  redis.call('PEXPIRE', KEYS[2], FENCE_TTL)
else
  fence = next_fence(now_us, counter)
end
if reserved or claimed then
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'v', '1', 'token', ARGV[1], 'fence', fence,
  'host', ARGV[3], 'pid', ARGV[4], 'task', ARGV[5], 'acquired_ms', now_ms, 'ttl_ms', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if wid ~= '' then
  dequeue(wid)
  if tonumber(ARGV[7]) > 0 then
    -- More waiters in the caller's process: back of the queue, for after this hold.
    enqueue(wid, now_us, now_ms + tonumber(ARGV[2]) + GRACE, tonumber(ARGV[7]), ARGV[8])
  end
end
return {1, fence}
""",
)


def acquire_args(
    token: str,
    ttl_ms: int,
    host: str,
    pid: int,
    task: str,
    *,
    queue: tuple[str, int, str] | None = None,
    claims: Sequence[str] = (),
) -> list[str | int]:
    """ARGV for ACQUIRE (see its header). `queue` is (queue id, waiters behind, entry) of
    the caller's wait queue, which the attempt puts in line; `claims` the tokens the lock
    may have been granted to under that queue."""
    args: list[str | int] = [token, ttl_ms, host, pid, task]
    if queue is not None:
        args += (*queue, *claims)
    return args


RELEASE = Script(
    "release",
    """
-- KEYS[1] holder hash, KEYS[2] fence hash, KEYS[3] waiter queue, KEYS[4] waiter entries,
-- KEYS[5] recent hold durations (list)
-- ARGV[1] token ('' when only withdrawing a queue); the others may be left out:
-- ARGV[2] how long (ms) the lease was held, as its holder measured it: recorded in the hold
-- list ('' records nothing),
-- ARGV[3] mode: '' to release; 'abort' to also forbid a later acquire with this token (its
-- outcome is unknown); 'force' to evict the holder (aiolock release --force): its token is
-- not recorded as released, so the evicted holder's own release reports the loss, and its
-- hold is recorded as the server measures it,
-- ARGV[4] id of a wait queue to withdraw ('' for none): its process stopped waiting,
-- ARGV[5] the releasing process's wait queue for this lock ('' if none waits there): it
-- joins the waiter queue (or keeps its place) before the lock is handed on,
-- ARGV[6] that queue's entry (as ARGV[8] of ACQUIRE), ARGV[7] its waiter count,
-- ARGV[8..] when withdrawing: tokens the lock may have been granted to under that queue
-- Returns {status, queue id, granted fencing token, granted seq, grant expiry ms}, status being
--         1: released now and handed to that queue ('' if none waited);
--         2: released already, by an earlier attempt of this same call;
--         3: the queue was withdrawn; if the lock was reserved or granted to it, it was
--           handed on;
--         0: not the owner (expired, deleted, or someone else holds it).
-- A lock is handed to the first queue whose entry has not expired: granted to the token in
-- the entry (held under it for RESERVATION ms, until its process renews it), or, for an
-- entry without one, reserved for the queue's next acquire. Granted straight to the
-- releasing process's own queue (nobody ahead of it), it is held for the entry's full ttl:
-- that process is alive, and its waiter takes the lock without a message. Unless the queue is the
-- releasing process's own, this is announced on the channel KEYS[1]:released as
-- "<released fencing token> <queue id>[ <granted fencing token> <granted seq>]".
"""
    + _CONSTANTS
    + _ENQUEUE
    + """
local held, mode, own = ARGV[2] or '', ARGV[3] or '', ARGV[5] or ''
local now_us, now_ms

-- Read the server clock (once, and only on the paths that hand the lock on).
local function clock()
  if not now_us then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_ms = math.floor(now_us / 1000)
  end
end

-- Give the lock to queue `wid`, whose entry ends with `tail` ("<host> <pid>[ <grant>]"):
-- granted to the entry's token (for the entry's ttl if `full`, else for at most
-- RESERVATION ms), or reserved for the queue if it has none. Returns the granted fencing
-- token, registration seq and expiry ms ('', '', 0 if reserved).
local function give(wid, tail, full)
  local host, pid, seq, g_ms, g_ttl, token, task = string.match(tail,
    '^(%S+) (%S+) (%d+) (%d+) (%d+) (%x+) (.*)$')
  if not token then
    redis.call('HSET', KEYS[1], 'reserved', wid)
    redis.call('PEXPIRE', KEYS[1], RESERVATION)
    return '', '', 0
  end
  local fence = next_fence(now_us)
  redis.call('HSET', KEYS[1], 'v', '1', 'token', token, 'fence', fence,
    'host', host, 'pid', pid, 'task', task, 'acquired_ms', now_ms, 'ttl_ms', g_ttl)
  local expiry = tonumber(g_ttl)
  if not full then
    expiry = math.min(tonumber(g_ms), RESERVATION)
  end
  redis.call('PEXPIRE', KEYS[1], expiry)
  return string.format('%.0f', fence), seq, expiry
end

-- Remember that an acquire with `token` must never be granted (its caller aborted it): one
-- numbered field per token; each time ABORTS_KEPT more have come, only the newest
-- ABORTS_KEPT are kept.
local function forbid(token)
  local field = 'a:' .. token
  if redis.call('HEXISTS', KEYS[2], field) == 0 then
    local count = redis.call('HINCRBY', KEYS[2], 'ac', 1)
    redis.call('HSET', KEYS[2], field, count)
    if count % ABORTS_KEPT == 0 and count > ABORTS_KEPT then
      local fields = redis.call('HGETALL', KEYS[2])
      for i = 1, #fields, 2 do
        if string.sub(fields[i], 1, 2) == 'a:' and tonumber(fields[i + 1]) <= count - ABORTS_KEPT then
          redis.call('HDEL', KEYS[2], fields[i])
        end
      end
    end
  end
  redis.call('PEXPIRE', KEYS[2], FENCE_TTL)
end

-- Hand the lock to the first queue whose entry has not expired, and announce it.
local function hand_over(fence)
  local wid, granted, seq, expiry = '', '', '', 0
  while true do
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not head then
      break
    end
    clock()
    local entry = redis.call('HGET', KEYS[4], head) or '0'
    dequeue(head)
    local until_ms, tail = string.match(entry, '^(%d+) %d+ (.*)$')
    if until_ms and tonumber(until_ms) >= now_ms then
      wid = head
      granted, seq, expiry = give(wid, tail, false)
      break
    end
  end
  if wid ~= '' and wid ~= own then
    -- A waiter that is subscribed but not queued yet always tries again after subscribing,
    -- and finds the lock free: nothing is published when nobody is queued.
    local message = fence .. ' ' .. wid
    if granted ~= '' then
      message = message .. ' ' .. granted .. ' ' .. seq
    end
    redis.call('PUBLISH', KEYS[1] .. ':released', message)
  end
  return wid, granted, seq, expiry
end

local holder = redis.call('HMGET', KEYS[1], 'token', 'fence', 'acquired_ms', 'reserved')
if ARGV[1] ~= '' and holder[1] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if mode == 'force' then
    clock()
    local acquired = tonumber(holder[3] or '') or 0
    held = acquired > 0 and now_ms - acquired or ''
  else
    -- The acquire left the fence hash at least FENCE_TTL / 2 to live: renew its expiry
    -- only after a long hold (or one of unknown length), or if the hash was gone (evicted)
    -- and this made it anew; a field new to the hash tells both that and a first release.
    local new_field = redis.call('HSET', KEYS[2], 'released', ARGV[1])
    if new_field == 1 or held == '' or tonumber(held) >= FENCE_TTL / 4 then
      redis.call('PEXPIRE', KEYS[2], FENCE_TTL)
    end
  end
  if mode == 'abort' then
    forbid(ARGV[1])
  end
  if held ~= '' and mode ~= 'abort' then
    -- The list keeps 100 to 150 entries: trimmed (and its expiry renewed) every 50 holds.
    local length = redis.call('LPUSH', KEYS[5], held)
    if length == 1 or length > 150 then
      redis.call('LTRIM', KEYS[5], 0, 99)
      redis.call('PEXPIRE', KEYS[5], FENCE_TTL)
    end
  end
  if own ~= '' then
    clock()
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not head or head == own then
      -- Nobody is ahead of the releasing process's own waiters: straight to them.
      if head then
        dequeue(head)
      end
      return {1, own, give(own, ARGV[6], true)}
    end
    enqueue(own, now_us, now_ms + RESERVATION + GRACE, tonumber(ARGV[7]), ARGV[6])
  end
  return {1, hand_over(holder[2])}
end
local withdraw = ARGV[4] or ''
if withdraw ~= '' then
  dequeue(withdraw)
  if holder[4] == withdraw or (holder[1] and listed(holder[1], 8)) then
    redis.call('DEL', KEYS[1])
    return {3, hand_over('w' .. withdraw)}
  end
  return {3, '', '', '', 0}
end
if redis.call('HGET', KEYS[2], 'released') == ARGV[1] then
  return {2, '', '', '', 0}
end
if mode == 'abort' then
  forbid(ARGV[1])
end
return {0, '', '', '', 0}
""",
)


def release_args(
    *,
    token: str = "",
    held_ms: int | None = None,
    abort: bool = False,
    withdraw: str = "",
    forced: bool = False,
    join: tuple[str, str, int] | None = None,
    claims: Sequence[str] = (),
) -> list[str | int]:
    """ARGV for RELEASE (see its header): release `token`, or `withdraw` a wait queue.

    `held_ms` is how long the lease was held (None: not recorded); `join` is (queue id,
    entry, waiter count) of the releasing process's own wait queue; `claims` the tokens a
    withdrawn queue may have been granted the lock under. Arguments left at their defaults
    at the end are not sent.
    """
    mode = "abort" if abort else "force" if forced else ""
    held: str | int = "" if held_ms is None else held_ms
    args: list[str | int] = [token, held, mode, withdraw]
    if join is not None:
        args += join
    elif claims:
        args += ("", "", 0)
    args += claims
    while len(args) > 1 and args[-1] == "":
        args.pop()
    return args


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
