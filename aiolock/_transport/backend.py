"""The one seam between aiolock and the Redis server(s) of a user's client.

`Backend` runs scripts (EVALSHA with an EVAL fallback on NOSCRIPT), bounds every call by a
timeout, and translates redis errors into `BackendError` with the original chained. It also
makes, per user client, the connections aiolock opens for itself: background work
(renewals, the pub/sub subscription) must not wait for a free connection in the user's
pool, and must not inherit the user's retry policy (redis-py's default retries a command
for up to ~10 s, longer than many leases live). What runs on those connections (the
renewal scheduler, the notifier) is `_engine.runtime`'s.

How a call reaches the server is the `Transport`'s (`_transport.base`), one per deployment,
chosen here once per client (`transport_for`): direct sends on the user's pool
(`_transport.direct`), Sentinel re-targeting (`_transport.sentinel`), cluster routing
(`_transport.cluster`), or the client's own `execute_command`. The client libraries
(redis-py, valkey-py) and their errors are `_transport.clients`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import heapq
import random
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final, cast

import redis
import redis.asyncio
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from .._aio.arrivals import after_arrivals
from .._aio.backoff import Backoff
from .._lua.cluster import for_cluster
from .._lua.lock import Script
from ..errors import BackendError
from .base import Call, Command, CommandTransport, Sent, Transport
from .call_options import CallOptions
from .clients import (
    DURING_MIGRATION,
    STALLED,
    AsyncClient,
    Client,
    ClientLibrary,
    Errors,
    backend_error,
    broken,
    library_of,
    not_a_client,
    outcome_unknown,
)
from .cluster import ClusterTransport
from .direct import DirectTransport, sends_directly
from .sentinel import SentinelReplicaTransport, SentinelTransport

__all__ = ("MIGRATION_GRACE", "Backend", "backend_kind", "open_backend", "transport_for")

STALL_NOTICED: Final = 0.05
"""A bound that fell due this much late (or more) fell due while the event loop did not
run: the call's time was spent by the stall (`_transport.clients.stalled_for`)."""

MIGRATION_GRACE: Final = 1.0
"""Longest a call whose cluster slot migrates may outlast its bound, to let the try in
flight end (redis-py's cluster client tries a refused command a few times, for about
half a second, before it reports it): its outcome is then known, refused or applied."""


def transport_for(
    client: Client, library: ClientLibrary, loop: asyncio.AbstractEventLoop
) -> Transport:
    """The transport of `client`'s calls: a new deployment's transport is chosen here."""
    if isinstance(client, library.cluster):
        return ClusterTransport.for_client(library, client, loop)
    assert isinstance(client, library.client)
    pool = client.connection_pool
    if isinstance(pool, library.sentinel_pool):
        kind: type[Transport] = SentinelTransport if pool.is_master else SentinelReplicaTransport
        return kind.for_client(library, client, loop)
    if sends_directly(client, library):
        return DirectTransport.for_client(library, client, loop)
    return CommandTransport.for_client(library, client, loop)


class _Bound:
    """One call's bound: when it falls due, the call is cancelled (see `_Deadlines`); and
    what a migrating cluster slot the call meets allows (see `Backend._call`)."""

    __slots__ = (
        "answered",
        "backoff",
        "expired",
        "grace",
        "lenient",
        "loop",
        "overdue",
        "queued",
        "refused",
        "stalled",
        "task",
        "waiting_out",
    )

    def __init__(
        self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any], *, lenient: bool = True
    ) -> None:
        self.loop = loop
        self.lenient = lenient  # a try in flight at the bound may end first (MIGRATION_GRACE)
        self.task: asyncio.Task[Any] | None = task
        self.expired = False
        self.answered = False
        self.queued = True  # in its `_Deadlines`' heap, not yet fallen due
        # While a migrating cluster slot refuses the call, it is sent again after pauses.
        # The bound then ends it between two tries (every one refused: nothing applied), or
        # lets the try in flight end first (redis-py's own few tries, each refused or
        # answered), for at most MIGRATION_GRACE.
        self.backoff: Backoff | None = None
        self.waiting_out = False  # a refusal of a migrating slot was met
        self.refused: BaseException | None = None  # set while pausing after such a refusal
        self.overdue = False  # the bound passed while a try of a migration waited out was sent
        self.grace: asyncio.TimerHandle | None = None
        self.stalled = 0.0  # how late its falling due was noticed (the loop did not run)

    def give_up(self) -> None:
        if self.answered or self.task is None:
            return
        if self.waiting_out and self.refused is None and not self.overdue and self.lenient:
            self.overdue = True
            self.grace = self.loop.call_later(
                MIGRATION_GRACE, after_arrivals, self.loop, self.give_up
            )
            return
        # A cancellation that the client swallows (redis-py's wait_for on Python 3.11) still
        # ends the call: the next refusal or broken connection is not tried again.
        self.expired = self.overdue = True
        self.task.cancel()

    async def pause(self) -> None:
        """Wait before the call is sent again (backoff, within the bound)."""
        self.backoff = self.backoff or Backoff(base=0.02, cap=0.25, rng=random.Random())
        await asyncio.sleep(self.backoff.next())


_COMPACT_ABOVE: Final = 64
"""Ended calls whose entries `_Deadlines` keeps before it drops them all at once (when
they are also most of its entries)."""


class _Deadlines:
    """The bounds of the calls in flight on one event loop, in the order of their deadlines,
    watched by one loop timer armed for the earliest: a call costs an entry in a heap, not a
    timer of its own (what `asyncio.timeout` does, for a fraction of its cost on this hot
    path). A bound falls due exactly when a timer of its own would have: the loop runs the
    timer at the earliest deadline, which gives up every call then due (once the loop has
    read what had arrived, `after_arrivals`), and is armed again for the next. The entry of
    a call that ended stays until it comes first, or until ended calls are most of the
    entries, when they are dropped together."""

    __slots__ = ("_count", "_ended", "_heap", "_loop", "_timer", "_when")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, _Bound]] = []
        self._count = 0  # entries added: equal deadlines fall due in the order of their calls
        self._ended = 0  # entries of calls that ended
        self._timer: asyncio.TimerHandle | None = None
        self._when = 0.0  # when the timer is armed for

    def start(self, task: asyncio.Task[Any], timeout: float, *, grace: bool = True) -> _Bound:
        """The bound of a call of `task` that falls due `timeout` seconds from now (see
        `Backend.run` for `grace`)."""
        bound = _Bound(self._loop, task, lenient=grace)
        when = self._loop.time() + timeout
        self._count += 1
        heapq.heappush(self._heap, (when, self._count, bound))
        if self._timer is None or when < self._when:
            self._arm(when)
        return bound

    def end(self, bound: _Bound) -> None:
        """`bound`'s call ended (answered, failed or given up)."""
        bound.answered = True
        bound.task = None
        if bound.grace is not None:
            bound.grace.cancel()
        if not bound.queued:
            return
        self._ended += 1
        heap = self._heap
        if self._ended > _COMPACT_ABOVE and 2 * self._ended > len(heap):
            heap[:] = [entry for entry in heap if not entry[2].answered]
            heapq.heapify(heap)
            self._ended = 0

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._when = when
        self._timer = self._loop.call_at(when, self._fall_due)

    def _fall_due(self) -> None:
        self._timer = None
        heap = self._heap
        # What the loop ran this timer for is due; so is anything before it.
        actual = self._loop.time()
        now = max(actual, self._when)
        while heap and heap[0][0] <= now:
            when, _, bound = heapq.heappop(heap)
            bound.queued = False
            bound.stalled = actual - when
            if bound.answered:
                self._ended -= 1
            else:
                after_arrivals(self._loop, bound.give_up)
        if heap:
            self._arm(heap[0][0])


_DETACHED: Final = contextvars.ContextVar[bool]("aiolock_detached", default=False)
"""Set in the tasks aiolock starts for work that may go on after its caller returned
(`detached`): their calls are made as `Backend.run`'s `again_apart` ones."""


def detached() -> contextvars.Context:
    """A copy of the current context in which calls may outlive their caller: for a task
    of aiolock's own (a grantee's first renewal, a queue's withdrawal, a give-back), whose
    user may close the client before it ends."""
    context = contextvars.copy_context()
    context.run(_DETACHED.set, True)
    return context


class Backend:
    """How aiolock talks to one redis client: script calls on its pool, and connections of
    aiolock's own with its settings.

    One per client and event loop, held by that pair's `_engine.runtime.Runtime`. The client itself
    is held weakly: locks hold it strongly, so it lives as long as they do.
    """

    broken = staticmethod(broken)

    __slots__ = (
        "__weakref__",
        "_client_ref",
        "_deadlines",
        "_encoding",
        "_library",
        "_send",
        "loop",
        "transport",
    )

    def __init__(self, client: AsyncClient) -> None:
        library = library_of(client)
        if library is None:  # pragma: no cover - the primitives check their client first
            not_a_client(client)
        self._library = library
        # Typed as redis-py's: valkey-py's clients have the same API.
        client = cast(redis.asyncio.Redis | RedisCluster, client)
        self._client_ref: weakref.ref[redis.asyncio.Redis | RedisCluster] = weakref.ref(client)
        encoder = client.get_encoder()
        self._encoding = (str(encoder.encoding), str(encoder.encoding_errors))
        self.loop = asyncio.get_running_loop()
        self.transport = transport_for(client, library, self.loop)
        self._send = self.transport.send
        self._deadlines = _Deadlines(self.loop)

    @property
    def sees_writes(self) -> bool:
        """Whether a call's `on_sent` is called once its command was written (aiolock
        sends it on a connection itself, on one server or a cluster's node), rather than
        when redis-py is handed it (`execute_command`: fakeredis, a connection class of
        another kind)."""
        return self.transport.sees_writes

    @property
    def cluster(self) -> bool:
        """Whether the client is a `RedisCluster`: a script call's keys must then share
        one slot (renewals are sent one call per slot)."""
        return self.transport.cluster

    def slot(self, key: str) -> int:
        """The cluster hash slot of `key`, written in the client's encoding."""
        return int(key_slot(key.encode(*self._encoding)))

    @property
    def library(self) -> ClientLibrary:
        """The client's library: redis-py, or valkey-py."""
        return self._library

    @property
    def encoding(self) -> tuple[str, str]:
        """The client's encoding and its errors handler: how its keys and channels are
        written as bytes (so how a channel's name read back is decoded)."""
        return self._encoding

    @property
    def client(self) -> redis.asyncio.Redis | RedisCluster:
        client = self._client_ref()
        if client is None:  # pragma: no cover - locks keep their client alive
            raise RuntimeError("the redis client of this lock was garbage-collected")
        return client

    @property
    def sentinel(self) -> bool:
        """Whether the client is a Sentinel-managed one (`Sentinel.master_for`)."""
        return self.transport.sentinel

    async def master_moved(self, pubsub: PubSub) -> bool:
        """Whether `pubsub`'s connection is open to a server that the Sentinels no longer
        name as the master (False for a client without Sentinel, or if no Sentinel answered
        in time)."""
        return await self.transport.master_moved(pubsub)

    @property
    def health_interval(self) -> float:
        """The client's redis-py `health_check_interval` (seconds; 0 if unset)."""
        return float(self.transport.connection_kwargs.get("health_check_interval") or 0)

    async def run(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[str | int],
        options: CallOptions,
    ) -> Any:
        """Run one script in one round trip (two the first time a server sees it, unless
        `by_text`: sent as EVAL with its text, which runs even on a server that does not
        know it yet, for a call that must be applied in one send).

        How the call is made is `options`' (`_transport.call_options`, each option
        described there). User-initiated calls go through the user's client, `background`
        ones through aiolock's own connections, `fresh` ones on a connection of their own
        (with a cluster client, to the node serving the first key's slot). With
        `again_apart`, a call sent again after a broken connection (or its EVAL after a
        NOSCRIPT) goes on a connection of its own, closed after: for a call that may
        outlive its caller (a quorum's node), whose user may close the client meanwhile
        (sent again on the user's pool, it would open a connection nobody closes). Every
        call made in a task that aiolock started with `detached` is made so. With `wait`,
        the reply is `(the script's reply, how many replicas acknowledged its writes)`:
        the WAIT follows on the same connection, in the same round trip.

        A cluster runs each script's variant that publishes on shard channels
        (`_lua.cluster`), chosen here without asking the server. While the slot migrates,
        a try in flight at the bound may end first, for up to MIGRATION_GRACE; not with
        `grace=False` (a call whose caller's timeout must hold: it ends at its bound).
        """
        if self.transport.cluster:
            script = for_cluster(script)
        by_text, wait, fresh = options.by_text, options.wait, options.fresh
        timeout, operation, name = options.timeout, options.operation, options.name
        on_sent, grace, background = options.on_sent, options.grace, options.background
        command: Command = (
            ("EVAL", script.source, len(keys), *keys, *args)
            if by_text
            else ("EVALSHA", script.sha, len(keys), *keys, *args)
        )
        then: Command | None = None
        if wait is not None:
            replicas, wait_ms = wait
            assert wait_ms >= 1, "WAIT 0 blocks for ever"
            then = ("WAIT", replicas, wait_ms)
        if fresh:
            client = self._own_client(keys[0] if keys else None)
            try:
                return await self._call(
                    client,
                    command,
                    script=script,
                    timeout=timeout,
                    operation=operation,
                    name=name,
                    on_sent=on_sent,
                    then=then,
                    grace=grace,
                )
            finally:
                await _close_own(client)
        target = self.transport.script_client(background=background)
        if target is None:  # the transport lends a client for each call (a cluster's own)
            call = functools.partial(
                self._call,
                command=command,
                script=script,
                timeout=timeout,
                operation=operation,
                name=name,
                on_sent=on_sent,
                then=then,
                grace=grace,
            )
            reply = await self.transport.call_on(call, background=background)
        else:
            reply = await self._call(
                target,
                command,
                script=script,
                timeout=timeout,
                operation=operation,
                name=name,
                on_sent=on_sent,
                then=then,
                again=(
                    functools.partial(self._own_client, keys[0] if keys else None)
                    if options.again_apart or _DETACHED.get()
                    else None
                ),
                grace=grace,
            )
        if then is not None:
            return reply[0], int(reply[1])
        return reply

    async def run_each(
        self,
        script: Script,
        calls: Sequence[tuple[Sequence[str], Sequence[str | int]]],
        *,
        timeout: float,
        operation: str,
        split: Callable[[Sequence[str], Sequence[str | int]], list[Call]] | None = None,
    ) -> list[Any]:
        """Several calls of one script on a cluster, each with its own keys (of one slot),
        in one round trip per node (redis-py's cluster pipeline) on aiolock's own cluster
        client, bounded by `timeout` as a whole; their replies, in order.

        A call the pipeline could not complete (a node that does not know the script, a
        MOVED or ASK that the pipeline of older redis-py versions does not follow, a broken
        connection to a node that failed) is sent again on its own, concurrently with the
        others, through the cluster client, which follows redirections and finds a failed
        node's successor. Every script is safe to apply twice. A call of several keys that
        its slot's migration refuses (TRYAGAIN: some of them moved, some not) is sent as
        the calls `split` makes of it, one key each (which the migration redirects, never
        refuses), their replies put together, if `split` is given.
        """
        return await self.transport.run_each(
            for_cluster(script) if self.transport.cluster else script,
            calls,
            call=self._call,
            send_once=self._send_once,
            timeout=timeout,
            operation=operation,
            split=split,
        )

    @contextlib.asynccontextmanager
    async def node_client(self, key: str) -> AsyncIterator[redis.asyncio.Redis]:
        """A client of the one server holding `key`: the user's client, or for a cluster, a
        client of its own to the node serving `key`'s slot, closed on exit (to read a
        primitive's keys in one MULTI/EXEC with the server's TIME)."""
        async with self.transport.node_clients(key) as (client,):
            yield client

    @contextlib.asynccontextmanager
    async def primary_clients(self) -> AsyncIterator[list[redis.asyncio.Redis]]:
        """A client of each primary: the user's client alone, or for a cluster one client
        of aiolock's own per primary (to scan every node), closed on exit."""
        async with self.transport.node_clients(None) as clients:
            yield clients

    async def command(
        self,
        *command: str | int,
        timeout: float,
        operation: str,
        name: str | None,
        again_apart: bool = False,
    ) -> Any:
        """One plain command on the client's server, bounded by `timeout` (a broken
        connection's retry included, whatever retries the client has of its own), its
        errors translated; with `again_apart`, sent again on a connection of its own (a
        call that may outlive its caller: see `run`)."""
        return await self._call(
            self.client,
            command,
            script=None,
            timeout=timeout,
            operation=operation,
            name=name,
            again=functools.partial(self._own_client, None) if again_apart else None,
        )

    async def exists(self, key: str, *, timeout: float, name: str) -> bool:
        reply = await self._call(
            self.client,
            ("EXISTS", key),
            script=None,
            timeout=timeout,
            operation="inspect",
            name=name,
        )
        return bool(reply)

    def _own_client(self, key: str | None) -> redis.asyncio.Redis:
        """A client on a pool of its own, to the server that serves `key` (its connections
        are the caller's to close)."""
        return self._library.client(connection_pool=self.transport.connection_pool(key))

    async def _call(
        self,
        client: Client,
        command: Command,
        *,
        script: Script | None,
        timeout: float,
        operation: str,
        name: str | None,
        on_sent: Sent = None,
        then: Command | None = None,
        send: Callable[[], Awaitable[Any]] | None = None,
        again: Callable[[], redis.asyncio.Redis] | None = None,
        grace: bool = True,
    ) -> Any:
        """Send `command` (an EVALSHA of `script`, sent by EVAL if the server does not know
        it), and `then` right after it if given, bounded by `timeout`, with its errors
        translated. `send`, if given, sends instead (and `command` is not sent).

        When the timeout falls due, the event loop first reads whatever has arrived (the
        loop may have been blocked while the reply came): a reply already there is used.

        A broken connection (a pooled connection the server closed, after a restart for
        example) is retried once at once on a new one: every script is safe to apply twice.
        With `again`, the retries, and the EVAL of a script the server did not know, go on
        the client it makes, whose connections are closed when the call ends.

        Cancellation:
            A cancellation that arrives while the reply is being read propagates. On Python
            3.11, redis-py's socket timeout (`asyncio.wait_for`) can swallow a cancellation
            that lands just as a send completes; it is detected here by the task's cancel
            count and re-raised, so a cancelled acquire never turns into a granted lease.
        """
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - asyncio always runs coroutines in a task
            raise RuntimeError("aiolock must be used from an asyncio task")
        cancelling = task.cancelling()
        bound = self._deadlines.start(task, timeout, grace=grace)
        apart: redis.asyncio.Redis | None = None
        try:
            retried = False
            while True:
                try:
                    if send is not None:
                        result = await send()
                    elif again is None:
                        result = await self._send_once(client, command, script, on_sent, then)
                    else:

                        def elsewhere() -> Client:
                            nonlocal apart, client
                            if apart is None:
                                client = apart = again()
                            return apart

                        result = await self._send_once(
                            client, command, script, on_sent, then, elsewhere=elsewhere
                        )
                    break
                except Errors.connection:
                    if (retried and not self.transport.retries_broken) or bound.overdue:
                        raise
                    # Sent again on a new connection (every script is safe to apply twice):
                    # once, at once; on a cluster, as often as it takes within the bound,
                    # after a pause (a failover, or redis-py's cluster client closing every
                    # connection of a client that met many redirections while a slot
                    # migrates, other calls' included).
                    if retried:
                        await bound.pause()
                    retried = True
                    if again is not None and apart is None:
                        client = apart = again()
                except (*Errors.try_again, *Errors.cluster_failure) as exc:
                    if not self.transport.waits_out(exc):
                        raise
                    # The slot migrates, a name's keys on both sides: nothing was applied,
                    # and it will be once the migration ends. Wait within the bound.
                    if bound.overdue:
                        raise backend_error(operation, name, timeout, exc) from exc
                    bound.waiting_out = True
                    bound.refused = exc
                    await bound.pause()
                    bound.refused = None
            bound.answered = True
        except asyncio.CancelledError as exc:
            if bound.expired and task.uncancel() <= cancelling:
                if bound.refused is not None:
                    # Out of time between two tries, every one refused: not applied.
                    refused = bound.refused
                    raise backend_error(operation, name, timeout, refused) from refused
                timed_out = TimeoutError()
                raise self._failed(operation, name, timeout, timed_out, bound) from exc
            raise
        except Errors.any as exc:
            if bound.expired:
                task.uncancel()  # our timer's cancellation, turned into this error on the way
                timed_out = TimeoutError()
                raise self._failed(operation, name, timeout, timed_out, bound) from exc
            if task.cancelling() > cancelling:
                # The caller's cancellation, swallowed on the way (redis-py's wait_for on
                # Python 3.11) and turned into this error: it must not be lost.
                raise asyncio.CancelledError from exc
            raise self._failed(operation, name, timeout, exc, bound) from exc
        finally:
            self._deadlines.end(bound)
            if apart is not None:
                await _close_own(apart)
        if bound.expired:
            task.uncancel()  # our timer's cancellation, swallowed: the answer came anyway
        if task.cancelling() > cancelling:
            raise asyncio.CancelledError
        return result

    def _failed(
        self,
        operation: str,
        name: str | None,
        timeout: float,
        error: BaseException,
        bound: _Bound,
    ) -> BackendError:
        """The `BackendError` for a call that failed with `error`; one that met a migrating
        slot, or failed while a slot of this cluster was migrating (its redirections make
        redis-py's cluster client close its connections, and find the nodes again), is
        marked as such (see `migrating`)."""
        failed = backend_error(operation, name, timeout, error)
        if self.transport.during_migration(bound.waiting_out):
            DURING_MIGRATION.add(failed)
        if bound.stalled >= STALL_NOTICED:  # it fell due while the loop did not run
            STALLED[failed] = bound.stalled
        return failed

    async def _send_once(
        self,
        client: Client,
        command: Command,
        script: Script | None,
        on_sent: Sent,
        then: Command | None,
        *,
        elsewhere: Callable[[], Client] | None = None,
    ) -> Any:
        """Send `command` (and `then`); an EVALSHA the server does not know (flushed, or
        lost in a restart) is sent again as EVAL, which also caches the script, on the
        client `elsewhere` gives if given (a call that may outlive its caller takes no
        second connection from the user's pool, which the user may have closed since)."""
        try:
            return await self._send(client, command, on_sent, then)
        except Errors.noscript as exc:
            if script is None:
                raise
            # Drop its traceback: redis-py's frame in it holds the error (a cycle only the
            # cycle collector frees), and from Python 3.12 on its frames keep their callers
            # alive, with the lease an acquire returned.
            exc.__traceback__ = None
            source = script.source
        # Sent once the error is no longer being handled: a client that keeps the exception
        # being handled (fakeredis's Lua bridge does on Python 3.12+) would keep it forever.
        if elsewhere is not None:
            client = elsewhere()
        return await self._send(client, ("EVAL", source, *command[2:]), on_sent, then)

    @staticmethod
    def refused(error: BaseException) -> bool:
        """Whether the server answered with an error (ACL, OOM, READONLY...), as opposed to
        a connection that broke or did not answer."""
        return not outcome_unknown(error)

    async def close_background_client(self) -> None:
        """Close the renewal connections; called when no lease needs renewing. (aiolock's
        own cluster client closes by itself once idle.)"""
        await self.transport.close_background()

    def new_pubsub(self) -> PubSub:
        """A pub/sub session on a connection of its own (on a cluster, to a primary other
        than the previous session's)."""
        return self.transport.new_pubsub()


_KINDS: dict[type[Any], Callable[[Any], Backend]] = {}


def backend_kind(source: type[Any], make: Callable[[Any], Backend]) -> None:
    """A kind of source of calls that is not a redis client (a Redlock's `Quorum`) has its
    backends made by `make`: the module that defines it says so."""
    _KINDS[source] = make


def open_backend(client: Any) -> Backend:
    """The backend of `client`: a redis client's `Backend`, or what its kind makes."""
    return _KINDS.get(type(client), Backend)(client)


async def _close_own(client: redis.asyncio.Redis) -> None:
    """Close the connections of a client aiolock made for one call: a failure to close them
    (a socket already gone) changes nothing of the call's outcome, which it must not hide."""
    with contextlib.suppress(Exception):
        await client.connection_pool.disconnect()
