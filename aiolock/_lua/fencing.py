"""The scripts of fenced storage in Redis (`fenced_set`, `fenced_get`, `fenced_delete`).

A fenced key is one hash: its field `value` holds the data, its field `fence` the highest
fencing token a write or a delete was accepted with. One key, so the highest token lives
exactly as long as the data (one expiry, one slot on a cluster, evicted or renamed with
it), and a check and its write are one script: atomic.

Tokens travel as decimal digits without leading zeros (0 to 2**63 - 1, checked before the
call) and are compared as text, by length and then in two parts of at most ten digits:
exact, where Lua's numbers (doubles) are not above 2**53.

Each script is one round trip, and safe to apply twice and late: a copy of a write applied
again is a write with the same token (accepted, the same value written again); a copy that
arrives after a write with a higher token is refused.
"""

from __future__ import annotations

from typing import Final

from .lock import Script

__all__ = ("FENCED_DELETE", "FENCED_GET", "FENCED_SET", "FENCING_SCRIPTS", "MAX_FENCING_TOKEN")

MAX_FENCING_TOKEN: Final = 2**63 - 1
"""The largest fencing token the scripts take: a signed 64-bit integer (a SQL BIGINT)."""

# Shared by FENCED_SET and FENCED_DELETE: KEYS[1] the fenced key, ARGV[1] the token.
_ACCEPTS = """
-- Whether the token ARGV[1] is at least the highest stored in KEYS[1] (none: yes). A
-- stored `fence` that is not a number is an error, raised before anything is written.
local function accepts()
  local stored = redis.call('HGET', KEYS[1], 'fence')
  if not stored then
    return true
  end
  local highest = string.match(stored, '^0*(%d+)$')
  if not highest then
    return redis.error_reply('ERR the field fence of ' .. KEYS[1] .. ' is not a fencing token')
  end
  local token = ARGV[1]
  if #token ~= #highest then
    return #token > #highest
  end
  local a, b = tonumber(string.sub(token, 1, -10)) or 0, tonumber(string.sub(highest, 1, -10)) or 0
  if a ~= b then
    return a > b
  end
  return tonumber(string.sub(token, -9)) >= tonumber(string.sub(highest, -9))
end
local accepted = accepts()
if type(accepted) == 'table' then
  return accepted
end
"""

FENCED_SET = Script(
    "fenced_set",
    """
-- KEYS[1] the fenced key: a hash, `value` (the data) and `fence` (the highest token)
-- ARGV[1] fencing token (decimal digits), ARGV[2] the value, ARGV[3] ttl (ms), or '' for
-- none: the key then does not expire (as SET without EX)
-- Returns 1: written (the token is at least the highest stored): `value`, `fence` and the
--           expiry set;
--         0: refused (a higher token is stored): nothing changed.
-- One round trip; HGET, then on a write HSET and PEXPIRE (or PERSIST).
"""
    + _ACCEPTS
    + """
if not accepted then
  return 0
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1])
if ARGV[3] == '' then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
""",
)

FENCED_DELETE = Script(
    "fenced_delete",
    """
-- KEYS[1] the fenced key (as FENCED_SET's)
-- ARGV[1] fencing token (decimal digits), ARGV[2] how long (ms) the key, now without its
-- value, keeps the token; '' for the expiry it had (none if it had none)
-- Returns 1: deleted (the token is at least the highest stored): `value` removed, `fence`
--           set to the token (so a later write with a lower one is still refused);
--         0: refused (a higher token is stored): nothing changed.
-- One round trip; HGET, then on a delete HDEL, HSET, and PEXPIRE if ARGV[2] is given.
"""
    + _ACCEPTS
    + """
if not accepted then
  return 0
end
redis.call('HDEL', KEYS[1], 'value')
redis.call('HSET', KEYS[1], 'fence', ARGV[1])
if ARGV[2] ~= '' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
""",
)

FENCED_GET = Script(
    "fenced_get",
    """
-- KEYS[1] the fenced key (as FENCED_SET's)
-- Returns {value or nil, highest token or nil}.
-- One round trip; one HMGET.
return redis.call('HMGET', KEYS[1], 'value', 'fence')
""",
)

FENCING_SCRIPTS: Final = (FENCED_SET, FENCED_GET, FENCED_DELETE)
