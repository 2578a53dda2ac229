"""Every Lua script aiolock runs, with a KEYS/ARGV/returns header on each, the parts they
share, and the data layout they keep in Redis (`layout`: key names, fields, format version).

`lock` holds the `Script` type, the parts every script includes and the `Lock`'s scripts;
`lease` the scripts every primitive's leases share (renewal, grants); `hash_leases` those of
the primitives whose leases are fields of one hash; then one module per primitive
(`semaphore` with its `permit_index`, `rwlock`, `redlock`, `election`), `fencing` for fenced
storage and `cluster` for the scripts as a cluster runs them (shard channels).

Imports: `_aio` at most; no client library, no task. Tests: the scripts run against real
servers in `tests/integration/` (`test_commands.py` counts their calls) and
`tests/faults/test_late_commands.py` (each applied twice, and late).
"""
