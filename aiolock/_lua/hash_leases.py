"""Lua of the primitives whose leases are fields of one hash, read whole (`ReadWriteLock`),
in the conventions of `_lua.lock`. A `Semaphore` keeps its permits in the same fields but
reads them through an index (`_lua.permit_index`, which takes the bounds of `r` from here);
`EXPIRE_LEASES` serves both.

The state hash (KEYS[1]) holds the primitive's own fields (`fence`, `q`, `r`, `ru`, `h`,
`a:<token>`/`ac`, and what the primitive adds) and one field per lease held, `p:<token>` =
"<slot> <expires at, server ms> <fencing token> <acquired at, ms> <ttl ms> <host> <pid>
<task>": a semaphore's permit slot, or a read-write lock's side (0 read, 1 write). The key
lives at least as long as every lease in it and its wait queue; RENEW (kind 'p') resets
one lease's expiry. KEYS[2] and KEYS[3] are the caller's wait queue (as a lock's).

A script is CONSTANTS, then `STATE` (one HGETALL reads everything), COMMON, FORBID and
HOLDS if it releases, `LEASES` (and `END_LEASE` if it releases), and its own code, which sets `limit` (a semaphore's; nil otherwise).
Writes are gathered and made by `flush()` in at most three commands (HDEL, HSET, PEXPIRE).
What the semaphore's permit index does alike is written once here: `GATHERED` (in `LEASES`
and in `_lua.permit_index.INDEX`) and `end_lease` (`END_LEASE`, and its `END_PERMIT`).
"""

from __future__ import annotations

from .lock import Script

__all__ = (
    "END_LEASE",
    "EXPIRE_LEASES",
    "GATHERED",
    "LEASES",
    "RECENT_CAP_MS",
    "RECENT_ENTRY",
    "RECENT_KEPT",
    "RECENT_MAX",
    "RECENT_MERGED",
    "RELEASE_HELPERS",
    "STATE",
    "end_lease",
)

RECENT_KEPT = 16
"""Ended tokens a state written by an earlier version kept in `r` (its newest 16)."""

RECENT_MAX = 256
"""Most ended tokens the state keeps in `r` (see `LEASES`): about 7 KB at most."""

RECENT_ENTRY = 28
"""Characters of one entry of `r`, "<KEPT hex digits>.<until, Unix s>", and its separator."""

RECENT_CAP_MS = 3_600_000
"""Longest an ended token is kept (the lock's RETAIN_CAP): a released state never lives
longer than max(retain, this), whatever the ttl."""

STATE = (
    f"local RECENT_MAX, RECENT_ENTRY, RECENT_CAP = {RECENT_MAX}, {RECENT_ENTRY}, {RECENT_CAP_MS}\n"
    + """
local state, permits = {}, {}
do
  local fields = redis.call('HGETALL', KEYS[1])
  for i = 1, #fields, 2 do
    local name = fields[i]
    state[name] = fields[i + 1]
    if string.sub(name, 1, 2) == 'p:' then
      permits[#permits + 1] = name
    end
  end
end
local mine = string.sub(ARGV[1], 1, KEPT)
local last_fence, queued, limit = state.fence, state.q, nil
"""
)

# Shared by the scripts of both layouts (`LEASES` here, `_lua.permit_index.INDEX`), last: the
# leases a release forgets, and the release-style reply.
RELEASE_HELPERS = """-- A release: the leases (permits) granted under the tokens ARGV[first..] (registrations the
-- caller's queue forgets), and `also` if held, as a set of field names; and whether any.
local function forgotten(first, also)
  local names, any = {}, false
  if also and state[also] then
    names[also], any = true, true
  end
  for i = first, #ARGV do
    if state['p:' .. ARGV[i]] then
      names['p:' .. ARGV[i]], any = true, true
    end
  end
  return names, any
end
-- A release-style reply: {status, queue id, granted fencing token, seq, expiry ms, slot[,
-- after]}; `after` (a semaphore's grant to the releasing process's own queue): the permits
-- left free, or -1 if that queue was put back in line.
local function reply(status, grant, after)
  if not grant then
    return {status, '', '', '', 0, ''}
  end
  return {status, grant[1], grant[2], grant[3], grant[4], grant[5], after}
end
"""

RECENT_MERGED = """-- `r` with the tokens gathered in `recent` put first. When `r` holds the most, it is
-- pruned to three quarters of the most (those past their time dropped, then the oldest),
-- so that this runs once per many releases.
local function recent_merged()
  local kept, older = table.concat(recent, ' '), state.r
  if older and #older >= RECENT_MAX * RECENT_ENTRY then
    local now_s, left = now_ms / 1000, {}
    for entry in string.gmatch(older, '%S+') do
      local until_s = tonumber(string.match(entry, '%.(%d+)$'))
      if until_s and until_s >= now_s then
        left[#left + 1] = entry
        if #left >= RECENT_MAX * 3 / 4 - #recent then
          break
        end
      end
    end
    older = table.concat(left, ' ')
  end
  if older and older ~= '' then
    kept = kept .. ' ' .. older
  end
  return kept
end
"""
"""Lua: `r` (the ended tokens) with those gathered in `recent` added, pruned when full;
shared by the read-write lock's leases and the semaphore's permit index (after their
`recent`, `state` and `now_ms`)."""

GATHERED = (
    RECENT_MERGED
    + """-- Remember the token of the lease in field `name`, ended (released, given back) before
-- its expiry `expires` (ms): kept in `r` until then, at most RECENT_CAP ms. A lease that
-- expired is not remembered: it did not end as its holder's.
local function remember(name, expires)
  if expires > now_ms then
    local until_ms = math.min(expires, now_ms + RECENT_CAP)
    recent[#recent + 1] = string.format('%s.%d', string.sub(name, 3, 2 + KEPT),
      math.ceil(until_ms / 1000))
    recent_until = math.max(recent_until, until_ms)
  end
end
-- A new fencing token (written by flush()).
local function issue()
  local fence = next_fence(last_fence)
  last_fence, fence_issued = fence, true
  return fence
end
-- Put queue `wid` in line (see enqueue), and keep the state as long as the queue.
local function line_up(wid, until_ms, count, tail)
  enqueue(wid, until_ms, count, tail)
  queued, requeued = true, true
  queue_until = math.max(queue_until, until_ms + 1000)
end
-- Whether a lease is held under `field` now (it may be there, expired, until it is reaped).
local function holding(field)
  local lease = state[field]
  if not lease then
    return false
  end
  clock()
  return tonumber(string.match(lease, '^%d+ (%d+) ')) > now_ms
end
-- Whether the caller's token must be refused (not held under it now, and aborted by its
-- owner or used already).
local function refused()
  if state['p:' .. ARGV[1]] then
    return false
  end
  return state['a:' .. ARGV[1]] ~= nil or (state.r ~= nil and string.find(state.r, mine, 1, true) ~= nil)
end
-- flush()'s first part: `r` and `ru` gathered if tokens were remembered; the new `r`, or nil.
local function write_recent()
  if #recent == 0 then
    return nil
  end
  local kept = recent_merged()
  writes[#writes + 1] = 'r'
  writes[#writes + 1] = kept
  writes[#writes + 1] = 'ru'
  writes[#writes + 1] = recent_until
  return kept
end
-- flush()'s writes to the state hash, last of what it gathers: `q` if a queue was put in
-- line, then one HDEL of `removed` and one HSET of `writes` (each only if not empty).
local function write_fields()
  if requeued then
    writes[#writes + 1] = 'q'
    writes[#writes + 1] = queue_until
  end
  if #removed > 0 then
    redis.call('HDEL', KEYS[1], unpack(removed))
  end
  if #writes > 0 then
    redis.call('HSET', KEYS[1], unpack(writes))
  end
end
"""
)
"""Lua shared by the read-write lock's leases (`LEASES`) and the semaphore's permit index
(`_lua.permit_index.INDEX`), after their variables (`state`, `mine`, `writes`, `removed`,
`recent`, `recent_until`, `last_fence`, `fence_issued`, `queued`, `requeued`,
`queue_until`) and before their own functions: `recent_merged`, `remember`, `issue`,
`line_up`, `holding`, `refused`, and flush()'s shared parts `write_recent` and
`write_fields`."""

LEASES = (
    """
local live, used, latest = 0, {}, 0
local soonest
local writes, removed, recent = {}, {}, {}
local fence_issued, grew = false, false
-- `q`: when the wait queue's keys expire at the latest (server ms), while it may have
-- entries: the state outlives them, so that a permit freed by expiry still finds the queue.
local queue_until, requeued = tonumber(queued or '') or 0, false
-- `r`: the tokens of leases that ended by a release (or were given back), newest first, as
-- "<KEPT hex digits>.<until, Unix s>", each kept until the lease would have expired (at
-- most RECENT_CAP ms): every copy of its acquire is sent within that acquire's bound,
-- shorter than its first expiry, so a late copy finds it there and is refused, and a
-- release retried after its answer was lost reports success. At most RECENT_MAX are kept
-- (pruned when there are more: those past their time first, then the oldest). A lease that
-- expired is not recorded: it did not end as its holder's. `ru`: the latest until (ms),
-- which the state outlives.
local recent_until = tonumber(state.ru or '') or 0
"""
    + GATHERED
    + """-- Count the live permits (their slots, the soonest and latest expiry); forget those that
-- expired, and those named in `drop` (a set), remembering the tokens of the latter.
local function scan(drop)
  clock()
  drop = drop or {}
  for _, name in ipairs(permits) do
    local slot, expires = string.match(state[name], '^(%d+) (%d+) ')
    expires = tonumber(expires)
    if drop[name] or expires <= now_ms then
      removed[#removed + 1] = name
      remember(name, expires)
      state[name] = nil
    else
      live = live + 1
      used[tonumber(slot)] = true
      if not soonest or expires < soonest then
        soonest = expires
      end
      if expires > latest then
        latest = expires
      end
    end
  end
end
-- Hold a permit for `token` in slot `slot` (default: the lowest free one) for `expires_in`
-- ms; `ttl_ms`, `holder` ("<host> <pid> <task>") and when it was acquired (`acquired`,
-- default now) are recorded. Returns the slot.
local function hold(token, fence, expires_in, ttl_ms, holder, slot, acquired)
  if not slot then
    slot = 0
    while used[slot] do
      slot = slot + 1
    end
  end
  used[slot] = true
  live = live + 1
  grew = true
  local expires = now_ms + expires_in
  if expires > latest then
    latest = expires
  end
  writes[#writes + 1] = 'p:' .. token
  writes[#writes + 1] = string.format('%d %.0f %.0f %.0f %d %s', slot, expires, fence,
    acquired or now_ms, ttl_ms, holder)
  return slot
end
-- Write what was gathered. `retain`: the state's lifetime if no permit is left ('' or nil:
-- unchanged). The key always outlives its permits and its wait queue.
local function flush(retain)
  write_recent()
  if fence_issued then
    writes[#writes + 1] = 'fence'
    writes[#writes + 1] = last_fence
  end
  write_fields()
  local until_ms = math.max(latest, queued and queue_until or 0, recent_until)
  if grew or requeued then
    redis.call('PEXPIRE', KEYS[1], until_ms - now_ms)
  elseif live == 0 and retain and retain ~= '' then
    redis.call('PEXPIRE', KEYS[1], math.max(tonumber(retain), until_ms - now_ms))
  end
end
-- After scan(): the lease already held under the caller's token (a retry after a lost
-- reply, or acquire-or-extend), its expiry reset to `ttl`, keeping its slot, fencing token
-- and acquisition time. Returns its fencing token and slot, or nil.
local function keep_ours(ttl)
  local ours = state['p:' .. ARGV[1]]
  if not ours then
    return nil
  end
  local slot, fence, at, _, holder = string.match(ours, '^(%d+) %d+ (%d+) (%d+) (%d+) (.*)$')
  live = live - 1
  used[tonumber(slot)] = nil
  hold(ARGV[1], tonumber(fence), ttl, ttl, holder, tonumber(slot), tonumber(at))
  return tonumber(fence), tonumber(slot)
end
"""
    + RELEASE_HELPERS
)


def end_lease(drop: str) -> str:
    """The release scripts' end of a lease, after the state's helpers (with FORBID and
    HOLDS; ARGV as RELEASE's): `drop` names the Lua function that forgets the leases in a
    set of field names (`scan` here, `drop_permits` for the permit index). With it,
    `not_held()`: the reply of a release that found no lease under its token."""
    return _END_LEASE.replace("DROP(drop)", f"{drop}(drop)")


_END_LEASE = """
local mode, retain, held = ARGV[2] or '', ARGV[3] or '', ARGV[4] or ''
local own = ARGV[6] or ''
-- Release the lease (a permit) in field `field` (held now) and those in `drop`: forgotten (its token
-- remembered); forbidden too if aborted; else its hold recorded (the typical hold `h`, a
-- moving average over contended releases, 1/8 each; the holds list if asked).
local function end_lease(field, drop)
  local acquired = tonumber(string.match(state[field], '^%d+ %d+ %d+ (%d+) '))
  drop[field] = true
  DROP(drop)
  if mode == 'abort' then
    forbid(ARGV[1], true)
    return
  end
  if queued or own ~= '' then
    local typical, this = tonumber(state.h or ''), now_ms - acquired
    writes[#writes + 1] = 'h'
    writes[#writes + 1] = typical and math.floor((typical * 7 + this) / 8) or this
  end
  if held ~= '' then
    record_hold(held)
  end
end
-- The reply of a release that found no lease under its token: 2 if the token ended
-- already (a retry after a lost reply), else 0 (an abort forbids the token first).
local function not_held()
  if state.r and string.find(state.r, mine, 1, true) then
    return reply(2)
  end
  if mode == 'abort' then
    forbid(ARGV[1], false)
  end
  return reply(0)
end
"""

# Shared by the release scripts, after LEASES (with FORBID and HOLDS): ARGV as RELEASE's.
END_LEASE = end_lease("scan")

# For `aiolock.testing.expire_now`: leases made to expire now, as if their holders had
# stopped renewing them (the next script that reads the state forgets them, remembering
# their tokens; a renewal finds them expired and reports the loss). One round trip; safe
# to apply twice (a lease expired already is left as it is).
EXPIRE_LEASES = Script(
    "expire_leases",
    """
-- KEYS[1] the state hash; KEYS[2] a semaphore's index of permits (`_lua.permit_index`), whose
-- members of the leases expired get the score 10000 (HELD there: the lowest expiry)
-- ARGV[1] the slot (a semaphore's permit) or side (a read-write lock's: 0 read, 1 write)
-- of the leases to expire; '' for every lease
-- Returns the number of leases that were held (not expired yet) and are expired now.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fields = redis.call('HGETALL', KEYS[1])
local expired = 0
for i = 1, #fields, 2 do
  local name = fields[i]
  -- 'p:<token>' (hex) is a lease; 'p:q<queue id>' a permit reserved for a queued process
  if string.sub(name, 1, 2) == 'p:' and string.sub(name, 3, 3) ~= 'q' then
    local slot, expires, rest = string.match(fields[i + 1], '^(%d+) (%d+) (.*)$')
    if slot and (ARGV[1] == '' or slot == ARGV[1]) and tonumber(expires) > now_ms then
      redis.call('HSET', KEYS[1], name, slot .. ' 0 ' .. rest)
      if KEYS[2] then
        redis.call('ZADD', KEYS[2], 'XX', 10000, slot)
      end
      expired = expired + 1
    end
  end
end
return expired
""",
)
