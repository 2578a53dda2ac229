"""Operating locks rather than taking them: reading the data layout back (`inspection`),
checking a server's setup (`doctor`) and the least-privilege ACL line (`acl`).

Imports: every floor up to `_engine`. Tests: `tests/cli/` (`test_inspect.py`,
`test_doctor.py`), `tests/faults/test_security.py` (the ACL on a real server).
"""
