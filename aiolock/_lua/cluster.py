"""The scripts as a cluster runs them: their messages on shard channels (sharded pub/sub).

On a Redis Cluster, a classic `PUBLISH` is sent over the cluster bus to every node, whoever
listens. Redis 7 and Valkey have sharded pub/sub: `SPUBLISH` on a shard channel reaches the
subscribers of the node serving the channel's slot (and that node's replicas) only. Every
channel of aiolock carries its name's hash tag (`PREFIX:{NAME}:released`), so it is in the
slot of the keys the script reads: the node running the script serves it.

`for_cluster(script)` is the variant of a script that a cluster client runs (chosen once
per client by its transport, never asked of the server per call): every
`redis.call('PUBLISH', channel, message)` of its text becomes `publish(channel, message)`,
a function that sends `SPUBLISH` where the server has it (`redis.REDIS_VERSION_NUM` exists
from Redis 7 on, and on Valkey), and `PUBLISH` where it has not (Redis 6.2) or where the
user may not run it (an ACL without `+spublish`: `SPUBLISH` is refused, and so is the
subscriber's `SSUBSCRIBE` on that node, which then subscribes the classic way). So each
release's message goes where the notifier listens for it (`_transport.cluster_pubsub`): on the shard
channel of a node that has sharded pub/sub, on the classic channel of one that has not.

The variant is the original text after a prologue: its KEYS, ARGV and replies are the
original's, and it is as safe to apply twice (a message is sent on the same paths).
"""

from __future__ import annotations

import functools
from typing import Final

from .lock import Script

__all__ = ("PUBLISH_CALL", "for_cluster")

PUBLISH_CALL: Final = "redis.call('PUBLISH', "
"""How every script of aiolock publishes (the variant replaces each)."""

PROLOGUE: Final = """-- Cluster variant (see aiolock._lua.cluster): publish() sends SPUBLISH on Redis 7+
-- and Valkey (on the shard channel of the keys' slot), PUBLISH on Redis 6.2 or when the
-- user may not run SPUBLISH.
local function publish(channel, message)
  if redis.REDIS_VERSION_NUM then
    local sent = redis.pcall('SPUBLISH', channel, message)
    if type(sent) ~= 'table' or not sent.err then
      return sent
    end
  end
  return redis.call('PUBLISH', channel, message)
end
"""


@functools.cache
def for_cluster(script: Script) -> Script:
    """`script` as a cluster client runs it: its messages on shard channels where the server
    has them (the script itself if it publishes nothing)."""
    if PUBLISH_CALL not in script.source:
        return script
    return Script(script.name, PROLOGUE + script.source.replace(PUBLISH_CALL, "publish("))
