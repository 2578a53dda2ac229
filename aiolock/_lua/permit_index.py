"""Lua of a `Semaphore`'s scripts: its permits kept in the state hash and indexed by
expiry in a sorted set, so that no script reads every permit (in the conventions of
`_lua.lock`; the scripts themselves are in `_lua.semaphore`).

KEYS[1] `PREFIX:sem:{NAME}`, the state hash: the semaphore's fields (`limit`, `fence`, `q`,
`r`, `ru`, `h`, `a:<token>`/`ac`), one field per permit held, `p:<token>` = "<slot>
<expires at, server ms> <fencing token> <acquired at, ms> <ttl ms> <host> <pid> <task>"
(what every version reads and renews), and the index's own fields:

- `s<slot>`: the token (or `q<queue id>`) whose field holds that slot;
- `n`: the slots used so far, 0 to n - 1 (each a member of the index);
- `c`: the permits held (a permit that expired counts until it is reaped);
- `l`: a free slot (the lowest of those the last script to free any freed), which the next
  acquire takes without looking in the index; cleared by whichever script takes it;
- `x`: the `fence` the index was last written with, and `xr` the first entry of `r` (the
  newest released token). An older version's script that issues a fencing token writes
  `fence` alone, and one that releases a permit prepends its token to `r`, so `x` ~=
  `fence` or `xr` ~= the first entry of `r` tells a script that permits may have been
  added or removed without the index: it rebuilds the index from the fields first;

KEYS[5] `PREFIX:sem:{NAME}:permits`, the index (sorted set): one member per slot below `n`,
its score the slot number while it is free (below HELD), else the expiry of the permit in
it, or an earlier time: RENEW (kind "ps") writes the expiry into both, but RESUME and an
older version's renewal write only the field, which decides. It expires with the state.

So a script finds the lowest free slot, the permits that expired and the soonest expiry
with one ZRANGEBYSCORE each, O(log n); nothing reads every permit but the rebuild (a new
state, or one an older version wrote to meanwhile, or an index found inconsistent) and
the abort bookkeeping (`FORBID`, once per 32 aborts). A permit that expired is reaped when
the semaphore is full (it counts until then, so it only delays its slot's reuse): its
field is read first, and one that was renewed meanwhile is rescored instead. An index that
disagrees with the fields (a member's field missing: an older version released, reaped or
claimed it; a free slot missing) is rebuilt from the fields after what the script has done
so far is written.

Writes are gathered and made by `flush()`: HDEL, HSET, ZADD, and PTTL; when a permit would
outlive the keys, PEXPIRE of both, by twice its ttl (the acquires of the next ttl then need
not extend them).
"""

from __future__ import annotations

from .hash_leases import (
    GATHERED,
    RECENT_CAP_MS,
    RECENT_ENTRY,
    RECENT_MAX,
    RELEASE_HELPERS,
    end_lease,
)

__all__ = ("END_PERMIT", "HELD", "INDEX")

HELD = 10_000
"""Scores of the index at and above this are expiries (ms); below, free slots (a limit is
at most 10,000, so slots are 0 to 9,999)."""

INDEX = (
    f"local RECENT_MAX, RECENT_ENTRY, RECENT_CAP = {RECENT_MAX}, {RECENT_ENTRY}, {RECENT_CAP_MS}\n"
    f"local HELD = {HELD}\n"
    + """
local PERMITS = KEYS[5]
local state = {}
local mine = string.sub(ARGV[1], 1, KEPT)
local last_fence, queued, limit
local live, top, latest = 0, 0, 0
local writes, removed, recent, zset = {}, {}, {}, {}
local freed, picked, picked_n = {}, {}, 0
local hint, hint_changed, stretch = nil, false, 0
local fence_issued, grew, counted, indexed = false, false, false, false
local queue_until, requeued, recent_until = 0, false, 0
-- ZADD `pairs` (score, member, ...) in chunks (unpack takes a few thousand values at most).
local function zadd_all(args)
  for i = 1, #args, 1000 do
    redis.call('ZADD', PERMITS, unpack(args, i, math.min(i + 999, #args)))
  end
end
-- Read the state's own fields and `extra` (field names) into `state`; the clock.
local function read(extra)
  local names = {'limit', 'fence', 'q', 'r', 'ru', 'h', 'n', 'c', 'x', 'xr', 'l', 'w'}
  for _, name in ipairs(extra) do
    names[#names + 1] = name
  end
  local values = redis.call('HMGET', KEYS[1], unpack(names))
  for i, name in ipairs(names) do
    state[name] = values[i] or nil
  end
  last_fence, queued = state.fence, state.q
  queue_until = tonumber(queued or '') or 0
  recent_until = tonumber(state.ru or '') or 0
  live, top = tonumber(state.c or '') or 0, tonumber(state.n or '') or 0
  hint = tonumber(state.l or '')
  clock()
end
-- Rebuild the index from the permits' fields (one HGETALL): their count, slots and expiries;
-- expired permits are forgotten. Run on what is in Redis: after flush() if anything was
-- gathered.
local function rebuild()
  local fields = redis.call('HGETALL', KEYS[1])
  redis.call('DEL', PERMITS)
  live, top = 0, 0
  hint, hint_changed = nil, true
  if #fields == 0 then
    return  -- a new state: its first write makes the index
  end
  local used, args = {}, {}
  for i = 1, #fields, 2 do
    local name, value = fields[i], fields[i + 1]
    if string.sub(name, 1, 2) == 'p:' then
      state[name] = value
      local slot, expires = string.match(value, '^(%d+) (%d+) ')
      slot, expires = tonumber(slot), tonumber(expires)
      if expires <= now_ms or used[slot] then
        removed[#removed + 1] = name
        state[name] = nil
      else
        used[slot] = true
        live = live + 1
        top = math.max(top, slot + 1)
        latest = math.max(latest, expires)
        args[#args + 1] = expires
        args[#args + 1] = slot
        writes[#writes + 1] = 's' .. slot
        writes[#writes + 1] = string.sub(name, 3)
      end
    elseif string.match(name, '^s%d+$') then
      removed[#removed + 1] = name
    end
  end
  for slot = 0, top - 1 do
    if not used[slot] then
      args[#args + 1] = slot
      args[#args + 1] = slot
    end
  end
  zadd_all(args)
  counted, indexed = true, true
end
"""
    + GATHERED
    + """-- Write what was gathered (and start gathering anew). `retain`: the state's lifetime if
-- no permit is left ('' or nil: unchanged). Both keys outlive every permit, the wait
-- queue and the recorded tokens.
local function flush(retain)
  state.r = write_recent() or state.r
  if #recent > 0 or indexed then
    writes[#writes + 1] = 'xr'
    writes[#writes + 1] = string.match(state.r or '', '^%S+') or ''
  end
  if fence_issued or indexed then
    writes[#writes + 1] = 'fence'
    writes[#writes + 1] = last_fence or 0
    writes[#writes + 1] = 'x'
    writes[#writes + 1] = last_fence or 0
    state.fence, state.x = last_fence or 0, last_fence or 0
  end
  -- `l`: a free slot, the lowest of those freed here, for the next acquire to take without
  -- looking (cleared when any script takes it).
  for slot in pairs(freed) do
    if not hint or slot < hint then
      hint, hint_changed = slot, true
    end
  end
  if hint_changed then
    writes[#writes + 1] = 'l'
    writes[#writes + 1] = hint or ''
  end
  if counted then
    writes[#writes + 1] = 'c'
    writes[#writes + 1] = live
    writes[#writes + 1] = 'n'
    writes[#writes + 1] = top
  end
  write_fields()
  -- Slots freed (or rescored) only change existing members; held ones may add a member (a
  -- slot used for the first time, or an index that expired before the state).
  local changed, added = {}, {}
  for slot, score in pairs(zset) do
    local into = score < HELD and changed or added
    into[#into + 1] = score
    into[#into + 1] = slot
  end
  if #changed > 0 then
    redis.call('ZADD', PERMITS, 'XX', unpack(changed))
  end
  local created = #added > 0 and redis.call('ZADD', PERMITS, unpack(added)) > 0
  local until_ms = math.max(latest, queued and queue_until or 0, recent_until)
  if grew or requeued or indexed then
    local pttl = redis.call('PTTL', KEYS[1])
    if pttl <= until_ms - now_ms then
      -- Longer by the new permit's ttl: the next acquires need not extend them again.
      redis.call('PEXPIRE', KEYS[1], until_ms - now_ms + stretch)
      redis.call('PEXPIRE', PERMITS, until_ms - now_ms + stretch)
    elseif (created or indexed) and pttl > 0 then
      redis.call('PEXPIRE', PERMITS, pttl)
    end
  elseif live == 0 and retain and retain ~= '' then
    local keep = math.max(tonumber(retain), until_ms - now_ms)
    redis.call('PEXPIRE', KEYS[1], keep)
    redis.call('PEXPIRE', PERMITS, keep)
  end
  writes, removed, recent, zset, freed, picked, picked_n = {}, {}, {}, {}, {}, {}, 0
  fence_issued, grew, counted, indexed, requeued = false, false, false, false, false
  hint_changed, stretch = false, 0
end
-- The permits that expired, reaped: forgotten, their slots free (a permit renewed meanwhile
-- is rescored instead). False if the index disagrees with the fields (rebuilt then).
local function reap()
  -- A slot this call already changed (its write pending in `zset`: a permit found expired
  -- and forgotten by keep_ours, or held again) is as this call left it, not as Redis has it.
  local slots = {}
  for _, slot in ipairs(redis.call('ZRANGEBYSCORE', PERMITS, HELD, now_ms)) do
    if zset[slot] == nil then
      slots[#slots + 1] = slot
    end
  end
  if #slots == 0 then
    return true
  end
  local names = {}
  for i, slot in ipairs(slots) do
    names[i] = 's' .. slot
  end
  local holders = redis.call('HMGET', KEYS[1], unpack(names))
  local fields = {}
  for i = 1, #slots do
    if not holders[i] then
      flush()
      rebuild()
      return false
    end
    fields[i] = 'p:' .. holders[i]
  end
  local leases = redis.call('HMGET', KEYS[1], unpack(fields))
  for i, slot in ipairs(slots) do
    local held_in, expires = string.match(leases[i] or '', '^(%d+) (%d+) ')
    if held_in ~= slot then
      flush()
      rebuild()
      return false
    end
    if tonumber(expires) > now_ms then
      zset[slot] = tonumber(expires)
      latest = math.max(latest, tonumber(expires))
    else
      removed[#removed + 1] = fields[i]
      removed[#removed + 1] = names[i]
      state[fields[i]] = nil
      zset[slot] = tonumber(slot)
      freed[tonumber(slot)] = true
      live = live - 1
      counted = true
    end
  end
  return true
end
-- Read the state (the fields named in `extra` too), check the index (rebuilt if missing or
-- written to by an older version), and reap the expired permits if the semaphore is full.
local function begin(extra)
  read(extra)
  if not state.n or state.x ~= state.fence
      or (string.match(state.r or '', '^%S+') or '') ~= (state.xr or '') then
    rebuild()
    if indexed then
      flush()
    end
  end
  limit = tonumber(state.limit or '')
  return limit
end
-- After begin(), once `limit` is known: if the semaphore is full, reap the permits that
-- expired, and check the index (a member per slot below `n`, a permit not expired among
-- them): rebuilt if it disagrees.
local function settle()
  if live < limit or not reap() or live < limit then
    return
  end
  local soonest = redis.call('ZRANGEBYSCORE', PERMITS, string.format('(%d', now_ms), '+inf', 'LIMIT', 0, 1)
  if not soonest[1] or redis.call('ZCARD', PERMITS) ~= top then
    flush()
    rebuild()
  end
end
-- The soonest expiry of a permit held (a lower bound), or nil.
local function soonest_expiry()
  local soonest = redis.call('ZRANGEBYSCORE', PERMITS, string.format('(%d', now_ms), '+inf', 'WITHSCORES',
    'LIMIT', 0, 1)
  return tonumber(soonest[2] or '')
end
-- A free slot below `limit`, taken: the lowest of those freed in this call (the releaser's
-- slot, handed on), else the lowest free member, else the next never used; nil if none.
local function free_slot()
  local best
  for slot in pairs(freed) do
    if slot < limit and (not best or slot < best) then
      best = slot
    end
  end
  if not best and hint and hint < limit and not picked[hint] then
    best = hint
  end
  if not best and top > 0 then
    local found = redis.call('ZRANGEBYSCORE', PERMITS, '-inf', limit - 1, 'LIMIT', 0,
      picked_n + 1)
    for _, member in ipairs(found) do
      if not picked[tonumber(member)] then
        best = tonumber(member)
        break
      end
    end
  end
  if not best and top < limit then
    best = top
    top = top + 1
  end
  if best then
    freed[best] = nil
    picked[best], picked_n = true, picked_n + 1
    if best == hint then
      hint, hint_changed = nil, true
    end
  end
  return best
end
-- Hold a permit for `token` in slot `slot` (default: the lowest free one) for `expires_in`
-- ms; `ttl_ms`, `holder` ("<host> <pid> <task>") and when it was acquired (`acquired`,
-- default now) are recorded. Returns the slot.
local function hold(token, fence, expires_in, ttl_ms, holder, slot, acquired)
  if not slot then
    slot = free_slot()
    if not slot then
      flush()
      rebuild()
      slot = free_slot()
      if not slot then
        return error('aiolock: no free slot below the limit')
      end
    end
  end
  live = live + 1
  grew, counted = true, true
  local expires = now_ms + expires_in
  latest = math.max(latest, expires)
  stretch = math.max(stretch, expires_in)
  local field = 'p:' .. token
  state[field] = string.format('%d %.0f %.0f %.0f %d %s', slot, expires, fence,
    acquired or now_ms, ttl_ms, holder)
  writes[#writes + 1] = field
  writes[#writes + 1] = state[field]
  writes[#writes + 1] = 's' .. slot
  writes[#writes + 1] = token
  zset[tostring(slot)] = expires
  return slot
end
-- Forget the permits in the fields named in `drop` (a set; each read into `state`), their
-- slots free; the tokens of those not expired are remembered (`r`).
local function drop_permits(drop)
  for name in pairs(drop) do
    local lease = state[name]
    if lease then
      local slot, expires = string.match(lease, '^(%d+) (%d+) ')
      remember(name, tonumber(expires))
      removed[#removed + 1] = name
      removed[#removed + 1] = 's' .. slot
      state[name] = nil
      zset[slot] = tonumber(slot)
      freed[tonumber(slot)] = true
      live = live - 1
      counted = true
    end
  end
end
-- The permit already held under the caller's token (a retry after a lost reply, or
-- acquire-or-extend), its expiry reset to `ttl`, keeping its slot, fencing token and
-- acquisition time. Returns its fencing token and slot, or nil.
local function keep_ours(ttl)
  local ours = state['p:' .. ARGV[1]]
  if not ours then
    return nil
  end
  local slot, expires, fence, at, _, holder = string.match(ours,
    '^(%d+) (%d+) (%d+) (%d+) (%d+) (.*)$')
  if tonumber(expires) <= now_ms then
    -- It expired: forgotten (not remembered: it did not end as its holder's).
    removed[#removed + 1] = 'p:' .. ARGV[1]
    removed[#removed + 1] = 's' .. slot
    state['p:' .. ARGV[1]] = nil
    zset[slot] = tonumber(slot)
    freed[tonumber(slot)] = true
    live = live - 1
    counted = true
    return nil
  end
  live = live - 1
  hold(ARGV[1], tonumber(fence), ttl, ttl, holder, tonumber(slot), tonumber(at))
  return tonumber(fence), tonumber(slot)
end
-- A lease of n permits is its first permit, `p:<token>`, and n - 1 more, `p:<token>~2` to
-- `p:<token>~n`, each a permit with a slot of its own (what every version counts).
-- The fields of the extra permits of the lease under `token` (the first read in `state`
-- by begin()), as a set; nil if it holds one permit.
local function extras(token)
  local name = 'p:' .. token .. '~2'
  if not state[name] then
    return nil
  end
  local found, k = {[name] = true}, 3
  while true do
    name = 'p:' .. token .. '~' .. k
    local lease = redis.call('HGET', KEYS[1], name)
    if not lease then
      return found
    end
    state[name], found[name], k = lease, true, k + 1
  end
end
-- The permits parked for the waiting request for several permits under `token` (fields
-- `p:<token>~w1`, `~w2`...: see SEM_ACQUIRE_SEVERAL), read into `state`: a set, and how
-- many.
local function parked_of(token)
  local found, k = {}, 1
  while true do
    local name = 'p:' .. token .. '~w' .. k
    local lease = state[name] or redis.call('HGET', KEYS[1], name)
    if not lease then
      return found, k - 1
    end
    state[name], found[name], k = lease, true, k + 1
  end
end
-- The wait queue id of the request for several permits under `token` while it waits.
local function waiting_queue(token)
  return 'w' .. string.sub(token, 1, 15)
end
-- Forget the extra permits in the fields named in `drop` (their tokens not remembered:
-- the first permit's is), their slots free.
local function drop_extras(drop)
  for name in pairs(drop) do
    local slot = string.match(state[name] or '', '^(%d+) ')
    if slot then
      removed[#removed + 1] = name
      removed[#removed + 1] = 's' .. slot
      state[name] = nil
      zset[slot] = tonumber(slot)
      freed[tonumber(slot)] = true
      live = live - 1
      counted = true
    end
  end
end
-- The oldest request for several permits that was refused (`w`, "<token> <permits> <until,
-- ms> <since, µs>") while it stands: its token, permits and since; else nil. No permit
-- goes to a request that came after it (a queue entry that joined later, an acquire that
-- does not queue) until it has its permits or its time lapsed.
local function barrier()
  local token, n, until_ms, since = string.match(state.w or '', '^(%S+) (%d+) (%d+) (%d+)$')
  if not token then
    return nil
  end
  clock()
  if tonumber(until_ms) <= now_ms then
    return nil
  end
  return token, tonumber(n), tonumber(since), tonumber(until_ms)
end
-- Whether a barrier (see barrier()) keeps the caller, of queue `wid` ('' if none), from a
-- free permit: it is not the barrier's owner and its queue entry is not older.
local function barred(wid)
  local token, _, since = barrier()
  if not token or token == ARGV[1] then
    return false
  end
  if wid ~= '' then
    -- (the entries queued before it: one per process, a few; ZSCORE would need one more
    -- command granted by the ACL line)
    local older = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', string.format('(%.0f', since))
    for _, each in ipairs(older) do
      if each == wid then
        return false
      end
    end
  end
  return true
end
"""
    + RELEASE_HELPERS
)

# The release scripts' end of a permit, after INDEX (with FORBID and HOLDS): ARGV as
# RELEASE's.
END_PERMIT = end_lease("drop_permits")
