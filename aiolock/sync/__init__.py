"""aiolock for synchronous code: threads, Celery tasks, Django views and commands, scripts.

```python
import redis
from aiolock.sync import Lock

with Lock(redis.Redis(), "orders:42", ttl=10) as lease:
    db.write(..., fence=lease.fencing_token)
```

The same keys, scripts, leases, renewal and fencing tokens as asyncio code's `aiolock`: a
sync holder and an asyncio holder of one name exclude each other. One background thread per
process runs an event loop with aiolock's engine for every sync lock; its watchdog renews
the leases. A synchronous body cannot be cancelled: it learns of a loss from `lease.lost`,
`lease.check()`, an `on_lost` callback, and at the block's exit (`LeaseLostError`).

Errors are aiolock's (`aiolock.LeaseLostError`, ...); the settings are `aiolock.LockOptions`.
"""

from __future__ import annotations

from ._lease import Lease as Lease
from ._lease import LossCallback as LossCallback
from ._primitives import Lock as Lock
from ._primitives import ReadLock as ReadLock
from ._primitives import ReadWriteLock as ReadWriteLock
from ._primitives import Redlock as Redlock
from ._primitives import Semaphore as Semaphore
from ._primitives import WriteLock as WriteLock
from ._recipes import locked as locked
from ._recipes import run_once as run_once
from ._shutdown import release_all as release_all
from ._shutdown import release_on_signals as release_on_signals
from ._shutdown import shutdown as shutdown

__all__ = (
    "Lease",
    "Lock",
    "LossCallback",
    "ReadLock",
    "ReadWriteLock",
    "Redlock",
    "Semaphore",
    "WriteLock",
    "locked",
    "release_all",
    "release_on_signals",
    "run_once",
    "shutdown",
)

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("aiolock.sync."):
        _obj.__module__ = "aiolock.sync"
del _name, _obj
