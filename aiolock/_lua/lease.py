"""The scripts every primitive's leases share: RENEW (the watchdog's batches, a grant's
first renewal, `extend`) and RESUME (a lease taken up again by its token), for every way a
key holds a lease (a lock's holder, a read-write lock's or a semaphore's field, a
Redlock's state on one node), and RENEW_HOLDER, RENEW for one lease held by a lock's
state. Each is one round trip and safe to apply twice (see `_lua.lock`).
"""

from __future__ import annotations

from .lock import Script

__all__ = ("RENEW", "RENEW_HOLDER", "RESUME")

RENEW = Script(
    "renew",
    """
-- KEYS[1..N] the keys holding the leases (one slot per call on Cluster)
-- ARGV[3i-2] token of the lease in KEYS[i], ARGV[3i-1] its ttl (ms), ARGV[3i] its kind:
-- '' for a state hash holding it under `token` (a lock); 'p' for a hash holding it in the
-- field 'p:<token>', "<slot> <expires at, ms> <rest>" (a read-write lock's lease), the key
-- living at least as long as each such lease; 'ps' (or 'ps<n>' for a lease of n permits,
-- its extra ones in 'p:<token>~2' to 'p:<token>~n') for a semaphore's permit, held so, and
-- its slot's score in the index `KEYS[i]:permits` (a sorted set in the same slot, living
-- as long as the key: see `_lua.permit_index`) set to the new expiry; 'r<fencing token>' for a Redlock's state on
-- one of its nodes (see `_lua.redlock`): held as a lock's, and if the node lost it (it
-- restarted empty) and no other token holds it there, held again under `token` with that
-- fencing token, the node's counter raised to it (not for a token released or aborted
-- here), and a node that granted it after the token was agreed given the agreed one; 'r'
-- alone renews only
-- Returns {r1..rN}: 1 = expiry reset to the ttl, 0 = not the owner (nothing changed).
if redis.replicate_commands then redis.replicate_commands() end
local out = {}
local now_ms
for i = 1, #KEYS do
  local token, ttl, kind = ARGV[3 * i - 2], tonumber(ARGV[3 * i - 1]), ARGV[3 * i]
  out[i] = 0
  if kind == '' then
    if redis.call('HGET', KEYS[i], 'token') == token then
      redis.call('PEXPIRE', KEYS[i], ttl)
      out[i] = 1
    end
  elseif string.sub(kind, 1, 1) == 'r' then
    local s = redis.call('HMGET', KEYS[i], 'token', 'k', 'n', 'a:' .. token, 'fence')
    if s[1] == token then
      redis.call('PEXPIRE', KEYS[i], ttl)
      if #kind > 1 and s[5] ~= string.sub(kind, 2) then
        -- Granted here after the token was agreed (a late answer): the agreed one.
        local fence = tonumber(string.sub(kind, 2))
        redis.call('HSET', KEYS[i], 'fence', fence,
          'n', math.max(tonumber(s[3] or '') or 0, fence))
      end
      out[i] = 1
    elseif not s[1] and not s[4] and #kind > 1 and s[2] ~= string.sub(token, 1, #(s[2] or '')) then
      local fence = tonumber(string.sub(kind, 2))
      local t = redis.call('TIME')
      redis.call('HSET', KEYS[i], 'token', token, 'fence', fence,
        'n', math.max(tonumber(s[3] or '') or 0, fence), 'm', '', 'a',
        tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), 't', ttl)
      redis.call('PEXPIRE', KEYS[i], ttl)
      out[i] = 1
    end
  else
    local field = 'p:' .. token
    local lease = redis.call('HGET', KEYS[i], field)
    if not now_ms and lease then
      local t = redis.call('TIME')
      now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    -- 'ps<n>': a lease of n permits, its extra ones in 'p:<token>~2' to 'p:<token>~n'
    -- (see `_lua.permit_index`): renewed with it if every one is still held, else the
    -- lease is not (it lost a permit).
    local names, values = {field}, {lease}
    for k = 2, string.sub(kind, 1, 2) == 'ps' and tonumber(string.sub(kind, 3)) or 1 do
      if not lease then
        break
      end
      names[k] = field .. '~' .. k
      values[k] = redis.call('HGET', KEYS[i], names[k])
      lease = values[k]
    end
    local parsed = {}
    for k, value in ipairs(values) do
      local slot, expires, rest = string.match(value or '', '^(%d+) (%d+) (.*)$')
      if not (expires and tonumber(expires) > now_ms) then
        parsed = nil
        break
      end
      parsed[k] = {slot, rest}
    end
    if lease and parsed then
      local longer = redis.call('PTTL', KEYS[i]) < ttl
      for k, each in ipairs(parsed) do
        redis.call('HSET', KEYS[i], names[k], string.format('%s %.0f %s', each[1], now_ms + ttl, each[2]))
      end
      if longer then
        redis.call('PEXPIRE', KEYS[i], ttl)
      end
      if string.sub(kind, 1, 2) == 'ps' then
        local permits = KEYS[i] .. ':permits'
        for _, each in ipairs(parsed) do
          redis.call('ZADD', permits, 'XX', now_ms + ttl, each[1])
        end
        if longer then
          redis.call('PEXPIRE', permits, ttl)
        end
      end
      out[i] = 1
    end
  end
end
return out
""",
)

# A call sent with its script's text (a grant's first renewal: it must run even on a server
# that lost its scripts) costs the client, the connection and the server (which hashes the
# text of each EVAL) in proportion to that text: RENEW's is about 4 KB, this one 350 bytes.
RENEW_HOLDER = Script(
    "renew_holder",
    """
-- KEYS[1] a state hash holding one lease under `token` (RENEW's kind '': a lock's holder)
-- ARGV[1] token, ARGV[2] ttl (ms)
-- Returns {1}: the expiry reset to the ttl; {0}: not the owner (nothing changed); as RENEW
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1}
end
return {0}
""",
)

RESUME = Script(
    "resume",
    """
-- KEYS[1] the key holding the lease
-- ARGV[1] token, ARGV[2] ttl (ms), ARGV[3] its kind, as for RENEW ('' if left out)
-- Returns {1, fencing token[, slot, permits]}: a lease is held under this token (its slot
--         and permits, for a semaphore's lease, whose extra permits are reset too: the
--         index is not, its rescoring left to the scripts that read it); its expiry is
--         reset to the ttl; {0}: it is not.
if (ARGV[3] or '') == '' then
  if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tonumber(redis.call('HGET', KEYS[1], 'fence'))}
  end
  return {0}
end
if redis.replicate_commands then redis.replicate_commands() end
local field = 'p:' .. ARGV[1]
local lease = redis.call('HGET', KEYS[1], field)
if not lease then
  return {0}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local slot, expires, fence, rest = string.match(lease, '^(%d+) (%d+) (%d+) (.*)$')
if tonumber(expires) <= now_ms then
  return {0}
end
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], field, string.format('%s %.0f %s %s', slot, now_ms + ttl, fence, rest))
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
if ARGV[3] ~= 'ps' then
  return {1, tonumber(fence), tonumber(slot)}
end
-- A semaphore's lease of several permits: the extra ones renewed too, counted in the reply.
local permits, k = 1, 2
while true do
  local name = field .. '~' .. k
  local extra = redis.call('HGET', KEYS[1], name)
  local extra_slot, extra_rest = string.match(extra or '', '^(%d+) %d+ (.*)$')
  if not extra_slot then
    break
  end
  redis.call('HSET', KEYS[1], name, string.format('%s %.0f %s', extra_slot, now_ms + ttl, extra_rest))
  permits, k = permits + 1, k + 1
end
return {1, tonumber(fence), tonumber(slot), permits}
""",
)
