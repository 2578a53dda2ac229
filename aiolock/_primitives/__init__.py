"""The primitives users hold: `Lock`, `Semaphore`, `ReadWriteLock`, `Redlock`, `Election`
(with its terms and observers) and `MultiLock`. Each adds its keys, its scripts (in `_lua`)
and its replies' meaning; the engine does the rest.

Imports: every floor up to `_ops`. Tests: `tests/integration/test_<primitive>.py`, the fault
suite in `tests/faults/`, and the checker (`python -m tests.checker`).
"""
