"""Settings and records: the validated, frozen configuration of a primitive (`config`,
`options`), the renewal policy (`renewal_policy`), what Redis records of a holder (`holder`)
and of an election's leader (`leader`), lock events for listeners (`events`) and the hold
statistics (`hold_stats`), the rules of a quorum's votes (`quorum_rules`). The public `aiolock.errors` stands on this floor too.

Imports: `_aio`, `_lua`, `aiolock.errors`; no connection, no task. Tests:
`tests/unit/test_config.py`, `test_options.py`, `test_lease_renewals.py`,
`test_quorum_rules.py`, and
`tests/integration/test_events.py`, `test_info_shape.py`, `test_bad_input.py`.
"""
