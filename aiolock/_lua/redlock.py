"""The scripts a `Redlock` runs on each of its independent servers.

A Redlock's state on each node is one hash, `PREFIX:rl:{NAME}` (see `_lua.layout`), shaped as a
lock's so that INSPECT, RESUME and `LockInfo.from_fields` read it: while held, `token`,
`fence` (the holder's fencing token: the one agreed by the quorum once written back),
`m`, `a`, `t` (the holder, when it acquired, its ttl); and what outlives a hold: `n` (this
node's fencing counter), `k` (the first KEPT digits of the last released token), `w` (set
by a refused acquire: someone may be waiting, so the release announces itself), `a:<token>`
(acquires aborted by their caller, see FORBID; an acquire granted here and then aborted
is one of them, so that `k` still names the last lease released). No wait queue is kept
on the nodes.

Every script here is safe to apply twice and safe to arrive late (a copy of an acquire
that arrives after its abort or release is refused). The renewal of a Redlock's lease is
RENEW's kind "r" (see `_lua.lock`).
"""

from __future__ import annotations

from .lock import CONSTANTS, FORBID, Script

__all__ = ("RL_ACQUIRE", "RL_FENCE", "RL_RELEASE")

RL_ACQUIRE = Script(
    "rl_acquire",
    """
-- KEYS[1] state (hash), KEYS[2] the release channel (not used here: the release's KEYS)
-- ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] the holder, "<host> <pid> <task>", ARGV[4] the
-- retention (ms) of an abort of this acquire (not used here: the quorum's abort uses it),
-- ARGV[5] the token the caller proposes (its clock in us, a little ahead: when every
-- granting node issues it, the quorum agrees without writing it back)
-- Returns {1, fencing token}: acquired on this node, its counter raised to the token
--           (max(n + 1, last fence + 1, server time in us, the proposal)); a retry that
--           finds the key already ours gets its fencing token back, its expiry reset;
--         {0, pttl ms, fencing token, holder, acquired ms, ttl ms, ''}: held by the holder
--           described; marks the state (`w`) so that its release announces itself;
--         {-1, 0}: this token was aborted or released: it must never be granted again.
"""
    + CONSTANTS
    + """
local s = redis.call('HMGET', KEYS[1], 'token', 'fence', 'n', 'k', 'a:' .. ARGV[1])
if s[1] == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(s[2])}
end
if s[5] or s[4] == string.sub(ARGV[1], 1, KEPT) then
  return {-1, 0}
end
if s[1] then
  local h = redis.call('HMGET', KEYS[1], 'm', 'a', 't')
  redis.call('HSET', KEYS[1], 'w', 1)
  return {0, redis.call('PTTL', KEYS[1]), s[2] or '', h[1] or '', h[2] or '', h[3] or '', ''}
end
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local fence = math.max((tonumber(s[3] or '') or 0) + 1, (tonumber(s[2] or '') or 0) + 1, us,
  tonumber(ARGV[5] or '') or 0)
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'fence', fence, 'n', fence, 'm', ARGV[3],
  'a', math.floor(us / 1000), 't', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, fence}
""",
)

RL_FENCE = Script(
    "rl_fence",
    """
-- KEYS[1] state (hash)
-- ARGV[1] token, ARGV[2] the fencing token agreed by the quorum
-- Returns 1: the lease is held here under the token; its fencing token is now the one
--         agreed, and this node's counter at least that (never lowered); 0: not held here
--         under the token (nothing changed).
local s = redis.call('HMGET', KEYS[1], 'token', 'n')
if s[1] ~= ARGV[1] then
  return 0
end
local agreed = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'fence', agreed, 'n', math.max(tonumber(s[2] or '') or 0, agreed))
return 1
""",
)

RL_RELEASE = Script(
    "rl_release",
    """
-- KEYS[1] state (hash), KEYS[2] the release channel
-- ARGV[1] token, ARGV[2] mode: '' to release, 'abort' (an acquire given up on), 'force'
-- (an eviction), all alike; ARGV[3] retention (ms, '' for none): what stays of the state
-- lives that long
-- Returns {status, '', '', '', 0} as RELEASE's: 1 released now; 2 released already (a
-- retry); 0 not the owner here (expired, never acquired here, or someone else holds it),
-- and a later acquire with this token is refused here (a copy of it still on its way:
-- the quorum decided without this node, and the release overtook it).
-- A release that ends a hold some acquire was refused during announces it on the channel
-- as "<released fencing token> " (handed to nobody: every waiter may try).
"""
    + CONSTANTS
    + FORBID
    + """
local s = redis.call('HMGET', KEYS[1], 'token', 'fence', 'w', 'k')
local mine = string.sub(ARGV[1], 1, KEPT)
if ARGV[1] ~= '' and s[1] == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'token', 'm', 'a', 't', 'w')
  if ARGV[2] == 'abort' and s[4] then
    -- An acquire given up on (a split vote's): forbidden by a field of its own, so that
    -- `k` keeps naming the last lease released here, which a renewal sent before that
    -- release and arriving now must not hold again.
    forbid(ARGV[1], false)
  else
    redis.call('HSET', KEYS[1], 'k', mine)
  end
  if (ARGV[3] or '') ~= '' then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
  if s[3] then
    redis.call('PUBLISH', KEYS[2], (s[2] or '') .. ' ')
  end
  return {1, '', '', '', 0}
end
if ARGV[1] ~= '' and s[4] == mine then
  return {2, '', '', '', 0}
end
if ARGV[1] ~= '' then
  -- Not held here under the token: its acquire may still be on its way (the quorum
  -- decided without this node), so a late copy of it must be refused.
  forbid(ARGV[1], s[1] ~= false)
end
return {0, '', '', '', 0}
""",
)
