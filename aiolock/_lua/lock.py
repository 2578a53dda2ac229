"""The Lua scripts of data layout 2, each one atomic round trip, each safe to apply twice.

redis-py retries a command after a connection error, so any script may run twice for one
call; each script below gives the same answer the second time, and a copy that arrives late
(after its caller gave up on it) is refused. Scripts are sent by EVALSHA and fall back to
EVAL (which also caches them) on NOSCRIPT, so a `SCRIPT FLUSH` or a restarted server costs
one extra round trip and is otherwise invisible. No state is kept per client: the SHA1 is
computed here, from the text.

Server work is what every client of a Redis shares, so each `redis.call` is counted. An
uncontended cycle on a name makes six (the layout reference in `_lua.layout` says why each):

- ACQUIRE: HMGET (the state: holder, last fencing token, refusals), TIME (the fencing token
  is floored by the server clock), HSET (the holder), PEXPIRE (its ttl);
- RELEASE: HMGET (the state: owner check, a waiter queue to serve), HDEL (the holder's
  fields; the rest of the state stays until the key expires).

A release that serves the wait queue, records a hold or must set the retention makes more.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .layout import (
    ABORT_RETAIN_MS,
    ABORTS_KEPT,
    DIRECT_PREFIX,
    GRACE_MS,
    HOLD_FIXED,
    KEPT_PREFIX,
    RESERVATION_MS,
    TOLD_EVERY_MS,
)

__all__ = (
    "ACQUIRE",
    "INSPECT",
    "RELEASE",
    "Join",
    "Script",
    "acquire_args",
    "acquired",
    "kept",
    "release_args",
    "released",
)


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


def kept(token: str) -> str:
    """What the state keeps of a token once its lease is gone: its first KEPT_PREFIX hex
    digits (64 bits), enough to recognise a late copy of its commands."""
    return token[:KEPT_PREFIX]


# The layout's constants, as Lua locals at the top of the scripts that need them. Those
# scripts read the server clock (TIME) before they write: Redis 6.2 configured with
# `lua-replicate-commands no` refuses that unless the script asks for its effects to be
# replicated (always the case, and the call a no-op, from Redis 7 on; fakeredis lacks it).
CONSTANTS = (
    "if redis.replicate_commands then redis.replicate_commands() end\n"
    f"local GRACE, RESERVATION = {GRACE_MS}, {RESERVATION_MS}\n"
    f"local TOLD_EVERY, DIRECT = {TOLD_EVERY_MS}, {DIRECT_PREFIX}\n"
    f"local ABORTS_KEPT, ABORT_RETAIN, KEPT = {ABORTS_KEPT}, {ABORT_RETAIN_MS}, {KEPT_PREFIX}\n"
)

# Shared by ACQUIRE and RELEASE. KEYS[1] the state hash, KEYS[2] the waiter queue (zset),
# KEYS[3] the waiter entries (hash). Numbers are handed to redis.call as Lua numbers, which
# Redis writes as their exact decimal digits (below 1e17); Lua's `..` would round them.
COMMON = """
local now_us, now_ms
-- Read the server clock (once, and only on the paths that need it).
local function clock()
  if not now_us then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_ms = math.floor(now_us / 1000)
  end
end
-- The next fencing token (a number): above the last one issued, and above the server clock
-- in µs, so tokens keep increasing across a restart that lost the state (or restored an
-- older copy of it). `last` is the state's `fence` field.
local function next_fence(last)
  clock()
  local fence = (tonumber(last or '') or 0) + 1
  if fence < now_us then
    fence = now_us
  end
  return fence
end
-- Take queue `wid` out of the waiter queue.
local function dequeue(wid)
  redis.call('ZREM', KEYS[2], wid)
  redis.call('HDEL', KEYS[3], wid)
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
-- Put queue `wid` in the waiter queue with entry "<until ms> <count> <tail>": at the back
-- (or keep its place), or, given `since` (server µs its oldest waiter has waited from), in
-- that waiter's place (or keep an earlier one); both queue keys live as long as their
-- longest entry. The state's `q` field tells a release that there may be waiters to serve.
local function enqueue(wid, until_ms, count, tail, since)
  clock()
  if since then
    redis.call('ZADD', KEYS[2], 'LT', since, wid)
  else
    redis.call('ZADD', KEYS[2], 'NX', now_us, wid)
  end
  redis.call('HSET', KEYS[1], 'q', 1)
  redis.call('HSET', KEYS[3], wid, string.format('%.0f %d ', until_ms, count) .. tail)
  local window = until_ms - now_ms + 1000
  if redis.call('PTTL', KEYS[2]) < window then
    redis.call('PEXPIRE', KEYS[2], window)
    redis.call('PEXPIRE', KEYS[3], window)
  end
end
"""

# Shared by the release scripts: KEYS[4] is the holds list.
HOLDS = """
-- Record a hold of `held` ms in the holds list (KEYS[4]): it keeps 100 to 150 entries,
-- trimmed (and its expiry renewed) every 50 holds.
local function record_hold(held)
  local length = redis.call('LPUSH', KEYS[4], held)
  if length == 1 or length > 150 then
    redis.call('LTRIM', KEYS[4], 0, 99)
    redis.call('PEXPIRE', KEYS[4], 86400000)
  end
end
"""

# Shared by the release scripts: KEYS[1] is the state hash, ARGV as RELEASE's.
FORBID = """
-- Remember that an acquire with `token` must never be granted (its caller aborted it): one
-- numbered field per token; each time ABORTS_KEPT more have come, only the newest
-- ABORTS_KEPT are kept. The state then lives at least the abort's retention (ARGV[3]; by
-- default ABORT_RETAIN ms), unless it is held.
local function forbid(token, held_now)
  local keep = tonumber(ARGV[3] or '') or ABORT_RETAIN
  local field = 'a:' .. token
  if redis.call('HEXISTS', KEYS[1], field) == 0 then
    local count = redis.call('HINCRBY', KEYS[1], 'ac', 1)
    redis.call('HSET', KEYS[1], field, count)
    if count % ABORTS_KEPT == 0 and count > ABORTS_KEPT then
      local fields = redis.call('HGETALL', KEYS[1])
      for i = 1, #fields, 2 do
        if string.sub(fields[i], 1, 2) == 'a:' and tonumber(fields[i + 1]) <= count - ABORTS_KEPT then
          redis.call('HDEL', KEYS[1], fields[i])
        end
      end
    end
  end
  if not held_now and redis.call('PTTL', KEYS[1]) < keep then
    redis.call('PEXPIRE', KEYS[1], keep)
  end
end
"""

ACQUIRE = Script(
    "acquire",
    """
-- KEYS[1] state (hash: the holder while held); only when the caller queues: KEYS[2] waiter
-- queue (zset), KEYS[3] waiter entries (hash), KEYS[4] recent holds (list; not used here)
-- ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] the holder, "<host> <pid> <task>"; only when the
-- caller queues: ARGV[4] id of the caller's process-local wait queue, ARGV[5] waiters of
-- that process queued behind the caller, ARGV[6] the rest of the queue entry:
-- "<host> <pid> <seq> <grant ms> <ttl ms> <grant token> <task>", ARGV[7..] tokens the lock
-- may have been granted to (earlier entries of the same queue): a lock held under one of
-- them is claimed, keeping its fencing token
-- Returns the fencing token, an integer: acquired free by a caller that does not queue, or
--           found already ours (a retry after a lost reply; its expiry is reset to the
--           ttl); a plain integer costs the server less than a table;
--         {1, fencing token}: acquired otherwise (a caller that queues);
--         {0, pttl ms, fencing token, holder, acquired ms, ttl ms, typical hold ms, check
--           ms}: held, or reserved for another queue, by the holder described ('' where
--           unknown), to be checked again within `check` ms if not told of a release ('' if
--           no sooner than pttl: grants told to one process alone, see RELEASE); the
--           caller's queue entry is added (at the back) or refreshed, and lives until
--           pttl + GRACE; a caller that does not queue marks the hold as refusing
--           (`b`: the holder's token's first KEPT digits), so that its release measures it;
--         {-1, 0}: this token was aborted by its owner, or already used: it must never be
--           granted (a late copy of an acquire whose caller gave up on it).
"""
    + CONSTANTS
    + """
local s = redis.call('HMGET', KEYS[1], 'token', 'reserved', 'fence', 'k', 'r', 'a:' .. ARGV[1])
local current, reserved = s[1], s[2]
if current == ARGV[1] then
  -- Already ours: a retry after a lost reply, or a caller's token (acquire-or-extend).
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(s[3])
end
local mine = string.sub(ARGV[1], 1, KEPT)
if s[6] or s[4] == mine or s[5] == mine then
  return {-1, 0}
end
local wid = ARGV[4] or ''
if not current and not reserved and wid == '' then
  -- Free, and the caller does not queue: the uncontended path, first and short (the
  -- helpers below are not even made). The fencing token as next_fence makes it.
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local fence = (tonumber(s[3] or '') or 0) + 1
  -- The clock's digits written as TIME gave them: cheaper than a number's conversion.
  local micro = string.rep('0', 6 - #t[2]) .. t[2]
  local digits
  if fence < us then
    fence, digits = us, t[1] .. micro
  else
    digits = string.format('%.0f', fence)
  end
  redis.call('HSET', KEYS[1], 'token', ARGV[1], 'fence', digits, 'k', mine, 'm', ARGV[3],
    'a', t[1] .. string.sub(micro, 1, 3), 't', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return fence
end
"""
    + COMMON
    + """
local claimed = current and listed(current, 7)
if not claimed and (current or (reserved and reserved ~= wid)) then
  local pttl = redis.call('PTTL', KEYS[1])
  if wid ~= '' then
    clock()
    enqueue(wid, now_ms + math.max(pttl, 0) + GRACE, tonumber(ARGV[5]) + 1, ARGV[6])
  end
  local h = redis.call('HMGET', KEYS[1], 'm', 'a', 't', 'h', 'b', 'g')
  if wid == '' and current and h[5] ~= string.sub(current, 1, KEPT) then
    -- A caller that will not wait in the queue: its release cannot measure the hold by a
    -- hand-over, so this hold is marked (once) for the release to measure.
    redis.call('HSET', KEYS[1], 'b', string.sub(current, 1, KEPT))
  end
  -- Grants made now are told on their process's channel alone (see RELEASE): a caller
  -- that waits checks again once the last of them would have lapsed.
  local check = ''
  local told = tonumber(h[6] or '')
  if told then
    clock()
    if now_ms >= told and now_ms - told < TOLD_EVERY then
      check = told + RESERVATION - now_ms
    end
  end
  return {0, pttl, s[3] or '', h[1] or '', h[2] or '', h[3] or '', h[4] or '', check}
end
-- Free, reserved for the caller's queue, or granted to it: take it.
local fence
if claimed then
  fence = tonumber(s[3])
else
  fence = next_fence(s[3])
end
clock()
if reserved then
  redis.call('HDEL', KEYS[1], 'reserved')
end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'fence', fence, 'k', mine, 'm', ARGV[3],
  'a', now_ms, 't', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if wid ~= '' then
  dequeue(wid)
  if tonumber(ARGV[5]) > 0 then
    -- More waiters in the caller's process: back of the queue, for after this hold.
    enqueue(wid, now_ms + tonumber(ARGV[2]) + GRACE, tonumber(ARGV[5]), ARGV[6])
  end
end
return {1, fence}
""",
)


def acquired(reply: Any) -> Sequence[Any]:
    """ACQUIRE's reply as a sequence: the fencing token alone (acquired, on the uncontended
    path) read as {1, fencing token}."""
    return [1, reply] if isinstance(reply, int) else reply


def released(reply: Any) -> Sequence[Any]:
    """RELEASE's reply as a sequence: the status alone (released, on the uncontended path)
    read as {status, '', '', '', 0}."""
    return [reply, b"", b"", b"", 0] if isinstance(reply, int) else reply


def acquire_args(
    token: str,
    ttl_ms: int,
    holder: str,
    *,
    queue: tuple[str, int, str] | None = None,
    claims: Sequence[str] = (),
) -> list[str | int]:
    """ARGV for ACQUIRE (see its header). `holder` is "<host> <pid> <task>"; `queue` is
    (queue id, waiters behind, entry) of the caller's wait queue, which the attempt puts in
    line; `claims` the tokens the lock may have been granted to under that queue."""
    args: list[str | int] = [token, ttl_ms, holder]
    if queue is not None:
        args += (*queue, *claims)
    return args


RELEASE = Script(
    "release",
    """
-- KEYS[1] state, KEYS[2] waiter queue, KEYS[3] waiter entries, KEYS[4] recent holds (list)
-- ARGV[1] token ('' when only withdrawing a queue); the others may be left out:
-- ARGV[2] mode: '' to release; 'abort' to also forbid a later acquire with this token (its
-- outcome is unknown); 'force' to evict the holder (aiolock release --force): the evicted
-- holder's own release then reports the loss; 'queue' to release and look at the wait
-- queue even if the state says nobody queued (layout-1 waiters do not say it),
-- ARGV[3] retention (ms): what stays of the state after this release lives that long
-- ('': until the released lease's own expiry); in 'abort' mode, at least that long (the
-- late copies of the aborted acquire are refused meanwhile; '': ABORT_RETAIN),
-- ARGV[4] how long (ms) the lease was held, as its holder measured it, followed by "f" if
-- the lease was not renewed (renew=False): recorded in the hold list ('' records nothing),
-- ARGV[5] id of a wait queue to withdraw ('' for none): its process stopped waiting,
-- ARGV[6] the releasing process's wait queue for this lock ('' if none waits there): it
-- joins the waiter queue (or keeps its place) before the lock is handed on,
-- ARGV[7] that queue's entry (as ARGV[6] of ACQUIRE), ARGV[8] its waiter count,
-- ARGV[9] with ARGV[6]: how long (µs) its oldest waiter has waited ('' or left out: it
-- goes to the back of the queue); when withdrawing, ARGV[9..]: tokens the lock may have
-- been granted to under that queue
-- A hold that refused an acquire (state `b`, see ACQUIRE) or was handed on is measured:
-- the typical hold `h` moves 1/8 of the way to it.
-- Returns 1 alone when the holder released it and nobody queued (the uncontended path: a
-- plain integer costs the server less than a table), else
--         {status, queue id, granted fencing token, granted seq, grant expiry ms}, status
--         1: released now and handed to that queue ('' if none waited);
--         2: released already, by an earlier attempt of this same call;
--         3: the queue was withdrawn; if the lock was reserved or granted to it, it was
--           handed on;
--         0: not the owner (expired, deleted, or someone else holds it).
-- A lock is handed to the first queue whose entry has not expired: granted to the token in
-- the entry (held under it for RESERVATION ms, until its process renews it), or, for an
-- entry without one (written by layout 1), reserved for the queue's next acquire. Granted
-- straight to the releasing process's own queue (nobody ahead of it: no queue in line, or
-- the first one scored after its oldest waiter came, see ARGV[9]), it is held for the
-- entry's full ttl: that process is alive, and its waiter takes it without a message.
-- Otherwise that queue goes in line in its oldest waiter's place (or keeps an earlier one).
-- Unless the queue is the releasing process's own, this is announced on the channel
-- KEYS[1]:released as "<released fencing token> <queue id>[ <granted fencing token>
-- <granted seq>]" (SPUBLISH on a cluster of Redis 7+ or Valkey: the variant of `_lua.cluster`).
"""
    + CONSTANTS
    + """
local mode, retain, held = ARGV[2] or '', ARGV[3] or '', ARGV[4] or ''
local own = ARGV[6] or ''
local s = redis.call('HMGET', KEYS[1], 'token', 'k', 'r', 'reserved', 'q', 'v', 'b')
if ARGV[1] ~= '' and s[1] == ARGV[1] and mode == '' and held == '' and own == ''
    and not s[5] and not s[6] and not s[7] then
  -- The holder releases, nobody queued: the uncontended path, first and short.
  redis.call('HDEL', KEYS[1], 'token', 'm', 'a', 't')
  if retain ~= '' then
    redis.call('PEXPIRE', KEYS[1], retain)
  end
  return 1
end
local mine = string.sub(ARGV[1], 1, KEPT)
"""
    + COMMON
    + FORBID
    + HOLDS
    + """
-- Whether the releasing holder's hold refused an acquire (and so is measured).
local refusing = s[7] ~= false and s[7] == mine and s[1] == ARGV[1]
-- Remove the holder's fields (and those of a holder written by layout 1), and the mark of
-- a refusing hold.
local function unhold(...)
  if s[6] then
    redis.call('HDEL', KEYS[1], 'token', 'm', 'a', 't', 'b', 'v', 'host', 'pid', 'task',
      'acquired_ms', 'ttl_ms', ...)
  else
    redis.call('HDEL', KEYS[1], 'token', 'm', 'a', 't', 'b', ...)
  end
end

-- Give the lock to queue `wid`, whose entry ends with `tail` ("<host> <pid>[ <grant>]"):
-- granted to the entry's token (for the entry's ttl if `full`, else for at most
-- RESERVATION ms), or reserved for the queue if it has none. The releaser's token is
-- recorded (`r`), and the hold it ended in the typical hold (`h`). Returns the granted
-- fencing token, registration seq and expiry ms ('', '', 0 if reserved).
local last
-- The state's last fencing token, acquisition time and typical hold (read once, and read
-- before a release deletes the holder's fields when the lock is to be handed on).
local function previous()
  if not last then
    last = redis.call('HMGET', KEYS[1], 'fence', 'a', 'h', 'g')
  end
  return last
end
-- The typical hold once the hold ending now is counted in (unchanged, or nil, unless a
-- holder releases normally); after previous().
local function typical_hold()
  clock()
  local typical = tonumber(last[3] or '')
  local hold = now_ms - (tonumber(last[2] or '') or now_ms)
  if (mode == '' or mode == 'queue') and ARGV[1] ~= '' then
    typical = typical and math.floor((typical * 7 + hold) / 8) or hold
  end
  return typical
end
local function give(wid, tail, full)
  previous()
  local host, pid, seq, g_ms, g_ttl, token, task = string.match(tail,
    '^(%S+) (%S+) (%d+) (%d+) (%d+) (%x+) (.*)$')
  if not token then
    redis.call('HSET', KEYS[1], 'reserved', wid)
    redis.call('PEXPIRE', KEYS[1], RESERVATION)
    return '', '', 0
  end
  local fence = next_fence(last[1])
  local typical = typical_hold()
  redis.call('HSET', KEYS[1], 'token', token, 'fence', fence, 'k', string.sub(token, 1, KEPT),
    'm', host .. ' ' .. pid .. ' ' .. task, 'a', now_ms, 't', g_ttl, 'r', mine, 'h', typical or '')
  local expiry = tonumber(g_ttl)
  if not full then
    expiry = math.min(tonumber(g_ms), RESERVATION)
    if string.sub(wid, 1, 1) == 'p' then
      expiry = math.min(expiry, RESERVATION - TOLD_EVERY)
    end
  end
  redis.call('PEXPIRE', KEYS[1], expiry)
  return string.format('%.0f', fence), seq, expiry
end

-- Hand the lock to the first queue whose entry has not expired, and announce it as
-- released by `what` (the releaser's fencing token if nil).
local function hand_over(what)
  local wid, granted, seq, expiry = '', '', '', 0
  if not s[5] and mode ~= 'queue' then
    return wid, granted, seq, expiry  -- nobody queued since the queue was last found empty
  end
  while true do
    local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if not head then
      redis.call('HDEL', KEYS[1], 'q')
      break
    end
    clock()
    local entry = redis.call('HGET', KEYS[3], head) or '0'
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
    local message = (what or last[1] or '') .. ' ' .. wid
    local channel = KEYS[1] .. ':released'
    if granted ~= '' then
      message = message .. ' ' .. granted .. ' ' .. seq
      if string.sub(wid, 1, 1) == 'p' then
        -- A queue that also listens on a channel of its process (its id starts with "p"
        -- and the process's channel id, see DIRECT): a grant is told there alone, unless
        -- the name's channel told of none for TOLD_EVERY ms. The other processes then
        -- check at the latest RESERVATION ms after the last grant told to all, and every
        -- grant not told to them lapses by then (it is held for at most
        -- RESERVATION - TOLD_EVERY ms unless renewed; see ACQUIRE's check).
        clock()
        local told = tonumber(last[4] or '')
        if told and now_ms - told < TOLD_EVERY and now_ms >= told then
          channel = channel .. ':' .. string.sub(wid, 1, DIRECT)
        else
          redis.call('HSET', KEYS[1], 'g', now_ms)
        end
      end
    end
    redis.call('PUBLISH', channel, message)
  end
  return wid, granted, seq, expiry
end

if ARGV[1] ~= '' and s[1] == ARGV[1] then
  if s[5] or own ~= '' or mode ~= '' or refusing then
    previous()  -- the lock may be handed on, or the hold measured here
  end
  unhold()
  if mode == 'force' then
    -- The evicted holder's own release must not find its token recorded.
    redis.call('HSET', KEYS[1], 'k', '-')
    clock()
    held = ''
    local acquired = tonumber(last[2] or '') or 0
    if acquired > 0 and redis.call('EXISTS', KEYS[4]) == 1 then
      held = now_ms - acquired  -- recorded where holds are (the server's measure)
    end
  elseif mode == 'abort' then
    forbid(ARGV[1], false)
  end
  if retain ~= '' and mode ~= 'abort' then
    redis.call('PEXPIRE', KEYS[1], retain)
  end
  if held ~= '' and mode ~= 'abort' then
    record_hold(held)
  end
  if own ~= '' then
    clock()
    -- Its oldest waiter has waited since `since` (server µs): the queue's entries are in
    -- the order their oldest waiters came, and one that came first is served first.
    local waited = tonumber(ARGV[9] or '')
    local since = waited and now_us - waited
    local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    if not head[1] or head[1] == own or (since and since < tonumber(head[2])) then
      -- Nobody is ahead of the releasing process's own waiters: straight to them (its
      -- entry, if it is in line, taken out).
      if head[1] and redis.call('ZREM', KEYS[2], own) == 1 then
        redis.call('HDEL', KEYS[3], own)
      end
      return {1, own, give(own, ARGV[7], true)}
    end
    enqueue(own, now_ms + RESERVATION + GRACE, tonumber(ARGV[8]), ARGV[7], since)
    s[5] = '1'
  end
  local wid, granted, seq, expiry = hand_over()
  if wid == '' and refusing and (mode == '' or mode == 'queue') then
    -- Not handed on (nobody queued): the refusing hold is measured here.
    redis.call('HSET', KEYS[1], 'h', typical_hold())
  end
  return {1, wid, granted, seq, expiry}
end
local withdraw = ARGV[5] or ''
if withdraw ~= '' then
  dequeue(withdraw)
  if s[4] == withdraw or (s[1] and listed(s[1], 9)) then
    unhold('reserved')
    s[5] = '1'
    return {3, hand_over('w' .. withdraw)}
  end
  return {3, '', '', '', 0}
end
if not s[1] and s[2] == mine or s[3] == mine then
  return {2, '', '', '', 0}
end
if mode == 'abort' then
  forbid(ARGV[1], s[1] ~= false)
end
return {0, '', '', '', 0}
""",
)


Join = tuple[str, str, int] | tuple[str, str, int, int]
"""A releasing process's own wait queue, for RELEASE: (queue id, entry, waiter count), and
how long its oldest waiter has waited (µs), where the script serves the oldest first."""


def release_args(
    *,
    token: str = "",
    retain_ms: int | None = None,
    held_ms: int | None = None,
    renewed: bool = True,
    abort: bool = False,
    withdraw: str = "",
    forced: bool = False,
    look_at_queue: bool = False,
    join: Join | None = None,
    claims: Sequence[str] = (),
) -> list[str | int]:
    """ARGV for RELEASE (see its header): release `token`, or `withdraw` a wait queue.

    `look_at_queue` makes the release serve the wait queue even when the state says that
    nobody queued (layout-1 waiters do not say it).

    `retain_ms` is how long the state stays after the release (None: until the released
    lease's own expiry); `held_ms` how long the lease was held (None: not recorded), and
    `renewed` whether the watchdog renewed it (a hold of a lease that was not is recorded
    with an "f" after the number, see HOLD_FIXED); `join` is the releasing process's own
    wait queue (`Join`); `claims`
    the tokens a withdrawn queue may have been granted the lock under. Arguments left at
    their defaults at the end are not sent.
    """
    mode = "abort" if abort else "force" if forced else "queue" if look_at_queue else ""
    retain: str | int = "" if retain_ms is None else retain_ms
    held: str | int = "" if held_ms is None else held_ms if renewed else f"{held_ms}{HOLD_FIXED}"
    args: list[str | int] = [token, mode, retain, held, withdraw]
    if join is not None:
        args += join
    elif claims:
        args += ("", "", 0)
    args += claims
    while len(args) > 1 and args[-1] == "":
        args.pop()
    return args


INSPECT = Script(
    "inspect",
    """
-- KEYS[1] state hash, KEYS[2] wait queue (zset), KEYS[3] its entries (hash)
-- Returns {pttl ms, {field1, value1, ...}, {queue ids, in order}, {id1, entry1, ...},
-- {server time: s, us}}: pttl -2 and no fields when no state is stored.
return {
  redis.call('PTTL', KEYS[1]),
  redis.call('HGETALL', KEYS[1]),
  redis.call('ZRANGE', KEYS[2], 0, -1),
  redis.call('HGETALL', KEYS[3]),
  redis.call('TIME'),
}
""",
)
