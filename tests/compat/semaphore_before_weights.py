"""The semaphore's scripts as they were before leases of several permits
(`Semaphore.acquire(permits=n)`): `aiolock/_lua/semaphore.py` at a645d7a, unchanged but
for its imports and this docstring (the index's helpers they use, `aiolock._lua.permit_index`,
have only gained new ones since, and read one more field, `w`, which they ignore). `test_semaphore_versions` runs them beside this version's on
one semaphore, as processes of both versions would during a rolling upgrade.

Their own docstring follows.

The Lua scripts of a `Semaphore`: at most `limit` permits held at once.

Same conventions as the lock's (`_lua.lock`): each script one atomic round trip, safe to
apply twice, a late copy refused; the same ARGV order for what the engine sends (token,
ttl, holder, the caller's wait queue, claims) and replies of the same shape. The keys
(`SemaphoreKeys` in `_lua.layout` documents the layout):

KEYS[1] `PREFIX:sem:{NAME}`, the state hash: `limit` (the limit in force), `fence` (the last
fencing token issued), `q` (the wait queue may have entries), `r` and `ru` (the tokens of
leases ended by a release, each kept until the lease would have expired: see `LEASES` in
`_lua.hash_leases`), `h` (the typical hold, ms),
`a:<token>`/`ac` (aborted acquires, as a lock's), one field per permit held,
`p:<token>` = "<slot> <expires at, server ms> <fencing token> <acquired at, ms> <ttl ms>
<host> <pid> <task>", and the index's fields (`s<slot>`, `n`, `c`, `x`: `_lua.permit_index`).
The key lives at least as long as every permit in it.
KEYS[2] `...:queue` and KEYS[3] `...:waiters`: the wait queue, as a lock's.
KEYS[4] `...:holds`: recent holds, with `hold_stats=True` (release only).
KEYS[5] `...:permits`: the permits' index, a sorted set of slots by expiry (`_lua.permit_index`).

No script reads every permit: the index gives the lowest free slot and the soonest
expiry. A permit that expired counts until the semaphore is full; then the next script
reaps it. The permits that are free go to the processes queued first (granted to their
queue entries' tokens, as a lock's release grants, and announced on `...:released`),
before any other acquirer.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiolock._lua.lock import COMMON, CONSTANTS, FORBID, HOLDS, Script
from aiolock._lua.permit_index import END_PERMIT, INDEX

__all__ = ("SEM_ACQUIRE", "SEM_RELEASE", "SEM_SET_LIMIT", "sem_acquire_args")

_SERVE = """
-- Give a free permit to queue `wid`, whose entry ends with `tail`: held under the entry's
-- token for the entry's ttl if `full`, else for at most RESERVATION ms. An entry without a
-- token (its process was served and has not refreshed it yet) gets a reservation instead:
-- a permit held for RESERVATION ms under "q<queue id>", which that queue's next acquire
-- claims. Returns {queue id, granted fencing token ('' for a reservation), seq, expiry ms,
-- slot, fencing token}.
local function give(wid, tail, full)
  local host, pid, seq, g_ms, g_ttl, token, task = string.match(tail,
    '^(%S+) (%S+) (%d+) (%d+) (%d+) (%x+) (.*)$')
  local fence = issue()
  local fenced = string.format('%.0f', fence)
  if not token then
    local slot = hold('q' .. wid, fence, RESERVATION, RESERVATION, tail .. ' (reserved)')
    return {wid, '', '', RESERVATION, slot, fenced}
  end
  local expiry = tonumber(g_ttl)
  if not full then
    expiry = math.min(tonumber(g_ms), RESERVATION)
  end
  local slot = hold(token, fence, expiry, tonumber(g_ttl), host .. ' ' .. pid .. ' ' .. task)
  return {wid, fenced, seq, expiry, slot, fenced}
end
-- Give the free permits to the queued processes, first come first served, stopping at
-- queue `stop` (the caller's own, which takes one itself). A process served goes to the
-- back of the queue at once, with an entry without a token until its next acquire
-- refreshes it (or its withdrawal takes it out, when it has no other waiter). Met again in
-- the same call, it gets a reservation if it has other waiters and none yet (one
-- reservation field per queue), else it keeps its place and the next one is served. Each grant is
-- announced (SPUBLISH on a cluster of Redis 7+ or Valkey: the variant of `_lua.cluster`) as "g<fencing token> <queue id> <granted fencing token> <seq> <slot>", a
-- reservation as "g<fencing token> <queue id>" (the "g" keeps it apart from a local
-- release of the lease under that token, told by the fencing token alone),
-- except to queue `quiet` (the caller's own, told by the reply). Returns the first grant
-- and the grant to `quiet`, if any.
local looked = {}
-- Whether a permit is reserved for queue `wid` now (its field read once per call).
local function reserved(wid)
  local name = 'p:q' .. wid
  if state[name] == nil and not looked[name] then
    looked[name] = true
    state[name] = redis.call('HGET', KEYS[1], name) or nil
  end
  return holding(name)
end
local function serve(stop, quiet)
  local first, own_grant
  if not queued then
    return first, own_grant
  end
  -- `left`: the waiters of each process served in this call that are still to be served;
  -- `reserving`: the queues given a reservation in this call.
  local index, left, reserving = 0, {}, {}
  while live < limit do
    local head = redis.call('ZRANGE', KEYS[2], index, index)[1]
    if not head then
      if index == 0 then
        redis.call('HDEL', KEYS[1], 'q')
        queued, requeued, queue_until = false, false, 0
      end
      break
    end
    if head == stop then
      break
    end
    local entry = redis.call('HGET', KEYS[3], head) or '0'
    local until_ms, count, tail = string.match(entry, '^(%d+) (%d+) (.*)$')
    local tokenless = tail and not string.match(tail, '^%S+ %S+ %d+ %d+ %d+ %x+ ')
    if until_ms and tonumber(until_ms) >= now_ms
        and (left[head] == 0 or (tokenless and (reserving[head] or reserved(head)))) then
      index = index + 1  -- nothing more for it now: it keeps its place
    elseif not (until_ms and tonumber(until_ms) >= now_ms) then
      dequeue(head)
    else
      dequeue(head)
      left[head] = left[head] and 0 or tonumber(count) - 1
      local grant = give(head, tail, false)
      if grant[2] == '' then
        reserving[head] = true  -- one reservation per queue
      end
      first = first or grant
      -- To the back of the queue: if its process has no other waiter, it withdraws.
      line_up(head, tonumber(until_ms), math.max(tonumber(count) - 1, 1),
        string.match(tail, '^%S+ %S+'))
      if head == quiet then
        own_grant = grant
      else
        local message = 'g' .. grant[6] .. ' ' .. head
        if grant[2] ~= '' then
          message = message .. ' ' .. grant[2] .. ' ' .. grant[3] .. ' ' .. grant[5]
        end
        redis.call('PUBLISH', KEYS[1] .. ':released', message)
      end
    end
  end
  return first, own_grant
end
"""

SEM_ACQUIRE = Script(
    "semaphore-acquire",
    """
-- KEYS[1] state, KEYS[2] waiter queue, KEYS[3] waiter entries, KEYS[4] recent holds (not
-- used here), KEYS[5] the permits' index (see `_lua.semaphore`)
-- ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] the holder, "<host> <pid> <task>", ARGV[4] the
-- caller's limit (stored if no limit is in force); only when the caller queues: ARGV[5]
-- its wait queue's id, ARGV[6] waiters of that process queued behind the caller, ARGV[7]
-- the rest of the queue entry (as ARGV[6] of ACQUIRE), ARGV[8..] tokens a permit may have
-- been granted to under that queue (one is claimed, keeping its slot and fencing token)
-- Returns {1, fencing token, slot, permits still free}: a permit (also when a retry finds
--           it already ours: its expiry is reset to the ttl);
--         {0, ms until the soonest permit expires, '', '', '', '', typical hold ms}: no
--           permit is free, or the processes queued first take the free ones; the caller's
--           queue entry is added (at the back) or refreshed;
--         {-1, 0}: this token was aborted by its owner, or already used.
"""
    + CONSTANTS
    + COMMON
    + INDEX
    + _SERVE
    + """
local wid = ARGV[5] or ''
local claims, extra = {}, {'a:' .. ARGV[1], 'p:' .. ARGV[1]}
if wid ~= '' then
  claims[1] = 'p:q' .. wid
  for i = 8, #ARGV do
    claims[#claims + 1] = 'p:' .. ARGV[i]
  end
  for _, name in ipairs(claims) do
    extra[#extra + 1] = name
  end
end
begin(extra)
if not limit then
  limit = tonumber(ARGV[4])
  writes[#writes + 1] = 'limit'
  writes[#writes + 1] = limit
end
local ttl = tonumber(ARGV[2])
if refused() then
  return {-1, 0}
end
local behind = tonumber(ARGV[6] or '0')
local kept, kept_slot = keep_ours(ttl)
if kept then
  flush()
  return {1, kept, kept_slot, math.max(limit - live, 0)}
end
local function taken(fence, slot)
  if wid ~= '' then
    dequeue(wid)
    if behind > 0 then
      -- More waiters in the caller's process: back of the queue, for a later permit.
      line_up(wid, now_ms + ttl + GRACE, behind, ARGV[7])
    end
  end
  -- Permits still free go to the next in line (the caller's own queue too, at the back).
  serve()
  flush()
  return {1, fence, slot, math.max(limit - live, 0)}
end
-- A permit reserved for the caller's queue, or granted to one of its registrations: taken
-- under the caller's token, keeping its slot and fencing token.
for _, name in ipairs(claims) do
  if holding(name) then
    local slot, fence = string.match(state[name], '^(%d+) %d+ (%d+) ')
    removed[#removed + 1] = name
    state[name] = nil
    live = live - 1
    hold(ARGV[1], tonumber(fence), ttl, ttl, ARGV[3], tonumber(slot))
    return taken(tonumber(fence), tonumber(slot))
  end
end
-- Full: the permits that expired are reaped. The processes queued before the caller get
-- the free permits first.
settle()
serve(wid ~= '' and wid or nil)
if live < limit then
  local fence = issue()
  return taken(fence, hold(ARGV[1], fence, ttl, ttl, ARGV[3]))
end
local soonest = soonest_expiry()
local wait = soonest and soonest - now_ms or -1
if wid ~= '' then
  line_up(wid, now_ms + math.max(wait, 0) + GRACE, behind + 1, ARGV[7])
end
flush()
return {0, wait, '', '', '', '', state.h or ''}
""",
)

SEM_RELEASE = Script(
    "semaphore-release",
    """
-- KEYS[1] state, KEYS[2] waiter queue, KEYS[3] waiter entries, KEYS[4] recent holds (list),
-- KEYS[5] the permits' index
-- ARGV as RELEASE's: ARGV[1] token ('' when only withdrawing a queue), ARGV[2] mode ('' or
-- 'abort'), ARGV[3] retention (ms) of the state once no permit is held ('': unchanged),
-- ARGV[4] the hold (ms) to record ('' for none), ARGV[5] a queue to withdraw, ARGV[6] the
-- releasing process's own queue, ARGV[7] its entry, ARGV[8] its waiter count, ARGV[9..]
-- tokens a permit may have been granted to under the queue withdrawn or joining (its
-- process forgets them: such permits are released too, and handed on). A waiter count of
-- 0 is a hand-over, not a join: the releasing process has waiters and another command of
-- it is putting its queue in line; the permit goes straight to the token in ARGV[7] if no
-- other process is ahead (and that token was not aborted), leaving the queue as it is.
-- Returns {status, queue id, granted fencing token, seq, grant expiry ms, slot[, free]}:
-- status as RELEASE's (1 released now, 2 already, 3 a queue withdrawn, 0 not the holder);
-- the grant is the one to the releasing process's own queue if there is one, else the
-- first made; `free`, after a grant straight to the releasing process's own queue (taken
-- out of the queue, not put back in line), is the permits still free.
-- Every free permit goes to the next queued process (each grant announced but one to the
-- releasing process's own queue).
"""
    + CONSTANTS
    + COMMON
    + FORBID
    + HOLDS
    + INDEX
    + END_PERMIT
    + _SERVE
    + """
local field = 'p:' .. ARGV[1]
-- A withdrawn queue gives back the permits granted under its registrations, and the one
-- reserved for it.
local withdraw = ARGV[5] or ''
local reserved = withdraw ~= '' and 'p:q' .. withdraw or nil
local joining = tonumber(ARGV[8] or '0') > 0
-- A hand-over's token, as an aborted acquire's field (a late copy must not grant to it).
local handed = nil
if own ~= '' and not joining then
  handed = 'a:' .. string.match(ARGV[7], '^%S+ %S+ %d+ %d+ %d+ (%x+) ')
end
local extra = {field}
if handed then
  extra[#extra + 1] = handed
end
if reserved then
  extra[#extra + 1] = reserved
end
for i = 9, #ARGV do
  extra[#extra + 1] = 'p:' .. ARGV[i]
end
begin(extra)
limit = limit or 1
if ARGV[1] ~= '' and holding(field) then
  end_lease(field, (forgotten(9, reserved)))
  if own ~= '' then
    local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if (not head or head == own) and live < limit and not (handed and state[handed]) then
      -- Nobody is ahead of the releasing process's own waiters: straight to them (a
      -- hand-over leaves the queue entry to the command putting it in line).
      if head and joining then
        dequeue(head)
      end
      local grant = give(own, ARGV[7], true)
      flush(retain)
      return reply(1, grant, math.max(limit - live, 0))
    end
    if joining then
      line_up(own, now_ms + RESERVATION + GRACE, tonumber(ARGV[8]), ARGV[7])
    end
  end
  local first, own_grant = serve(nil, joining and own or nil)
  flush(retain)
  return reply(1, own_grant or first)
end
if withdraw ~= '' then
  dequeue(withdraw)
  local drop, granted = forgotten(9, reserved)
  if granted then
    drop_permits(drop)
    local first = serve()
    flush()
    return reply(3, first)
  end
  return reply(3)
end
return not_held()
""",
)

SEM_SET_LIMIT = Script(
    "semaphore-set-limit",
    """
-- KEYS[1] state, KEYS[2] waiter queue, KEYS[3] waiter entries, KEYS[4] recent holds (not
-- used), KEYS[5] the permits' index
-- ARGV[1] '' (no token), ARGV[2] the new limit, ARGV[3] how long (ms) the state lives if
-- no permit is held
-- Returns {previous limit or '', permits held, first grant's queue id, ...}: permits freed
-- by a raised limit go to the queued processes at once (announced).
"""
    + CONSTANTS
    + COMMON
    + INDEX
    + _SERVE
    + """
begin({})
local previous = state.limit or ''
limit = tonumber(ARGV[2])
writes[#writes + 1] = 'limit'
writes[#writes + 1] = limit
settle()
serve()
flush(ARGV[3])
return {previous, live}
""",
)


def sem_acquire_args(
    token: str,
    ttl_ms: int,
    holder: str,
    limit: int,
    *,
    queue: tuple[str, int, str] | None = None,
    claims: Sequence[str] = (),
) -> list[str | int]:
    """ARGV for SEM_ACQUIRE (see its header)."""
    args: list[str | int] = [token, ttl_ms, holder, limit]
    if queue is not None:
        args += (*queue, *claims)
    return args
