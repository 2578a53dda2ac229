"""`aiolock`: see the locks, semaphores, read-write locks and elections in a Redis server,
evict a stuck holder, run the demo.

```
aiolock ls [PATTERN]              in use: holder(s), age, ttl left, fencing token, waiters
aiolock show NAME                 everything known about one lock, semaphore, rwlock or election
aiolock release NAME --force      evict the holder of a lock (token-guarded, asks first)
aiolock watch [PATTERN]           a live `ls` table, until Ctrl-C
aiolock stats [PATTERN]           hold times per lock, semaphore and rwlock, and the ttl they suggest
aiolock doctor                    what in the server's setup can break locks
aiolock demo                      a flash sale on a throwaway server, checked
```

Every command, its options, the keys of its `--json` output and the exit codes are on the
documentation's command-line page (docs/cli.md).

The package: `_main` (`main`), `_parser` (the arguments), `_connection` (reaching the
server), `_errors` (exit codes), the commands by group (`_inspection`: ls, show, watch,
stats; `_maintenance`: release, doctor; `_demo_command`: demo), and the views
(`_json_views`, `_tables`; values as text in `_text`); the demo's flash sale itself is
`_flash_sale`.

Needs the `cli` extra (`pip install "aiolock-redis[cli]"`) for `rich`. Added in 0.1.
"""

from __future__ import annotations

from ._errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from ._main import main

__all__ = (
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "main",
)
