"""An election's Lua scripts: its term is a lock's lease (ACQUIRE, RENEW and RESUME of
`_lua.lock` unchanged); these add the leader's record, the change log and the change channel.

For an election named NAME under PREFIX, besides a lock's keys under `PREFIX:el:{NAME}`:

| key / channel              | type    | holds                                                |
|----------------------------|---------|------------------------------------------------------|
| `PREFIX:el:{NAME}` fields  | hash    | the lock's state, and while a term is announced: `et` (its term: the holder's fencing token), `ei` (the leader's identity), `es` (server time of the announcement, Unix ms), `ev` (the proclaimed value: "" for none, else "=" and the value), `en` (the number of the last proclamation) |
| `PREFIX:el:{NAME}:log`     | stream  | the changes, oldest first, at most LOG_KEPT: id "<term>-<n>", fields `e` ("won", "value" or "ended") and `i`, `s`, `v` (won), `v` (value), `r` (ended: "resigned", "evicted", "aborted" or "expired"); lives LOG_RETAIN_MS after its last change |
| `PREFIX:el:{NAME}:changed` | channel | one message per change: the id of its log entry ("" if it could not be logged) |
| `PREFIX:el:{NAME}:ids`     | hash    | the identity of the candidate each process's wait queue last put in line (field: queue id), for `Term.transfer()`, and `#`: how many queue ids it holds (those of queues no longer in line are removed once they are many, see EL_ACQUIRE); lives IDS_RETAIN_MS after its last write (added in 0.4: older processes neither write nor read it) |

A term is announced once its holder has its lease (an acquire or a grant): until then, and
after it ends, the record is absent. The record lives in the state hash, so it expires with
the term; a release by the holder (EL_RELEASE) removes it and logs the end. A term whose key
expired ends without a word: the next announcement logs it as "expired" first.

Log ids are ordered by term, and terms strictly increase (they are fencing tokens, floored
by the server clock): a reader that remembers the last id it read gets every later change
in order with `XRANGE`, across a lost connection, and never an older term after a newer
one. An entry whose id would not be after the log's last (the server clock stepped back
further than the log's age) is not logged; the record and the message still tell.

Every script is one round trip, safe to apply twice, and refuses a late copy: it acts only
for the token that holds the term now, and a proclamation only if it is newer than the last.
Their `redis.call`s are counted in each header.
"""

from __future__ import annotations

from typing import Final

from .lock import ACQUIRE, CONSTANTS, RELEASE, Script

__all__ = (
    "ACL_EXTRA",
    "CHANGED_SUFFIX",
    "EL_ACQUIRE",
    "EL_ANNOUNCE",
    "EL_PROCLAIM",
    "EL_READ",
    "EL_RELEASE",
    "EL_SUCCESSOR",
    "IDS_RETAIN_MS",
    "IDS_SLACK",
    "IDS_SUFFIX",
    "INFIX",
    "LOG_KEPT",
    "LOG_RETAIN_MS",
    "LOG_SUFFIX",
    "stored_value",
)

INFIX: Final = "el:"
"""Between the prefix and the name in an election's keys."""
LOG_SUFFIX: Final = ":log"
"""The change log's key: the state key and this."""
CHANGED_SUFFIX: Final = ":changed"
"""The change channel: the state key and this."""
IDS_SUFFIX: Final = ":ids"
"""The candidates' identities (by wait queue): the state key and this."""
IDS_RETAIN_MS: Final = 86_400_000
"""How long the candidates' identities live after the last was written (ms)."""
IDS_SLACK: Final = 32
"""The candidates' identities kept beyond twice the queue's length before those of wait
queues no longer in line are removed."""
LOG_KEPT: Final = 100
"""Changes the log keeps: a reader further behind misses the oldest of them."""
LOG_RETAIN_MS: Final = 86_400_000
"""How long the log lives after its last change (ms)."""
ACL_EXTRA: Final = ("xadd", "xrange", "xrevrange")
"""What an election's scripts call beyond a lock's (the change log): a least-privilege ACL
user of aiolock needs them too to use elections."""


def stored_value(value: str | None) -> str:
    """A proclaimed value as the record keeps it: "" for none, else "=" and the value."""
    return "" if value is None else "=" + value


# Appending to the change log, KEYS[LOG] (set by the script before this).
LOG = f"""
local LOG_KEPT, LOG_RETAIN = {LOG_KEPT}, {LOG_RETAIN_MS}
local last_term, last_n, last_event
-- The log's last entry: its term (digits), number within the term, and event (nil: empty).
local function last_entry()
  if last_term == nil then
    last_term = false
    local entry = redis.call('XREVRANGE', KEYS[LOG], '+', '-', 'COUNT', 1)[1]
    if entry then
      local term, n = string.match(entry[1], '^(%d+)%-(%d+)$')
      if term then
        last_term, last_n = term, tonumber(n)
        for i = 1, #entry[2], 2 do
          if entry[2][i] == 'e' then
            last_event = entry[2][i + 1]
          end
        end
      end
    end
  end
  return last_term, last_n, last_event
end
-- Append a change of `term` (digits) with the fields given; its id, or false if the log's
-- last entry is of a later term (not logged).
local function append(term, ...)
  local lt, ln = last_entry()
  local n = 0
  if lt then
    if tonumber(lt) > tonumber(term) then
      return false
    elseif lt == term then
      n = ln + 1
    end
  end
  local id = term .. '-' .. n
  redis.call('XADD', KEYS[LOG], 'MAXLEN', LOG_KEPT, id, ...)
  redis.call('PEXPIRE', KEYS[LOG], LOG_RETAIN)
  last_term, last_n, last_event = term, n, select(2, ...)
  return id
end
-- Tell the watchers.
local function changed(id)
  redis.call('PUBLISH', KEYS[1] .. ':changed', id or '')
end
"""

_RELEASE_BODY = RELEASE.source.split(CONSTANTS, 1)[1]
assert RELEASE.source.count(CONSTANTS) == 1, "RELEASE is CONSTANTS followed by its body"

EL_RELEASE = Script(
    "el_release",
    """
-- RELEASE (see `_lua.lock`) for an election's term: the same KEYS[1..4], ARGV and replies,
-- and KEYS[5] the change log.
-- First, when the holder ends an announced term (a release, an abort or an eviction by
-- its token), its record is removed and its end logged and published: HMGET, then HDEL,
-- XREVRANGE, XADD, PEXPIRE, PUBLISH (1 call, 6 when a term ends); then RELEASE's own.
-- Every PUBLISH here (SPUBLISH on a cluster of Redis 7+ or Valkey: the variant of `_lua.cluster`).
"""
    + CONSTANTS
    + "local LOG = 5\n"
    + LOG
    + """
do
  local e = redis.call('HMGET', KEYS[1], 'token', 'fence', 'et')
  if ARGV[1] ~= '' and e[1] == ARGV[1] and e[3] and e[3] == e[2] then
    redis.call('HDEL', KEYS[1], 'et', 'ei', 'es', 'ev', 'en')
    local how = ARGV[2] or ''
    local why = 'resigned'
    if how == 'force' then
      why = 'evicted'
    elseif how == 'abort' then
      why = 'aborted'
    end
    changed(append(e[2], 'e', 'ended', 'r', why))
  end
end
"""
    + _RELEASE_BODY,
)

EL_ANNOUNCE = Script(
    "el_announce",
    """
-- KEYS[1] state (hash), KEYS[2] change log (stream)
-- ARGV[1] token of the term's lease, ARGV[2] the leader's identity, ARGV[3] the value to
-- proclaim as stored ("" for none, else "=" and the value)
-- Returns {1, term, announced at (Unix ms, server clock)}: the term held under the token
--           is announced: its record written, logged ("won"; a term before it whose key
--           expired unannounced as ended, "expired", first) and published; or it was
--           already, by an earlier copy of this call (nothing changed);
--         {0}: no term is held under the token (it ended).
-- PUBLISH (SPUBLISH on a cluster of Redis 7+ or Valkey: the variant of `_lua.cluster`).
-- Calls: HMGET, TIME, HSET, XREVRANGE, XADD, PEXPIRE, PUBLISH (7; 9 when an expired term
-- is logged first); HMGET alone for a copy.
"""
    + CONSTANTS
    + "local LOG = 2\n"
    + LOG
    + """
local s = redis.call('HMGET', KEYS[1], 'token', 'fence', 'et', 'es')
if not s[1] or s[1] ~= ARGV[1] then
  return {0}
end
local term = s[2]
if s[3] == term then
  return {1, term, s[4]}
end
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('HSET', KEYS[1], 'et', term, 'ei', ARGV[2], 'es', now, 'ev', ARGV[3], 'en', 0)
local lt, ln, le = last_entry()
if lt and lt ~= term and le ~= 'ended' then
  append(lt, 'e', 'ended', 'r', 'expired')
end
changed(append(term, 'e', 'won', 'i', ARGV[2], 's', now, 'v', ARGV[3]))
return {1, term, now}
""",
)

EL_PROCLAIM = Script(
    "el_proclaim",
    """
-- KEYS[1] state (hash), KEYS[2] change log (stream)
-- ARGV[1] token of the term's lease, ARGV[2] the value as stored ("" for none, else "="
-- and the value), ARGV[3] the number of this proclamation within the term (from 1, each
-- larger than the last)
-- Returns {1}: the value is the term's now (or a later proclamation was made already: a
--           late copy changes nothing); logged ("value") and published if it changed;
--         {0}: no announced term is held under the token.
-- PUBLISH (SPUBLISH on a cluster of Redis 7+ or Valkey: the variant of `_lua.cluster`).
-- Calls: HMGET, HSET, XREVRANGE, XADD, PEXPIRE, PUBLISH (6); HMGET, HSET when the value
-- is the one proclaimed already; HMGET alone for a late copy or a refusal.
"""
    + CONSTANTS
    + "local LOG = 2\n"
    + LOG
    + """
local s = redis.call('HMGET', KEYS[1], 'token', 'fence', 'et', 'ev', 'en')
if not s[1] or s[1] ~= ARGV[1] or s[3] ~= s[2] then
  return {0}
end
if tonumber(ARGV[3]) <= (tonumber(s[5] or '') or 0) then
  return {1}
end
redis.call('HSET', KEYS[1], 'ev', ARGV[2], 'en', ARGV[3])
if s[4] ~= ARGV[2] then
  changed(append(s[2], 'e', 'value', 'v', ARGV[2]))
end
return {1}
""",
)

EL_READ = Script(
    "el_read",
    """
-- KEYS[1] state (hash), KEYS[2] change log (stream)
-- ARGV[1] the first log id to return, "<term>-<n>" ("" for none: the newest id alone)
-- Returns {pttl ms, held (1 or 0), fencing token, term announced, identity, announced at
--          (Unix ms), value as stored, newest log id, entries}: the state's fields ("" where
--          absent; held and the term equal to the fencing token: the leader's record), and
--          the log's entries from ARGV[1] on, at most LOG_KEPT, as XRANGE gives them ({}
--          for ""), the newest id then being the last of them (or ARGV[1] if none).
-- Calls: HMGET, PTTL, XRANGE or XREVRANGE (3). Reads only.
"""
    + f"local LOG_KEPT = {LOG_KEPT}\n"
    + """
local s = redis.call('HMGET', KEYS[1], 'token', 'fence', 'et', 'ei', 'es', 'ev')
local pttl = redis.call('PTTL', KEYS[1])
local entries, newest = {}, ''
if ARGV[1] == '' then
  local entry = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)[1]
  if entry then
    newest = entry[1]
  end
else
  entries = redis.call('XRANGE', KEYS[2], ARGV[1], '+', 'COUNT', LOG_KEPT)
  newest = ARGV[1]
  if #entries > 0 then
    newest = entries[#entries][1]
  end
end
local held = 0
if s[1] then
  held = 1
end
return {pttl, held, s[2] or '', s[3] or '', s[4] or '', s[5] or '', s[6] or '', newest, entries}
""",
)

_ACQUIRE_BODY = ACQUIRE.source.split(CONSTANTS, 1)[1]
assert ACQUIRE.source.count(CONSTANTS) == 1, "ACQUIRE is CONSTANTS followed by its body"

EL_ACQUIRE = Script(
    "el_acquire",
    """
-- ACQUIRE (see `_lua.lock`) for a candidate that queues: its KEYS[1..4] and replies, and
-- KEYS[5] the candidates' identities (hash); ARGV as ACQUIRE's with the candidate's
-- identity inserted as ARGV[7] (the tokens claimed follow it, from ARGV[8]).
-- First the identity is recorded for the caller's wait queue (ARGV[4]), for
-- `Term.transfer()` to find (EL_SUCCESSOR): HSET, PEXPIRE; then ACQUIRE's own calls.
-- A process makes a new wait queue id each time its waiters come back after none waited,
-- so the hash counts the ids it holds (field "#"): when a new id makes them more than
-- IDS_SLACK and twice as many as are in line, those not in line (but the caller's) are
-- removed: HINCRBY, ZCARD, and then HGETALL, ZRANGE, HDEL, HSET (about once per IDS_SLACK
-- new ids). Only commands a lock's scripts call too (a least-privilege user has them).
-- A candidate that does not queue uses ACQUIRE itself; older processes never write here.
"""
    + CONSTANTS
    + f"local IDS_RETAIN, IDS_SLACK = {IDS_RETAIN_MS}, {IDS_SLACK}\n"
    + """
local identity = table.remove(ARGV, 7)
if redis.call('HSET', KEYS[5], ARGV[4], identity) == 1 then
  local count = redis.call('HINCRBY', KEYS[5], '#', 1)
  if count > IDS_SLACK and count > 2 * redis.call('ZCARD', KEYS[2]) then
    local line = {}
    for _, wid in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
      line[wid] = true
    end
    local fields, gone = redis.call('HGETALL', KEYS[5]), {}
    for i = 1, #fields, 2 do
      local wid = fields[i]
      if wid ~= '#' and wid ~= ARGV[4] and not line[wid] then
        gone[#gone + 1] = wid
      end
    end
    if #gone > 0 then
      redis.call('HDEL', KEYS[5], unpack(gone))
    end
    redis.call('HSET', KEYS[5], '#', count - #gone)
  end
end
redis.call('PEXPIRE', KEYS[5], IDS_RETAIN)
"""
    + _ACQUIRE_BODY,
)

EL_SUCCESSOR = Script(
    "el_successor",
    """
-- KEYS[1] state (hash), KEYS[2] waiter queue (zset), KEYS[3] waiter entries (hash),
-- KEYS[4] candidates' identities (hash: wait queue id -> identity, see EL_ACQUIRE)
-- ARGV[1] token of the term's lease, ARGV[2] the identity of the successor named
-- Returns {1, queue id}: the first wait queue in line whose entry has not expired and whose
--           candidate has that identity now heads the queue (moved ahead of the others,
--           their order otherwise kept), so that the release that follows (EL_RELEASE, or
--           RELEASE of an older process: it grants to the queue's head) grants the term to
--           it; it headed the queue already: nothing changed;
--         {0}: no term is held under the token (nothing changed);
--         {-1}: no candidate of that identity is in line (nothing changed).
-- Calls: HGET (1) when the term is not held; else HGET, TIME, ZRANGE, an HGET per queue
-- looked at (its identity; one more, its entry, when the identity is the one named), and
-- ZADD if the one named moves: 5 when it heads the line, 6 + 1 per queue ahead of it;
-- 3 + 1 per queue in line when none is named so.
"""
    + CONSTANTS
    + """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  return {0}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local line = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #line, 2 do
  local wid = line[i]
  if redis.call('HGET', KEYS[4], wid) == ARGV[2] then
    local entry = redis.call('HGET', KEYS[3], wid) or '0'
    local until_ms = tonumber(string.match(entry, '^(%d+) ') or '0')
    if until_ms >= now_ms then
      if i > 1 then
        redis.call('ZADD', KEYS[2], tonumber(line[2]) - 1, wid)
      end
      return {1, wid}
    end
  end
end
return {-1}
""",
)
