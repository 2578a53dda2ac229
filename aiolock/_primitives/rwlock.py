"""`ReadWriteLock`: many readers or one writer, writers first. Its keys and scripts; the
engine does the rest, for each side."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Unpack, final

from .._engine.acquisition import Call, Primitive
from .._engine.runtime import runtime_for
from .._lua.lock import acquire_args
from .._lua.rwlock import RW_ACQUIRE, RW_RELEASE, WRITER_MARK_MS
from .._model.config import check_name
from .._model.holder import HOST, LockInfo, pid
from .._model.options import LockOptions, lock_config
from .._model.weak_slot import WeakSlot
from .._ops.inspection import READER_QUEUE, read_locks
from .._transport.clients import AsyncClient, check_client

__all__ = ("ReadLock", "ReadWriteInfo", "ReadWriteLock", "WriteLock")


@dataclass(frozen=True, slots=True)
class _RWKeys:
    state: str
    writers: tuple[str, str]  # the writers' wait queue (zset, hash)
    readers: tuple[str, str]  # the readers' wait queue
    holds: str
    channels: tuple[str, str]  # where grants to readers [0] and writers [1] are announced

    @classmethod
    def build(cls, prefix: str, name: str) -> _RWKeys:
        base = f"{prefix}:rw:{{{name}}}"
        return cls(
            state=base,
            writers=(f"{base}:queue", f"{base}:waiters"),
            readers=(base + READER_QUEUE[0], base + READER_QUEUE[1]),
            holds=f"{base}:holds",
            channels=(f"{base}:rreleased", f"{base}:released"),
        )

    def of_side(self, side: int) -> tuple[str, ...]:
        """KEYS of the scripts of `side`: its own wait queue first (see `_lua.rwlock`)."""
        own, other = (self.writers, self.readers) if side else (self.readers, self.writers)
        return (self.state, *own, self.holds, *other)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ReadWriteInfo:
    """What Redis says about a read-write lock right now (never a secret token).

    `holders`, `waiting` and `free` are the fields every primitive's `info()` has, with
    the same meanings (`LockInfo`, `SemaphoreInfo`).

    Added in 0.1.
    """

    name: str
    readers: tuple[LockInfo, ...]
    """The readers, by fencing token (the order they came in)."""
    writer: LockInfo | None
    writers_waiting: int
    """Tasks waiting to write, summed over the queued processes whose entries are live."""
    readers_waiting: int
    last_fencing_token: int | None

    @property
    def holders(self) -> tuple[LockInfo, ...]:
        """Who holds the lock: the writer alone, or the readers (empty: free).

        Added in 0.1."""
        return (self.writer,) if self.writer is not None else self.readers

    @property
    def waiting(self) -> int:
        """Tasks waiting, on either side: `writers_waiting` plus `readers_waiting`.

        Added in 0.1."""
        return self.writers_waiting + self.readers_waiting

    @property
    def free(self) -> int:
        """1 when nobody holds either side (a writer may enter at once), else 0: as a
        lock's, since the write side is the exclusive one.

        Added in 0.1."""
        return 0 if self.holders else 1


class _Side(Primitive):
    """One side of a `ReadWriteLock`: a primitive whose leases are readers' or the writer's."""

    __slots__ = ("__weakref__", "_keys", "_rw", "_script_keys")

    _side: ClassVar[int]
    _renew_kind = "p"

    def __init__(self, rw: ReadWriteLock) -> None:
        self._rw = rw
        self._keys = rw._keys
        self._script_keys = rw._keys.of_side(self._side)
        super().__init__(
            rw._client,
            rw._name,
            rw._config,
            key=rw._keys.state,
            channel=rw._keys.channels[self._side],
            release_keys=self._script_keys,
        )

    @property
    def lock(self) -> ReadWriteLock:
        """The read-write lock this is a side of."""
        return self._rw

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._rw!r} held_here={len(self._held)}>"

    def _acquire_call(
        self, token: str, task: str, queue: tuple[str, int, str] | None, claims: Sequence[str]
    ) -> Call:
        holder = f"{HOST} {pid()} {task}"
        args = acquire_args(token, self._config.ttl_ms, holder, queue=queue, claims=claims)
        return RW_ACQUIRE[self._side], self._script_keys, args


@final
class ReadLock(_Side):
    """The read side of a `ReadWriteLock` (`rw.read()`): its leases are shared with other
    readers, never with the writer. Used like a `Lock`: `async with rw.read() as lease`,
    `acquire()`, `try_acquire()`...

    Added in 0.1.
    """

    __slots__ = ()
    _side = 0
    _what = "read lock"
    _release_script = RW_RELEASE[0]
    _exclusive = False


@final
class WriteLock(_Side):
    """The write side of a `ReadWriteLock` (`rw.write()`): one writer, and no reader
    meanwhile. Used like a `Lock`. While it waits, the first waiting writer of the process
    refreshes its place every third of a second (one command), which also stops new readers.

    Added in 0.1.
    """

    __slots__ = ()
    _side = 1
    _what = "write lock"
    _release_script = RW_RELEASE[1]
    _max_poll = WRITER_MARK_MS / 3000


@final
class ReadWriteLock:
    """A named read-write lock in Redis: many readers at once, or one writer, across
    processes. Writers come first: a waiting writer stops new readers, so a stream of
    readers cannot keep writers out; it gets in once the readers inside have left.

    ```python
    catalog = ReadWriteLock(redis, "catalog", ttl=30)
    async with catalog.read() as lease:      # shared
        items = await load(...)
    async with catalog.write() as lease:     # exclusive
        await save(..., fence=lease.fencing_token)
    ```

    Every reader's and writer's lease is a `Lease`: renewed, expiring within the ttl if its
    process dies, its body cancelled if it is lost. Fencing tokens come from one sequence
    for both sides: storage that remembers the highest token a writer used rejects a writer
    whose lease was lost.

    A waiting writer whose process died stops blocking readers within about a second (its
    place in the queue lapses unless refreshed). A task that holds either side and waits for
    either side of the same lock again is refused (`RuntimeError`): with writers first,
    a second read can wait forever behind a writer that waits for the first.

    Args:
        client: a redis-py or valkey-py asyncio client, of one server or of a cluster,
            as for `Lock`.
        name: the lock's name, as for `Lock` (its keys do not clash with a lock's).
        options: the settings of every reader's and writer's lease, `LockOptions`, as
            for `Lock`: `ttl`, `renew`, `renew_interval`, `timeout` (on either side),
            `max_hold`, `prefix`, `retain`, `hold_stats`, `replicas`, `replica_timeout`.

    Raises:
        TypeError: a wrong type, or an unknown keyword.
        ConfigError: a value out of range; the message names the argument and the range.

    Added in 0.1.
    """

    __slots__ = ("_client", "_config", "_keys", "_name", "_read", "_write")

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        **options: Unpack[LockOptions],
    ) -> None:
        self._client: AsyncClient = check_client(client)
        self._name = check_name(name)
        self._config = lock_config("ReadWriteLock()", options)
        self._keys = _RWKeys.build(self._config.prefix, self._name)
        # Each side refers to this lock, which refers to its sides weakly: a side is made
        # again when none is alive, and one in use (held, waited for, kept) is given.
        self._read: WeakSlot[ReadLock] = WeakSlot()
        self._write: WeakSlot[WriteLock] = WeakSlot()

    @property
    def name(self) -> str:
        return self._name

    @property
    def key(self) -> str:
        """The Redis key of the lock's state and leases."""
        return self._keys.state

    def read(self) -> ReadLock:
        """The read side: shared leases (the same object each time, while it is in use)."""
        return self._read.get(ReadLock, self)

    def write(self) -> WriteLock:
        """The write side: the exclusive lease (the same object each time, while it is in
        use)."""
        return self._write.get(WriteLock, self)

    def __repr__(self) -> str:
        return f"<ReadWriteLock {self._name!r} ttl={self._config.ttl:g}s>"

    async def info(self) -> ReadWriteInfo:
        """The readers, the writer and who waits, read in one round trip.

        Raises:
            BackendError: Redis could not be reached or refused the command.
        """
        async with runtime_for(self._client).backend.node_client(self._keys.state) as client:
            (state,) = await read_locks(
                client, [self._name], prefix=self._config.prefix, kind="rw:"
            )
        return ReadWriteInfo(
            name=self._name,
            readers=state.readers,
            writer=state.holder,
            writers_waiting=state.writers_waiting,
            readers_waiting=state.readers_waiting,
            last_fencing_token=state.last_fencing_token,
        )

    async def locked(self) -> bool:
        """Whether the lock is held right now on either side: by a writer or by any reader
        (one round trip). True means that a writer could not enter at once; a reader may
        still, unless the holder is a writer or a writer waits (writers come first).

        Raises:
            BackendError: Redis could not be reached or refused the command.

        Cancellation:
            Safe to cancel: it only reads.

        Added in 0.1.
        """
        return (await self.info()).free == 0
