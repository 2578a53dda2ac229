"""The Lua scripts of a `ReadWriteLock`: many readers or one writer, writers first.

Same conventions as the other primitives' (`_lua.lock`, `_lua.hash_leases`). Each side (read,
write) has its own acquire and release script, made from one text with `SIDE` set, and
lists its own wait queue first. KEYS, for a read-write lock named NAME under PREFIX:

1. `PREFIX:rw:{NAME}`: the state hash (`_lua.hash_leases`); a reader's lease is a field
   `p:<token>` with side 0, the writer's with side 1;
2. and 3. the caller's side's wait queue: `...:queue` and `...:waiters` for writers,
   `...:rqueue` and `...:rwaiters` for readers (entries as a lock's);
4. `...:holds`: recent holds, with `hold_stats=True` (release only);
5. and 6. the other side's wait queue.

Grants to writers' queues are announced on `...:released`, to readers' on `...:rreleased`,
as "g<fencing token> <queue id> <fencing token> <seq>".

The policy, writers first: a writer gets in when nobody holds and no writer queued before
it; a reader when no writer holds and no writer waits. So a waiting writer stops new
readers, and gets in as soon as the readers inside have left. A queued writer's entry
lives WRITER_MARK_MS from its last refresh (its process's first waiting writer tries again
every third of that while it waits), so a writer whose process died stops blocking readers
within WRITER_MARK_MS. When the writer leaves, the next queued writer is served first if
there is one, else every queued reader at once.
"""

from __future__ import annotations

from typing import Final

from .hash_leases import END_LEASE, LEASES, STATE
from .lock import COMMON, CONSTANTS, FORBID, HOLDS, Script

__all__ = ("RW_ACQUIRE", "RW_RELEASE", "WRITER_MARK_MS")

WRITER_MARK_MS: Final = 1000
"""How long a waiting writer's queue entry lives unless its process refreshes it."""

# The queues by side, and serving them. The scripts set `limit` to nil.
_POLICY = (
    f"local WRITER_MARK = {WRITER_MARK_MS}\n"
    + """
local WQ, WH, RQ, RH = KEYS[2], KEYS[3], KEYS[5], KEYS[6]
if SIDE == 0 then
  WQ, WH, RQ, RH = KEYS[5], KEYS[6], KEYS[2], KEYS[3]
end
-- The first queued writer whose entry has not lapsed (lapsed ones are dropped): its queue
-- id and entry, or nil.
local function first_writer()
  while true do
    local head = redis.call('ZRANGE', WQ, 0, 0)[1]
    if not head then
      return nil
    end
    local entry = redis.call('HGET', WH, head)
    local until_ms = entry and tonumber(string.match(entry, '^(%d+) '))
    if until_ms and until_ms >= now_ms then
      return head, entry
    end
    redis.call('ZREM', WQ, head)
    redis.call('HDEL', WH, head)
  end
end
-- Grant a lease of side `side` to queue `wid` (taken out of queue `zkey`/`hkey`), held under
-- its entry's token for at most RESERVATION ms, announced unless `wid` is `quiet`
-- (SPUBLISH on a cluster of Redis 7+ or Valkey: the variant of `_lua.cluster`). Returns
-- {queue id, granted fencing token, seq, expiry ms, ''}, or nil for an entry without token.
local function grant(wid, entry, side, zkey, hkey, quiet)
  redis.call('ZREM', zkey, wid)
  redis.call('HDEL', hkey, wid)
  local host, pid, seq, g_ms, g_ttl, token, task = string.match(entry,
    '^%d+ %d+ (%S+) (%S+) (%d+) (%d+) (%d+) (%x+) (.*)$')
  if not token then
    return nil
  end
  local fence = issue()
  local expiry = math.min(tonumber(g_ms), RESERVATION)
  hold(token, fence, expiry, tonumber(g_ttl), host .. ' ' .. pid .. ' ' .. task, side)
  local given = {wid, string.format('%.0f', fence), seq, expiry, ''}
  if wid ~= quiet then
    local channel = KEYS[1] .. (side == 1 and ':released' or ':rreleased')
    redis.call('PUBLISH', channel, 'g' .. given[2] .. ' ' .. wid .. ' ' .. given[2] .. ' ' .. seq)
  end
  return given
end
-- Serve the queues, leaving out queue `stop` (the caller's own, which decides for itself):
-- the first writer if nobody holds; if no writer holds or waits, every queued reader.
-- Returns the first grant and the grant to `quiet` (not announced), if any.
local function serve(stop, quiet)
  local first, own
  if not queued or used[1] then
    return first, own
  end
  local head, entry = first_writer()
  if head then
    if head ~= stop and live == 0 then
      first = grant(head, entry, 1, WQ, WH, quiet)
      if head == quiet then
        own = first
      end
    end
    return first, own
  end
  local readers = redis.call('ZRANGE', RQ, 0, -1)
  if #readers == 0 then
    redis.call('HDEL', KEYS[1], 'q')
    queued, requeued, queue_until = false, false, 0
  end
  for _, wid in ipairs(readers) do
    if wid ~= stop then
      local waiting = redis.call('HGET', RH, wid)
      local until_ms = waiting and tonumber(string.match(waiting, '^(%d+) '))
      if until_ms and until_ms >= now_ms then
        local given = grant(wid, waiting, 0, RQ, RH, quiet)
        first = first or given
        if wid == quiet then
          own = given
        end
      else
        redis.call('ZREM', RQ, wid)
        redis.call('HDEL', RH, wid)
      end
    end
  end
  return first, own
end
"""
)


def _side(side: int) -> str:
    return f"local SIDE = {side}\n"


def _acquire(side: int) -> Script:
    return Script(
        "rw-acquire-" + ("write" if side else "read"),
        """
-- KEYS: see `_lua.rwlock` (1 state, 2-3 the caller's side's queue, 4 holds, 5-6 the
-- other side's queue)
-- ARGV as ACQUIRE's: ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] the holder; only when the
-- caller queues: ARGV[4] its queue's id, ARGV[5] waiters behind it, ARGV[6] the rest of its
-- entry, ARGV[7..] tokens a lease may have been granted to under that queue
-- Returns {1, fencing token}: acquired (also when a retry finds it already ours);
--         {0, ms until a check is due, '', '', '', '', typical hold ms}: not now; the
--           caller's queue entry is added (at the back) or refreshed;
--         {-1, 0}: this token was aborted by its owner, or already used.
"""
        + CONSTANTS
        + _side(side)
        + STATE
        + COMMON
        + LEASES
        + _POLICY
        + """
local ttl = tonumber(ARGV[2])
if refused() then
  return {-1, 0}
end
scan()
local wid = ARGV[4] or ''
local behind = tonumber(ARGV[5] or '0')
local kept = keep_ours(ttl)
if kept then
  flush()
  return {1, kept}
end
local function taken(fence)
  if wid ~= '' then
    dequeue(wid)
    if behind > 0 then
      -- More waiters of this side in the caller's process: back of its queue.
      line_up(wid, now_ms + ttl + GRACE, behind, ARGV[6])
    end
  end
  serve()  -- readers let in at once (a writer: nothing to serve while it holds)
  flush()
  return {1, fence}
end
if wid ~= '' then
  for i = 7, #ARGV do
    local claimed = state['p:' .. ARGV[i]]
    if claimed then
      -- Granted to one of the caller's registrations: taken under the caller's token.
      local fence = tonumber(string.match(claimed, '^%d+ %d+ (%d+) '))
      removed[#removed + 1] = 'p:' .. ARGV[i]
      live = live - 1
      hold(ARGV[1], fence, ttl, ttl, ARGV[3], SIDE)
      return taken(fence)
    end
  end
end
serve(wid ~= '' and wid or nil)
local writer, writer_entry
if queued then
  writer, writer_entry = first_writer()  -- (nobody queued: no writer waits)
end
local admitted
if SIDE == 1 then
  admitted = live == 0 and (not writer or writer == wid)
else
  admitted = not used[1] and not writer
end
if admitted then
  local fence = issue()
  hold(ARGV[1], fence, ttl, ttl, ARGV[3], SIDE)
  return taken(fence)
end
-- Not now: check again when the soonest lease would expire unrenewed, or a waiting
-- writer's mark would lapse; a waiting writer refreshes its own mark three times as often.
local wait = soonest and soonest - now_ms or WRITER_MARK
if writer and writer ~= wid then
  wait = math.min(wait, tonumber(string.match(writer_entry, '^(%d+) ')) - now_ms + 1)
end
local until_ms = now_ms + math.max(wait, 0) + GRACE
if SIDE == 1 then
  wait = math.min(wait, math.floor(WRITER_MARK / 3))
  until_ms = now_ms + WRITER_MARK
end
if wid ~= '' then
  line_up(wid, until_ms, behind + 1, ARGV[6])
end
flush()
return {0, wait, '', '', '', '', state.h or ''}
""",
    )


def _release(side: int) -> Script:
    return Script(
        "rw-release-" + ("write" if side else "read"),
        """
-- KEYS: see `_lua.rwlock` (1 state, 2-3 the caller's side's queue, 4 holds, 5-6 the
-- other side's queue)
-- ARGV as RELEASE's: ARGV[1] token ('' when only withdrawing a queue), ARGV[2] mode ('' or
-- 'abort'), ARGV[3] retention (ms) of the state once nothing is held ('': unchanged),
-- ARGV[4] the hold (ms) to record ('' for none), ARGV[5] a queue (of the caller's side) to
-- withdraw, ARGV[6] the releasing process's own queue (same side), ARGV[7] its entry,
-- ARGV[8] its waiter count, ARGV[9..] tokens a lease may have been granted to under the
-- queue withdrawn or joining (released too)
-- Returns {status, queue id, granted fencing token, seq, grant expiry ms, ''}: status as
-- RELEASE's; the grant is the one to the releasing process's own queue if there is one,
-- else the first made. Whoever the policy lets in next is served.
"""
        + CONSTANTS
        + _side(side)
        + STATE
        + COMMON
        + FORBID
        + HOLDS
        + LEASES
        + END_LEASE
        + _POLICY
        + """
local field = 'p:' .. ARGV[1]
if ARGV[1] ~= '' and holding(field) then
  end_lease(field, (forgotten(9)))
  if own ~= '' then
    line_up(own, now_ms + RESERVATION + GRACE, tonumber(ARGV[8]), ARGV[7])
  end
  local first, own_grant = serve(nil, own)
  flush(retain)
  return reply(1, own_grant or first)
end
local withdraw = ARGV[5] or ''
if withdraw ~= '' then
  -- The queue left: what was granted to it is handed on, and a writer that stopped waiting
  -- may let readers in.
  dequeue(withdraw)
  scan((forgotten(9)))
  local first = serve()
  flush()
  return reply(3, first)
end
return not_held()
""",
    )


RW_ACQUIRE: Final = (_acquire(0), _acquire(1))
"""The acquire scripts of the read side [0] and the write side [1]."""
RW_RELEASE: Final = (_release(0), _release(1))
"""The release scripts of the read side [0] and the write side [1]."""
