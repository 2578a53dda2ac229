"""Leader election: `Election`, which wins `Term`s (`_primitives.term`), and its observers.

A term is a lease of `_Seat`, a primitive on the engine with a lock's acquire and a release
that also ends the term's record (`_lua.election`): candidates wait in the engine's FIFO
queue, a release hands the seat straight to the next candidate (one notification), the
watchdog renews the term, and its loss cancels the leader's work through the lease's cancel
scope. The term's number is the lease's fencing token. Around the lease, the election
writes the leader's record and the change log (EL_ANNOUNCE, EL_PROCLAIM); observers read
them back (EL_READ) whenever the change channel, a new subscription, or the leader's expiry
says that something may have changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Final, final

from .._aio.backoff import Backoff
from .._engine.acquisition import MIN_ATTEMPT_TIMEOUT, Call, Primitive
from .._engine.lease import Lease
from .._engine.runtime import runtime_for
from .._lua.election import (
    CHANGED_SUFFIX,
    EL_ACQUIRE,
    EL_ANNOUNCE,
    EL_READ,
    EL_RELEASE,
    IDS_SUFFIX,
    INFIX,
    LOG_SUFFIX,
    stored_value,
)
from .._lua.layout import RETAIN_DEFAULT, LockKeys
from .._lua.lock import ACQUIRE, acquire_args
from .._model import events
from .._model.config import LockConfig, check_identity, check_name, check_value
from .._model.holder import HOST, pid, text
from .._model.leader import Change, Leader, next_id, parse_change
from .._transport.call_options import CallOptions
from .._transport.clients import AsyncClient, check_client
from ..errors import AiolockError, BackendError, LeaseLostError
from .term import Office, Term

__all__ = ("Election",)

logger = logging.getLogger("aiolock")

READ_TIMEOUT: Final = 5.0
"""Longest wait for an observer's read of the record and the log, seconds."""
EXPIRY_SLACK: Final = 0.005
"""An observer reads the record again this long (plus 1 % of the ttl left) after the
leader's key would expire unrenewed: expiry sends no message."""


class _Seat(Primitive):
    """The primitive whose leases are an election's terms: a lock's scripts, and a release
    that ends the term's record (EL_RELEASE)."""

    __slots__ = ("_identity", "_keys")

    _what = "election"
    _release_script = EL_RELEASE
    _direct_grants = True
    # Candidates are not served oldest first across processes (`_oldest_first`): a
    # transfer names who goes next by moving it to the head of the line, and the releasing
    # process's own candidates must not go before it.

    def __init__(
        self, client: AsyncClient, name: str, config: LockConfig, *, identity: str
    ) -> None:
        self._identity = identity
        keys = self._keys = LockKeys.build(config.prefix, name, INFIX)
        super().__init__(
            client,
            name,
            config,
            key=keys.lock,
            channel=keys.channel,
            release_keys=(*keys.scripts, keys.lock + LOG_SUFFIX),
        )

    def _acquire_call(
        self, token: str, task: str, queue: tuple[str, int, str] | None, claims: Sequence[str]
    ) -> Call:
        holder = f"{HOST} {pid()} {task}"
        args = acquire_args(token, self._config.ttl_ms, holder, queue=queue, claims=claims)
        if queue is None:
            return ACQUIRE, self._keys.state, args
        # A candidate in line says who it is, for `Term.transfer()` (EL_SUCCESSOR).
        args.insert(6, self._identity)
        return EL_ACQUIRE, self._transfer_keys, args

    @property
    def _transfer_keys(self) -> tuple[str, ...]:
        """EL_ACQUIRE's KEYS: ACQUIRE's, and the candidates' identities."""
        keys = self._keys
        return (*keys.scripts, keys.lock + IDS_SUFFIX)

    @property
    def _successor_keys(self) -> tuple[str, ...]:
        """EL_SUCCESSOR's KEYS: the state, the waiter queue and its entries, and the
        candidates' identities."""
        keys = self._keys
        return (keys.lock, keys.queue, keys.waiters, keys.lock + IDS_SUFFIX)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """One EL_READ: the leader (or None), the record key's pttl, the log's changes read and
    its newest id."""

    leader: Leader | None
    pttl_ms: int
    newest: str
    changes: tuple[Change, ...]


def _apply(current: Leader | None, change: Change, name: str) -> Leader | None:
    """The leader after `change`, if `current` was the leader before it (older changes
    than `current`'s term change nothing)."""
    if change.event == "won":
        if current is None or change.fencing_token > current.fencing_token:
            return Leader(
                name=name,
                identity=change.identity,
                fencing_token=change.fencing_token,
                since=change.since,
                value=change.value,
            )
    elif current is not None and change.fencing_token == current.fencing_token:
        if change.event == "ended":
            return None
        if change.value != current.value:
            return replace(current, value=change.value)
    return current


def _newer(current: Leader | None, recorded: Leader | None) -> bool:
    """Whether the record says something `current` does not: a term that ended silently
    (expired), or a term or value the log did not say."""
    if recorded is None:
        return current is not None
    if current is None or recorded.fencing_token > current.fencing_token:
        return True
    return recorded.fencing_token == current.fencing_token and recorded.value != current.value


async def _call(callback: Callable[..., object], *args: object) -> None:
    """Call a callback of `Election.run()`, awaiting what it returns if it is awaitable."""
    result = callback(*args)
    if inspect.isawaitable(result):
        await result


@final
class Election:
    """Leader election on Redis: of the candidates that campaign under one name, one at a
    time leads, for a term that is a lease (renewed in the background, its loss cancelling
    the leader's work) and whose number is a fencing token.

    ```python
    election = Election(redis, "scheduler", ttl=10, identity="host-a:1234")
    async for term in election.campaign():      # one Term per leadership won
        async with term:                        # cancelled if the term is lost
            await run_scheduler(fence=term.fencing_token)
    ```

    Candidates are served first come, first served (the engine's wait queue, across
    processes). A leader that resigns, or whose block ends, hands over at once; a leader
    that dies is replaced once its term expires, within `ttl`. A leader paused for longer
    than its ttl finds its term lost when it runs again (its work is cancelled), and its
    late writes carry a lower fencing token than its successor's: storage that keeps the
    highest token it has seen refuses them.

    `leader()` says who leads now; `observe()` gives every change, in order; `run()` takes
    the callbacks of Kubernetes client-go's leader election; `resume(token)` takes a term
    back after a restart. See docs/election.md.

    Args:
        client: a redis-py or valkey-py asyncio client, of one server (Sentinel's
            `master_for` included) or of a cluster, as for `Lock`.
        name: the election's name, as a lock's (its keys, under `PREFIX:el:{NAME}`, do not
            clash with a lock's).
        ttl: seconds a term lasts without renewal (0.01 to 1 year): how long a leader that
            died keeps the others waiting, and the longest pause a leader survives.
        identity: who this candidate is, as `leader()` and the observers show it (1 to 1000
            characters); default "<host>:<pid>".
        renew_interval: seconds between a term's renewals; default ttl/3.
        prefix: prefix of the election's Redis keys.
        replicas: replicas that must acknowledge each term's acquire and renewal, as for
            `Lock` (one server with replicas, or Sentinel).
        replica_timeout: how long to wait for them, as for `Lock`.

    Raises:
        TypeError: a wrong type.
        ConfigError: a value out of range; the message names the argument and the range.

    Added in 0.1.
    """

    __slots__ = ("_changed", "_client", "_identity", "_name", "_office", "_record_keys", "_seat")

    def __init__(
        self,
        client: AsyncClient,
        name: str,
        *,
        ttl: float = 10.0,
        identity: str | None = None,
        renew_interval: float | None = None,
        prefix: str = "aiolock",
        replicas: int = 0,
        replica_timeout: float | None = None,
    ) -> None:
        checked_client, checked_name = check_client(client), check_name(name)
        self._identity = f"{HOST}:{pid()}" if identity is None else check_identity(identity)
        config = LockConfig.cached(
            ttl=ttl,
            renew=True,
            renew_interval=renew_interval,
            timeout=None,
            max_hold=None,
            prefix=prefix,
            retain=RETAIN_DEFAULT,
            hold_stats=False,
            replicas=replicas,
            replica_timeout=replica_timeout,
        )
        self._client = checked_client
        self._name = checked_name
        self._seat = _Seat(checked_client, checked_name, config, identity=self._identity)
        state = self._seat._key
        self._record_keys = (state, state + LOG_SUFFIX)
        self._changed = state + CHANGED_SUFFIX
        self._office = Office(
            checked_client,
            checked_name,
            self._identity,
            self._record_keys,
            self._seat._successor_keys,
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def identity(self) -> str:
        """This candidate's identity."""
        return self._identity

    @property
    def ttl(self) -> float:
        return self._seat.ttl

    @property
    def key(self) -> str:
        """The Redis key of the election's state (the term's lease and the leader's record)."""
        return self._seat._key

    def __repr__(self) -> str:
        return f"<Election {self._name!r} identity={self._identity!r} ttl={self.ttl:g}s>"

    # ----------------------------------------------------------------- campaigning
    async def campaign(self, *, value: str | None = None) -> AsyncGenerator[Term, None]:
        """Campaign, and yield a `Term` each time this candidate wins one; after a term ends,
        campaign again, until the caller leaves the loop.

        Each term is announced before it is yielded: `leader()` and the observers name
        this candidate (with `value`, if given) from then on. A term still held when the
        loop asks for the next one (never entered, say) is resigned first; a term held
        when the loop is left stays the caller's (`async with term` resigns it). Leaving
        the loop while waiting leaves nothing queued.

        Args:
            value: what the leader proclaims with each term won (see `Term.proclaim`).

        Raises:
            BackendError: Redis could not be reached or refused a command (the loop ends).
            RuntimeError: the current task holds a term of this election in an `async with`
                block (waiting here would wait forever).

        Cancellation:
            As for `Lock.acquire()`: a cancelled campaign leaves nothing held or queued; a
            term won but not yet yielded is resigned under a shield first.
        """
        stored = stored_value(check_value(value))
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            lease = await self._seat.acquire(timeout=None)
            term = await self._announce(lease, stored, waited=loop.time() - started)
            if term is None:
                continue  # lost before it was announced: campaign again
            yield term
            if not (lease.released or lease.lost):  # the caller did not end it
                with contextlib.suppress(AiolockError, TimeoutError):
                    await lease.release()

    async def resume(self, token: str) -> Term:
        """Take back the term held under `token` (`term.lease.token`), e.g. in the process
        that replaced the one that won it, as `Lock.resume()` does a lease: its expiry is
        reset to the ttl, and from then on it is renewed, resigned and lost here like any
        term (etcd's `ResumeElection`). The term and its record are unchanged: observers
        see no change, and the `Term`'s identity and value are the ones the term was
        announced with (a term won but not yet announced is announced now, with this
        election's identity, counted as a term won). Two round trips (three for a term
        never announced).

        Raises:
            LeaseLostError: no term is held under `token` (it ended, or never was); or,
                with reason `DEADLINE`, the answer came only after the term's validity, as
                for `Lock.resume()`.
            ConfigError: `token` is not a valid token (nothing is sent).
            BackendError: Redis could not be reached or refused a command; if the term was
                resumed but its record could not be read, it is resigned (or, Redis out of
                reach, expires within the ttl): nothing stays held without its caller.

        Cancellation:
            Cancelled during the resume itself, the term's expiry is reset or not, and it
            stays the holder's (it expires within the ttl unless resumed again); cancelled
            once resumed, while its record is read, the term is resigned under a shield,
            as a campaign resigns a term won but not yet yielded.

        Added in 0.1.
        """
        lease = await self._seat.resume(token)
        try:
            leader = (await self._read("")).leader
        except BaseException:
            await lease._cleanup_after_loss()  # never reached its caller
            raise
        if leader is not None and leader.fencing_token == lease.fencing_token:
            return Term(self._office, lease, since=leader.since, identity=leader.identity)
        term = await self._announce(lease, "", waited=0.0)  # won, never announced
        if term is None:
            raise lease.loss_error()
        return term

    async def _announce(self, lease: Lease, stored: str, *, waited: float) -> Term | None:
        """Write the leader's record for the term under `lease`: its `Term`, or None if the
        term ended meanwhile (the lease is then released)."""
        try:
            # Bounded as an acquire attempt is: a term taken from a grant counts on a short
            # validity until its first renewal is answered (see `_renew_granted`).
            reply = await runtime_for(self._client).backend.run(
                EL_ANNOUNCE,
                self._record_keys,
                [lease.token, self._identity, stored],
                CallOptions(
                    timeout=max(lease.remaining(), MIN_ATTEMPT_TIMEOUT),
                    operation="announce",
                    name=self._name,
                ),
            )
        except BaseException:
            await lease._cleanup_after_loss()  # never reached its caller
            raise
        if int(reply[0]) != 1:
            lease._not_owner()
            await lease._cleanup_after_loss()
            return None
        term = Term(self._office, lease, since=int(text(reply[2])) / 1000)
        if events.enabled():
            events.emit(
                events.LockEvent(
                    kind=events.EventKind.TERM_WON,
                    name=self._name,
                    fencing_token=term.fencing_token,
                    wait=waited,
                )
            )
        return term

    # ----------------------------------------------------------------- who leads
    async def leader(self) -> Leader | None:
        """The leader now, as Redis records it, or None while nobody leads (no term, or a
        term won and not yet announced). One round trip.

        Raises:
            BackendError: Redis could not be reached or refused the command.

        Cancellation:
            Safe to cancel: it only reads.
        """
        return (await self._read("")).leader

    async def observe(self) -> AsyncGenerator[Leader | None, None]:
        """Every change of leader, in order: first the leader now (or None), then each
        change as it happens: a new term (with its leader), a new value proclaimed, None
        when a term ends and nobody leads yet.

        Changes come from the election's change log, read when its channel says there is
        something new (no polling): after a lost connection (found by the pub/sub
        connection's health checks, even when it dies silently) the log is read from where
        this observer stopped, so no change is missed, unless more than 100 came meanwhile
        (the log keeps 100). A term that expires (its leader died) sends no message: while
        a leader holds, the record is read again when its term would expire unrenewed,
        about once per ttl. Terms only increase: an older term never comes after a newer.

        Raises:
            BackendError: Redis could not be read, or the subscription was refused.

        Cancellation:
            Safe to cancel; the subscription ends with the generator (close it with
            `contextlib.aclosing` to end it at once).
        """
        notifier = runtime_for(self._client).notifier
        watch = notifier.watch(self._changed)
        try:
            await notifier.watch_ready(watch)
            snapshot = await self._read("")
            cursor = snapshot.newest or "0-0"
            current = snapshot.leader
            yield current
            while True:
                delay = None
                if current is not None and snapshot.pttl_ms > 0:
                    left = snapshot.pttl_ms / 1000
                    delay = left * 1.01 + EXPIRY_SLACK
                await watch.wait(delay)
                snapshot = await self._read(next_id(cursor))
                for change in snapshot.changes:
                    after = _apply(current, change, self._name)
                    if after != current:
                        current = after
                        yield current
                cursor = snapshot.newest or cursor
                if _newer(current, snapshot.leader):
                    current = snapshot.leader
                    yield current
        finally:
            notifier.unwatch(watch)

    async def _read(self, first: str) -> _Snapshot:
        """EL_READ: the record, and the log's changes from id `first` ("": none)."""
        reply = await runtime_for(self._client).backend.run(
            EL_READ,
            self._record_keys,
            [first],
            CallOptions(timeout=READ_TIMEOUT, operation="inspect", name=self._name),
        )
        pttl, held, fence, announced, identity, since, value, newest, entries = reply
        leader = Leader.recorded(
            self._name,
            held=int(held) == 1,
            fence=text(fence),
            announced=text(announced),
            identity=text(identity),
            since_ms=text(since),
            value=text(value),
        )
        changes = tuple(c for c in map(parse_change, entries) if c is not None)
        return _Snapshot(leader, int(pttl), text(newest), changes)

    # ----------------------------------------------------------------- client-go's callbacks
    async def run(
        self,
        on_started_leading: Callable[[Term], Awaitable[object]],
        *,
        on_stopped_leading: Callable[[], object] | None = None,
        on_new_leader: Callable[[str], object] | None = None,
        value: str | None = None,
    ) -> None:
        """Campaign for ever with client-go's callbacks (`leaderelection.LeaderCallbacks`),
        until cancelled.

        - `on_started_leading(term)` runs as each term's body (async): cancelled if the
          term is lost; when it returns, the leader resigns and campaigns again.
        - `on_stopped_leading()` is called after each term ends, lost or resigned.
        - `on_new_leader(identity)` is called for each new term observed, this
          candidate's included.

        The other callbacks may be plain functions or coroutine functions. Unlike
        client-go, a lost term does not end the run: the candidate campaigns again. Redis
        errors are logged and the campaign (or the observation) starts again after a
        backoff; an exception of a callback ends the run.

        Raises:
            TypeError: a callback that is not callable (nothing is sent).
            ConfigError: `value` out of range.
            Exception: whatever a callback raises (in an `ExceptionGroup` when
                `on_new_leader` raised it: it runs in a task of the run's own).

        Cancellation:
            Ends the run: the term held is resigned, nothing stays queued.
        """
        for argument, callback, optional in (
            ("on_started_leading", on_started_leading, False),
            ("on_stopped_leading", on_stopped_leading, True),
            ("on_new_leader", on_new_leader, True),
        ):
            if not (callable(callback) or (optional and callback is None)):
                raise TypeError(f"{argument} must be callable, got {type(callback).__name__}")
        check_value(value)
        async with asyncio.TaskGroup() as group:
            if on_new_leader is not None:
                group.create_task(self._tell_leaders(on_new_leader))
            await self._lead(on_started_leading, on_stopped_leading, value)

    async def _lead(
        self,
        on_started_leading: Callable[[Term], Awaitable[object]],
        on_stopped_leading: Callable[[], object] | None,
        value: str | None,
    ) -> None:
        backoff = Backoff(base=0.1, cap=5.0, rng=random.Random())
        while True:
            try:
                async with contextlib.aclosing(self.campaign(value=value)) as terms:
                    async for term in terms:
                        backoff.reset()
                        try:
                            async with term:
                                await on_started_leading(term)
                        except LeaseLostError:
                            if not term.lost:
                                raise  # another lease's
                        finally:
                            if on_stopped_leading is not None:
                                await _call(on_stopped_leading)
            except BackendError as exc:
                logger.warning("aiolock: election %r: %s; campaigning again", self._name, exc)
                await asyncio.sleep(backoff.next())

    async def _tell_leaders(self, on_new_leader: Callable[[str], object]) -> None:
        backoff = Backoff(base=0.1, cap=5.0, rng=random.Random())
        told: int | None = None
        while True:
            try:
                async with contextlib.aclosing(self.observe()) as changes:
                    async for leader in changes:
                        backoff.reset()
                        if leader is not None and leader.fencing_token != told:
                            told = leader.fencing_token
                            await _call(on_new_leader, leader.identity)
            except BackendError as exc:
                logger.warning("aiolock: election %r: %s; observing again", self._name, exc)
                await asyncio.sleep(backoff.next())
