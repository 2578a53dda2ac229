"""aiolock: asyncio-native distributed locks on Redis.

```python
from aiolock import Lock

async with Lock(redis, "orders:42", ttl=10) as lease:
    await db.write(..., fence=lease.fencing_token)
```

Public names are exported from here only; the modules behind them are private.
"""

from __future__ import annotations

from ._election import Election as Election
from ._election import Term as Term
from ._engine import Busy as Busy
from ._events import EventKind as EventKind
from ._events import LockEvent as LockEvent
from ._events import add_listener as add_listener
from ._fencing import FencedValue as FencedValue
from ._fencing import fenced_delete as fenced_delete
from ._fencing import fenced_get as fenced_get
from ._fencing import fenced_set as fenced_set
from ._holdstats import HoldStats as HoldStats
from ._info import LockInfo as LockInfo
from ._inspect import hold_stats as hold_stats
from ._leader import Leader as Leader
from ._lease import Lease as Lease
from ._lock import Lock as Lock
from ._locked import locked as locked
from ._multilock import MultiLease as MultiLease
from ._multilock import MultiLock as MultiLock
from ._once import DoneMarker as DoneMarker
from ._once import OnceResult as OnceResult
from ._once import OnceStatus as OnceStatus
from ._once import run_once as run_once
from ._options import LockOptions as LockOptions
from ._redlock import Redlock as Redlock
from ._redlock import RedlockInfo as RedlockInfo
from ._redlock import RedlockNode as RedlockNode
from ._redlock import RedlockRelease as RedlockRelease
from ._rwlock import ReadLock as ReadLock
from ._rwlock import ReadWriteInfo as ReadWriteInfo
from ._rwlock import ReadWriteLock as ReadWriteLock
from ._rwlock import WriteLock as WriteLock
from ._semaphore import Semaphore as Semaphore
from ._semaphore import SemaphoreInfo as SemaphoreInfo
from ._shutdown import ReleaseReport as ReleaseReport
from ._shutdown import release_all as release_all
from ._shutdown import release_on_signals as release_on_signals
from ._version import __version__ as __version__
from .errors import AcquireTimeoutError as AcquireTimeoutError
from .errors import AiolockError as AiolockError
from .errors import BackendError as BackendError
from .errors import ConfigError as ConfigError
from .errors import LeaseLostError as LeaseLostError
from .errors import LockError as LockError
from .errors import LossReason as LossReason
from .errors import QuorumError as QuorumError
from .errors import ReplicationError as ReplicationError

__all__ = (
    "AcquireTimeoutError",
    "AiolockError",
    "BackendError",
    "Busy",
    "ConfigError",
    "DoneMarker",
    "Election",
    "EventKind",
    "FencedValue",
    "HoldStats",
    "Leader",
    "Lease",
    "LeaseLostError",
    "Lock",
    "LockError",
    "LockEvent",
    "LockInfo",
    "LockOptions",
    "LossReason",
    "MultiLease",
    "MultiLock",
    "OnceResult",
    "OnceStatus",
    "QuorumError",
    "ReadLock",
    "ReadWriteInfo",
    "ReadWriteLock",
    "Redlock",
    "RedlockInfo",
    "RedlockNode",
    "RedlockRelease",
    "ReleaseReport",
    "ReplicationError",
    "Semaphore",
    "SemaphoreInfo",
    "Term",
    "WriteLock",
    "__version__",
    "add_listener",
    "fenced_delete",
    "fenced_get",
    "fenced_set",
    "hold_stats",
    "locked",
    "release_all",
    "release_on_signals",
    "run_once",
)

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("aiolock."):
        _obj.__module__ = "aiolock"
del _name, _obj
