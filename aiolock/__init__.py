"""aiolock: asyncio-native distributed locks on Redis.

```python
from aiolock import Lock

async with Lock(redis, "orders:42", ttl=10) as lease:
    await db.write(..., fence=lease.fencing_token)
```

Public names are exported from here only; the modules behind them are private.
"""

from __future__ import annotations

from ._engine.acquisition import Busy as Busy
from ._engine.lease import Lease as Lease
from ._model.events import EventKind as EventKind
from ._model.events import LockEvent as LockEvent
from ._model.events import add_listener as add_listener
from ._model.hold_stats import HoldStats as HoldStats
from ._model.holder import LockInfo as LockInfo
from ._model.leader import Leader as Leader
from ._model.options import LockOptions as LockOptions
from ._ops.inspection import hold_stats as hold_stats
from ._primitives.election import Election as Election
from ._primitives.lock import Lock as Lock
from ._primitives.multilock import MultiLease as MultiLease
from ._primitives.multilock import MultiLock as MultiLock
from ._primitives.redlock import Redlock as Redlock
from ._primitives.redlock import RedlockInfo as RedlockInfo
from ._primitives.redlock import RedlockNode as RedlockNode
from ._primitives.redlock import RedlockRelease as RedlockRelease
from ._primitives.rwlock import ReadLock as ReadLock
from ._primitives.rwlock import ReadWriteInfo as ReadWriteInfo
from ._primitives.rwlock import ReadWriteLock as ReadWriteLock
from ._primitives.rwlock import WriteLock as WriteLock
from ._primitives.semaphore import Semaphore as Semaphore
from ._primitives.semaphore import SemaphoreInfo as SemaphoreInfo
from ._primitives.term import Term as Term
from ._recipes.fenced_storage import FencedValue as FencedValue
from ._recipes.fenced_storage import fenced_delete as fenced_delete
from ._recipes.fenced_storage import fenced_get as fenced_get
from ._recipes.fenced_storage import fenced_set as fenced_set
from ._recipes.locked import locked as locked
from ._recipes.run_once import DoneMarker as DoneMarker
from ._recipes.run_once import OnceResult as OnceResult
from ._recipes.run_once import OnceStatus as OnceStatus
from ._recipes.run_once import run_once as run_once
from ._recipes.shutdown import ReleaseReport as ReleaseReport
from ._recipes.shutdown import release_all as release_all
from ._recipes.shutdown import release_on_signals as release_on_signals
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
