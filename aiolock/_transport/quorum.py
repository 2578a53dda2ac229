"""A backend made of several backends: a `Redlock`'s independent servers, as one.

`Quorum` is the "client" of a Redlock (its N clients; `runtime_for` gives it a runtime of
its own, whose backend is a `QuorumBackend`). `QuorumBackend.run` sends each script call to
every node at once, each bounded by the node timeout and the call's own bound, and decides
as soon as a quorum (N // 2 + 1) for or against is known: a slow or frozen node does not
delay the answer (its call goes on in the background, bounded, and is never cancelled
midway). What a quorum of replies means is the rule the call's options name
(`CallOptions.votes`, from `_model.quorum_rules`, where a Redlock's rules are): the rule says
when the call is decided and what the replies give back; this module sends, waits, writes
an agreed fencing token back when the rule asks for a second phase (and a late grant's,
in the background), gives a refused acquire back under a shield before answering (on
every node it reached, for up to the rule's bound on those that did not answer), and
raises what no quorum decided. It knows no script.

When too many nodes failed for either side to reach a quorum, `QuorumError` names each
node and what it answered (marked when a stall of this process spent every node's time).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import random
import weakref
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Final, cast

import redis.asyncio
from redis.asyncio.client import PubSub

from .._aio.eager_start import start_task
from .._aio.shielding import run_shielded
from .._lua.lock import Script
from .._model.quorum_rules import Rule, Verdict, Votes
from ..errors import BackendError, QuorumError
from .backend import Backend, backend_kind
from .base import Sent
from .call_options import CallOptions
from .clients import AsyncClient, lasting, mark_stalled
from .direct import DirectTransport
from .quorum_pubsub import QuorumPubSub

__all__ = ("Quorum", "QuorumBackend", "Votes", "curable", "node_name")

GIVE_BACK_MIN: Final = 0.1
"""Shortest time a refused acquire's give-back waits for a quorum of nodes to answer (it
goes on in the background after that)."""
Ended = Callable[[Any, "BaseException | None"], None]
"""Told how a node's call ended: its reply, or the error it raised (`_Node.run`)."""

UNANSWERED_AFTER: Final = 0.2
"""Seconds a node may leave its oldest call in flight unanswered, while other nodes answer
calls sent after it, before new calls skip it (see `_Node`); at most half the node
timeout."""
HEALTH_INTERVAL: Final = 2.0
"""Seconds of silence on a node's pub/sub session before it is pinged (as the notifier's)."""


def node_name(client: AsyncClient) -> str:
    """How a node is named in messages: "host:port" (or the socket path)."""
    kwargs = cast(redis.asyncio.Redis, client).connection_pool.connection_kwargs
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


class Quorum:
    """The clients of a `Redlock`'s independent servers, and the bound of each node's call:
    one runtime (one watchdog, one set of pub/sub sessions) for every Redlock over them.

    Held with the first client (as long as it lives, the same clients and node timeout
    give the same quorum, so a Redlock made per request finds its runtime); it holds the
    clients weakly, as a `Backend` does: the Redlocks hold them.
    """

    __slots__ = ("__weakref__", "_refs", "names", "node_timeout", "quorum")

    def __init__(self, clients: Sequence[AsyncClient], node_timeout: float) -> None:
        self._refs = tuple(weakref.ref(client) for client in clients)
        self.names = tuple(node_name(client) for client in clients)
        self.node_timeout = node_timeout
        self.quorum = len(clients) // 2 + 1

    @property
    def clients(self) -> tuple[AsyncClient, ...]:
        clients = tuple(ref() for ref in self._refs)
        if any(client is None for client in clients):  # pragma: no cover - held by Redlocks
            raise RuntimeError("a redis client of this Redlock was garbage-collected")
        return cast(tuple[AsyncClient, ...], clients)

    def uses(self, client: object) -> bool:
        """Whether `client` is one of its clients."""
        return any(ref() is client for ref in self._refs)

    @classmethod
    def of(cls, clients: Sequence[AsyncClient], node_timeout: float) -> Quorum:
        """The quorum of these clients (the same object for the same clients and timeout)."""
        known = _known.get(clients[0])
        if known is None:
            known = _known[clients[0]] = {}
        key = (tuple(id(client) for client in clients), node_timeout)
        quorum = known.get(key)
        if quorum is None or any(
            ref() is not client for ref, client in zip(quorum._refs, clients, strict=True)
        ):
            quorum = known[key] = cls(clients, node_timeout)
        return quorum


_known: weakref.WeakKeyDictionary[AsyncClient, dict[tuple[Any, ...], Quorum]] = (
    weakref.WeakKeyDictionary()
)


class _Node:
    """What a quorum knows of one node's answers: its calls in flight (by when each was
    sent) and the send time of the latest call it answered.

    A node whose oldest call in flight has waited UNANSWERED_AFTER (at most half the node
    timeout) while another node answered a call sent after it is frozen or cut off: new
    calls skip it (counted as its error) until it answers; once its calls have failed
    unanswered (each within the node timeout), one call at a time probes it. So a frozen
    node does not gather a connection and a timer per call. An event loop that was held
    up delays every node alike, and marks none; and no call skips so many nodes that fewer
    than a quorum are left.

    Whether a failed call came after the latest answer is read from the order the calls
    were sent in (their numbers), not from their send times: a loop's clock may tick in
    milliseconds (uvloop's does), so a call sent right after an answered one often has the
    same send time, and a failure of it would otherwise go unrecorded. A call cancelled
    from outside (not by its own bound, which fails it as a timeout) says nothing of the
    node and is not recorded.
    """

    __slots__ = ("answered", "failed", "first_failed", "in_flight", "last_answered", "sent")

    def __init__(self) -> None:
        self.in_flight: dict[int, float] = {}
        self.answered = -math.inf  # when the latest call it answered was sent
        self.failed = -math.inf  # when the first call that failed unanswered since was sent
        self.sent = 0
        self.last_answered = 0  # the number of the latest call it answered (in send order)
        self.first_failed = 0  # the number of the first call that failed unanswered since

    @property
    def failing(self) -> bool:
        """Whether a call sent after the latest one it answered failed unanswered (timed
        out, connection lost): the node is not answering now."""
        return self.first_failed > self.last_answered

    def in_doubt(self, now: float, patience: float) -> bool:
        """Whether `unanswered_since` may name a time (a quick test: the calls are in flight
        in the order they were sent, so the first is the oldest)."""
        if self.first_failed > self.last_answered:
            return True
        return bool(self.in_flight) and now - next(iter(self.in_flight.values())) >= patience

    def unanswered_since(self, now: float, patience: float) -> float | None:
        """Since when the node has not answered: the oldest call in flight, if it has
        waited `patience`; or, while a call is in flight, the earliest call that failed
        unanswered (timed out, connection lost) after its last answer: one call at a time
        then probes it."""
        if not self.in_flight:
            return None
        oldest = min(self.in_flight.values())
        if self.failing:
            return min(self.failed, oldest)
        return oldest if now - oldest >= patience else None

    async def run(self, call: Awaitable[Any], sent_at: float, ended: Ended | None = None) -> Any:
        """`call`'s reply, its outcome counted for the node's health, then told to `ended`
        (its reply, or the error it raises) in the same step: whoever waits for a quorum
        hears it without a further turn of the loop."""
        self.sent += 1
        number = self.sent
        self.in_flight[number] = sent_at
        try:
            reply = await call
        except BaseException as exc:
            if not isinstance(exc, BackendError):
                pass
            elif Backend.refused(exc):  # an answer all the same
                self._record_answer(number, sent_at)
            elif number > self.last_answered and not self.failing:
                self.failed, self.first_failed = sent_at, number
            del self.in_flight[number]
            if ended is not None:
                ended(None, exc)
            raise
        del self.in_flight[number]
        self._record_answer(number, sent_at)
        if ended is not None:
            ended(reply, None)
        return reply

    def _record_answer(self, number: int, sent_at: float) -> None:
        self.answered = max(self.answered, sent_at)
        self.last_answered = max(self.last_answered, number)


class QuorumBackend(Backend):
    """The `Backend` of a `Quorum`: each call to every node, decided by a quorum."""

    __slots__ = ("_background", "_health", "names", "node_timeout", "nodes", "size")

    def __init__(self, quorum: Quorum) -> None:  # no client of its own: no super().__init__
        self.loop = asyncio.get_running_loop()
        # Not the quorum itself: it is this runtime's key among the runtimes (held weakly),
        # and a reference to it here would keep both alive, and the connections they hold,
        # for as long as the process lives. What the calls need of it is copied.
        self.size, self.node_timeout, self.names = quorum.quorum, quorum.node_timeout, quorum.names
        self.nodes = [Backend(client) for client in quorum.clients]
        for node in self.nodes:
            if isinstance(node.transport, DirectTransport):
                node.transport.sharing.enabled = False  # (see `Sharing.enabled`)
        self._health = [_Node() for _ in self.nodes]
        self._library = self.nodes[0].library
        self._background: set[asyncio.Task[Any]] = set()

    # ----------------------------------------------------------------- what the runtime reads
    @property
    def sees_writes(self) -> bool:
        return False

    @property
    def cluster(self) -> bool:
        return False

    @property
    def sentinel(self) -> bool:
        return False

    @property
    def encoding(self) -> tuple[str, str]:
        return self.nodes[0].encoding

    @property
    def health_interval(self) -> float:
        return min(node.health_interval or HEALTH_INTERVAL for node in self.nodes)

    async def master_moved(self, pubsub: PubSub) -> bool:
        return False

    def new_pubsub(self) -> PubSub:
        pubsub = QuorumPubSub(self.nodes, self.health_interval, random.Random(), quorum=self.size)
        return cast(PubSub, pubsub)

    async def close_background_client(self) -> None:
        await asyncio.gather(*(node.close_background_client() for node in self.nodes))

    # ----------------------------------------------------------------- calls
    async def run(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[str | int],
        options: CallOptions,
    ) -> Any:
        """Run `script` on every node: what a quorum said, in the script's reply format on one
        node (module docstring); each node's call is sent again apart (it may outlive this one)."""
        assert options.wait is None, "a Redlock takes no replicas"
        if options.votes is None:
            raise AssertionError(f"{script.name}: a quorum's call needs the rule of its votes")
        return await _Call(self, script, keys, args, options, rule=options.votes).decide()

    @property
    def patience(self) -> float:
        """How long a node may leave a call unanswered before it is skipped (`_Node`)."""
        return min(self.node_timeout / 2, UNANSWERED_AFTER)

    def hopeful(self, indexes: Collection[int], answered: Collection[int]) -> int:
        """How many of the nodes `indexes` (whose calls are in flight) may still answer in
        time: not those skipped as unanswering, nor those whose calls failed unanswered
        (timed out, connection lost) since their last answer, unless they are among
        `answered`, or unless that would leave fewer than a quorum."""
        skipped = self.unanswering(self.loop.time())
        doubtful = {i for i, node in enumerate(self._health) if i in skipped or node.failing}
        if len(self._health) - len(doubtful) < self.size:
            return len(indexes)
        return sum(1 for i in indexes if i in answered or i not in doubtful)

    def in_doubt(self) -> bool:
        """Whether a node may be in doubt (`hopeful` counts fewer than every call in flight):
        one whose call failed unanswered since its last answer, or whose oldest call in
        flight has waited `patience`. A quick test, true whenever `hopeful` would doubt."""
        now, patience = self.loop.time(), self.patience
        return any(node.in_doubt(now, patience) for node in self._health)

    def unanswering(self, now: float) -> dict[int, float]:
        """The nodes to skip, and for how long each has left a call unanswered while another
        node answered a later one; none if fewer than a quorum would be left (see
        `_Node`)."""
        patience = self.patience
        silent: dict[int, float] = {}
        for index, node in enumerate(self._health):
            since = node.unanswered_since(now, patience)
            if since is not None and any(
                other.answered > since for i, other in enumerate(self._health) if i != index
            ):
                silent[index] = now - since
        if len(self._health) - len(silent) < self.size:
            return {}
        return silent

    def send(
        self, index: int, call: Awaitable[Any], sent_at: float, ended: Ended | None = None
    ) -> asyncio.Task[Any]:
        """A task running `call` on node `index`, its answer counted for its health and told
        to `ended`; started eagerly where asyncio does it (`start_task`)."""
        return start_task(self.loop, self._health[index].run(call, sent_at, ended))

    def keep(self, task: asyncio.Task[Any]) -> None:
        """Let a node's call go on after the quorum decided (bounded by its own timeout)."""
        self._background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        _retrieve(task)  # a late node's failure is of no consequence

    async def spread(
        self,
        send: Callable[[int, Backend, float], Awaitable[Any]],
        decided: Callable[[Votes, int], bool],
        *,
        bound: float,
        operation: str,
        name: str | None,
        answered: Collection[int] = (),
        late: dict[int, asyncio.Task[Any]] | None = None,
    ) -> tuple[Votes, dict[int, BaseException]]:
        """Send a call to every node (`send(index, node, timeout)`, bounded by the node
        timeout and `bound`); return the replies and the errors once `decided(replies,
        hopeful)` (`hopeful`: the calls in flight that may still be answered in time) or
        every node is done. The calls still in flight then go on in the background; `late`,
        if given, is filled with them (by node index). A node that is not answering is
        skipped (see `_Node`), and a call in flight to one is not waited for, unless it is
        one of `answered` (it answered an earlier phase of the same call)."""
        now = self.loop.time()
        timeout = max(min(bound, self.node_timeout), 0.001)
        tasks: dict[int, asyncio.Task[Any]] = {}
        errors: dict[int, BaseException] = {}
        replies: Votes = {}
        pending: set[int] = set()  # the nodes whose calls are in flight
        waiter: asyncio.Future[None] | None = None
        unexpected: list[BaseException] = []

        def settled() -> bool:
            # Decided, counting every call in flight; or counting only those that may still
            # be answered in time (fewer: decided sooner), which takes longer to find out
            # (and is the same count while no node is in doubt).
            if decided(replies, len(pending)):
                return True
            return self.in_doubt() and decided(replies, self.hopeful(pending, answered))

        def ended(index: int, reply: Any, error: BaseException | None) -> None:
            # Each node's call, as it ends (until the spread returns): its reply or error
            # counted, and the spread woken once the replies decide it.
            if index not in pending:
                return  # (ended after the spread returned: left to the background)
            pending.discard(index)
            if error is None:
                replies[index] = reply
            elif isinstance(error, BackendError):
                errors[index] = error
            else:
                unexpected.append(error)
            if (
                waiter is not None
                and not waiter.done()
                and (unexpected or not pending or settled())
            ):
                waiter.set_result(None)

        unanswering = self.unanswering(now) if self.in_doubt() else {}
        for index, node in enumerate(self.nodes):
            silent = None if index in answered else unanswering.get(index)
            if silent is not None:  # frozen or cut off: not sent (see `_Node`)
                errors[index] = BackendError(
                    f"{operation} of {name!r}: not sent, the server has not answered for "
                    f"{silent:.3g}s while the others do",
                    operation=operation,
                    name=name,
                )
                continue
            pending.add(index)
            tasks[index] = self.send(
                index, send(index, node, timeout), now, functools.partial(ended, index)
            )
        try:
            while pending and not unexpected and not settled():
                # A quorum answered without a decision (a split vote): the rest are waited
                # for, but a node that stops answering meanwhile no longer counts, so the
                # wait is looked at again after `patience`.
                waiter = self.loop.create_future()
                split = len(replies) >= self.size
                timer = self.loop.call_later(self.patience, _wake, waiter) if split else None
                try:
                    await waiter
                finally:
                    if timer is not None:
                        timer.cancel()
            if unexpected:
                raise unexpected[0]
        finally:
            for index, task in tasks.items():
                if index in pending:
                    self.keep(task)
                else:  # done: `ended` is told in its call's last step
                    _retrieve(task)  # (counted through `ended`; taken, or asyncio logs it)
            if late is not None:
                late.update((index, tasks[index]) for index in pending)
            pending = set()  # (a call ending now is the background's)
        return replies, errors

    def no_quorum(
        self,
        what: str,
        replies: Votes,
        errors: dict[int, BaseException],
        word: Callable[[Any], str],
        *,
        operation: str,
        name: str | None,
    ) -> QuorumError:
        """The `QuorumError` of a call no quorum decided: each node's reply (`word`), error
        or "not awaited"; the first lasting error (else the first) as its cause."""
        names = self.names
        nodes = {names[i]: word(reply) for i, reply in replies.items()}
        nodes.update({names[i]: f"error: {error}" for i, error in errors.items()})
        for node in names:
            nodes.setdefault(node, "not awaited")
        listed = ", ".join(f"{node}: {said}" for node, said in nodes.items())
        failed = QuorumError(
            f"{operation} of {name!r}: {what}, {self.size} of {len(names)} nodes needed ({listed})",
            operation=operation,
            name=name,
            quorum=self.size,
            nodes=nodes,
            errors={names[i]: error for i, error in sorted(errors.items())},
        )
        causes = sorted(errors.items(), key=lambda item: (not lasting(item[1]), item[0]))
        if causes:
            failed.__cause__ = causes[0][1]
        mark_stalled(failed, errors.values(), tolerated=len(names) - self.size)
        return failed


backend_kind(Quorum, QuorumBackend)


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def curable(error: QuorumError) -> bool:
    """Whether sending the call again may decide it: the nodes whose error would be the
    same again (`lasting`: a wrong type, a permission, a script error) leave a majority
    that failed for passing reasons (no reply in time, a connection refused or reset)."""
    lasting_ones = sum(1 for failed in error.errors.values() if lasting(failed))
    return len(error.nodes) - lasting_ones >= error.quorum


class _Call:
    """One script call on every node of a quorum, and the reading of their votes."""

    __slots__ = (
        "args",
        "backend",
        "background",
        "bound",
        "fresh",
        "name",
        "names",
        "operation",
        "rule",
        "script",
        "started",
        "written",
    )

    def __init__(
        self,
        backend: QuorumBackend,
        script: Script,
        keys: Sequence[str],
        args: Sequence[str | int],
        options: CallOptions,
        *,
        rule: Rule,
    ) -> None:
        self.backend, self.rule = backend, rule
        self.script, self.names, self.args = script, keys, args
        self.bound, self.operation, self.name = options.timeout, options.operation, options.name
        self.background, self.fresh = options.background, options.fresh
        self.started = backend.loop.time()
        self.written: set[int] = set()  # nodes the call was written to (or handed to redis-py)

    @property
    def quorum(self) -> int:
        return self.backend.size

    def left(self) -> float:
        return self.bound - (self.backend.loop.time() - self.started)

    async def gather(
        self,
        decided: Callable[[Votes, int], bool],
        script: Script | None = None,
        args: Sequence[str | int] | None = None,
        answered: Collection[int] = (),
        late: dict[int, asyncio.Task[Any]] | None = None,
    ) -> tuple[Votes, dict[int, BaseException]]:
        """The call (or `script` with `args`, on the same keys) on every node, within what
        is left of its bound, decided as `QuorumBackend.spread` says."""

        def send(index: int, node: Backend, timeout: float) -> Awaitable[Any]:
            return node.run(
                script or self.script,
                self.names,
                self.args if args is None else args,
                self.node_options(
                    timeout,
                    # (the first phase's: a node it reached may apply it however late)
                    on_sent=None if script else functools.partial(self.written.add, index),
                ),
            )

        return await self.backend.spread(
            send,
            decided,
            bound=self.left(),
            operation=self.operation,
            name=self.name,
            answered=answered,
            late=late,
        )

    def node_options(self, timeout: float, on_sent: Sent = None) -> CallOptions:
        """The options of the call on one node, bounded by `timeout`: sent again apart, as
        it may outlive its caller (`QuorumBackend.keep`)."""
        return CallOptions(
            timeout=timeout,
            operation=self.operation,
            name=self.name,
            background=self.background,
            fresh=self.fresh,
            again_apart=True,
            on_sent=on_sent,
        )

    def failed(
        self,
        what: str,
        replies: Votes,
        errors: dict[int, BaseException],
        word: Callable[[Any], str],
    ) -> QuorumError:
        return self.backend.no_quorum(
            what, replies, errors, word, operation=self.operation, name=self.name
        )

    # ----------------------------------------------------------------- the votes
    async def decide(self) -> Any:
        """The call on every node, decided by its rule: the answer in the script's reply
        format on one node; a fencing token written back first, and a refused acquire given
        back, when the rule's verdict says so."""
        rule, q = self.rule, self.quorum
        late: dict[int, asyncio.Task[Any]] | None = {} if rule.fences else None
        replies, errors = await self.gather(self.decided_by(rule), late=late)
        fence = None
        try:
            reply = await self.settle(rule.verdict(replies, q, len(self.names)), replies, errors)
            fence = rule.granted_token(reply) if rule.fences else None
            return reply
        finally:
            for index, call in (late or {}).items():
                call.add_done_callback(functools.partial(self.granted_late, index, fence))

    def decided_by(self, rule: Rule) -> Callable[[Votes, int], bool]:
        """`rule`'s test of whether the replies so far decide the call."""
        return functools.partial(rule.decided, quorum=self.quorum, keys=len(self.names))

    async def settle(
        self, verdict: Verdict, replies: Votes, errors: dict[int, BaseException]
    ) -> Any:
        """Act on the verdict of the first replies: the agreed fencing token written back (a
        second phase), a refused acquire given back; the answer, or the `QuorumError`."""
        # Reached, unanswered (not refused): it may apply the acquire when it answers again.
        reached = self.written - replies.keys()
        unknown = {i for i in reached if not (i in errors and Backend.refused(errors[i]))}
        if verdict.fence is not None:
            # Written to every node; those that granted are waited for whatever their health.
            phase = self.rule.fence_call(self.args, verdict.fence)
            fence_replies, fence_errors = await self.gather(
                self.decided_by(phase.votes), phase.script, phase.args, verdict.granted
            )
            acked = phase.votes.verdict(fence_replies, self.quorum, len(self.names))
            if acked.failure is None:
                return verdict.reply
            await self.give_back(set(verdict.granted), unknown)
            raise self.failed(acked.failure, fence_replies, fence_errors, phase.votes.said)
        if verdict.give_back:
            await self.give_back(set(verdict.granted), unknown)
        if verdict.failure is not None:
            raise self.failed(verdict.failure, replies, errors, self.rule.said)
        return verdict.reply

    def granted_late(self, index: int, fence: int | None, call: asyncio.Task[Any]) -> None:
        """A node's call that ended after the quorum decided: if it granted the lease under a
        fencing token of its own (higher, when its clock had passed the proposal), the agreed
        one `fence` is written to it (`write_fence`), rather than at the first renewal."""
        if fence is None or call.cancelled() or call.exception() is not None:
            return
        token = self.rule.granted_token(call.result())
        if token is not None and token != fence:
            backend = self.backend
            backend.keep(backend.loop.create_task(self.write_fence(index, fence)))

    async def write_fence(self, index: int, fence: int) -> None:
        """The agreed fencing token written to a node that granted late. In the background,
        within the node timeout; token-guarded (a late copy changes nothing once the lease
        is gone). On a connection of its own, closed when the call ends: the call starts
        after its caller returned, maybe after the user closed the client (a call on it
        would connect its pool again, and nobody would close that)."""
        node = self.backend.nodes[index]
        phase = self.rule.fence_call(self.args, fence)
        options = CallOptions(
            timeout=self.backend.node_timeout, operation=self.operation, name=self.name, fresh=True
        )
        sent = node.run(phase.script, self.names, phase.args, options)
        with contextlib.suppress(BackendError):
            await self.backend.send(index, sent, self.backend.loop.time())

    async def give_back(self, granted: set[int], unknown: Collection[int] = ()) -> None:
        """Undo a refused acquire on every node, under a shield, as the rule says (an abort
        that also refuses a late copy of the acquire; nothing for a rule that gives nothing
        back). Waits for the nodes that granted it to answer (within the call's bound, at
        least GIVE_BACK_MIN); the others get it in the background, within their node
        timeout, but for those `unknown` (the acquire reached them, unanswered: frozen,
        say), which are given the rule's bound (the ttl), so that an acquire they apply
        when they answer again is undone there too (the abort comes after it, or refuses
        it)."""
        undo = self.rule.give_back(self.args)
        if undo is None:
            return

        def send(index: int, node: Backend, timeout: float) -> Awaitable[Any]:
            bound = undo.bound if index in unknown else timeout
            return node.run(undo.script, self.names, undo.args, self.node_options(bound))

        def decided(replies: Votes, pending: int) -> bool:
            return granted <= replies.keys()

        backend, answered = self.backend, granted | set(unknown)
        spread = backend.spread(
            send, decided, bound=self.left(), operation=self.operation, name=self.name,
            answered=answered,
        )  # fmt: skip
        with contextlib.suppress(BackendError, TimeoutError):
            await run_shielded(spread, timeout=max(self.left(), GIVE_BACK_MIN))
