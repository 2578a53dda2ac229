"""The engine every leased primitive shares: what a primitive is made of (`primitive_base`),
the primitive and its attempt (`acquisition`), and the objects it works with: one `acquire()`
call (`acquire_call`), the release and the compensations of a failed acquire (`release`),
leases made from a reply or a grant (`lease_issuing`); the `Lease` itself
(`lease`) and the guard of its body (`guard`), the wait queue of one name in this process
(`wait_queue`), the renewal task (`watchdog`), waiting without polling (`notifier`) and the
per-client background work (`runtime`).

A new primitive adds its keys and scripts and calls this engine; it never copies the waiting
loop. Imports: `_aio`, `_lua`, `_model`, `_transport`. Tests: `tests/integration/`
(`test_lock.py`, `test_loss.py`, `test_watchdog.py`, `test_fifo.py`, `test_first_await.py`,
`test_stalls.py`, ...) and `tests/faults/`.
"""
