"""asyncio helpers that know no Redis: shielding cleanup from cancellation (`shielding`),
starting a task eagerly (`eager_start`), letting arrived replies be read before a timeout acts
(`arrivals`), backoff and polling delays (`backoff`) and the `async with` blocks of one object
by task (`task_blocks`).

Imports: the standard library and anyio only, nothing else of aiolock. Tests:
`tests/unit/test_cancel.py`, `test_eager.py`, `test_retry.py`, `test_waits.py`.
"""
