"""A process using aiolock.sync, for the tests of what happens to a process: a fork, an
interruption, a signal, the interpreter's exit.

Run as `python -m tests.integration.sync_child SCENARIO --url URL --name NAME` from the
repository root. It prints one JSON object per line (`event`, and what the scenario tells),
and reads a line on stdin where the scenario waits for the test:

- `fork`: acquire, then fork (a Celery prefork worker forked after its parent used the
  lock); the child says what its inherited lease and lock object say, and acquires another
  name through a lock object made before the fork; the parent says its lease still holds.
- `interrupt`: wait for a lock the test holds, until the test sends SIGINT; say what the
  KeyboardInterrupt left, then wait for a line before exiting.
- `exit`: acquire, drop the connections, and exit without releasing (the interpreter's
  exit releases, connecting again).
- `sigterm`: `release_on_signals()`, then hold the lock in a `with` block until SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import warnings

import redis
import redis.asyncio

import aiolock.sync
from aiolock import LeaseLostError
from aiolock.sync import _clients, _portal

from ..support import programs
from ..support.programs import emit as say


def fork(client: redis.Redis, name: str) -> None:
    lock = aiolock.sync.Lock(client, name, ttl=30)
    later = aiolock.sync.Lock(client, name + ":child", ttl=30)  # made, not used, before fork
    lease = lock.acquire()
    say("acquired", fencing_token=lease.fencing_token, token=lease.token)
    with warnings.catch_warnings():
        # Python 3.12+ warns of a fork in a process with threads (aiolock.sync's loop):
        # what the at-fork handler is for.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        try:
            seen: dict[str, object] = {"lost": lease.lost, "held": lease.held}
            for action in ("check", "release", "extend"):
                try:
                    getattr(lease, action)()
                    seen[action] = "nothing raised"
                except LeaseLostError as error:
                    seen[action] = f"LeaseLostError: {error}"
            try:
                with lease:
                    pass
                seen["with"] = "nothing raised"
            except LeaseLostError:
                seen["with"] = "LeaseLostError"
            with later as own:
                seen["own"] = own.fencing_token
            aiolock.sync.shutdown()
            say("child", **seen)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    lease.check()
    say("parent", child_status=status, held=lease.held)
    lease.release()


def interrupt(client: redis.Redis, name: str) -> None:
    # Ctrl-C as in a program started from a terminal: a suite started in the background by
    # a non-interactive shell runs with SIGINT ignored, its children inherit that, and
    # Python then leaves it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    lock = aiolock.sync.Lock(client, name, ttl=30)
    say("waiting")
    try:
        lock.acquire()
    except KeyboardInterrupt:
        say("interrupted")
    else:
        say("acquired")
    sys.stdin.readline()


def exit_holding(client: redis.Redis, name: str) -> None:
    lease = aiolock.sync.Lock(client, name, ttl=30).acquire()
    # Its connections dropped (as an idle one may be): the release at exit opens one, by
    # host name, when concurrent.futures already refuses work.
    twin = _clients.twin(client)
    assert isinstance(twin, redis.asyncio.Redis)
    _portal.portal().run(twin.connection_pool.disconnect)
    say("acquired", fencing_token=lease.fencing_token)
    # no release: the interpreter's exit gives it back


def sigterm(client: redis.Redis, name: str) -> None:
    aiolock.sync.release_on_signals()
    with aiolock.sync.Lock(client, name, ttl=30) as lease:
        say("acquired", fencing_token=lease.fencing_token)
        time.sleep(60)  # SIGTERM arrives meanwhile
    say("completed")


SCENARIOS = {"fork": fork, "interrupt": interrupt, "exit": exit_holding, "sigterm": sigterm}


def main() -> None:
    parser = programs.parser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    args = parser.parse_args()
    client = redis.Redis.from_url(args.url)
    SCENARIOS[args.scenario](client, args.name)
    say("exit")


if __name__ == "__main__":
    main()
