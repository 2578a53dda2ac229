"""Redlock on five real servers: the quorum's acquire, fencing, renewal, release, waiting."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

import pytest
import redis.asyncio

from aiolock import (
    AcquireTimeoutError,
    Busy,
    ConfigError,
    EventKind,
    Lease,
    LeaseLostError,
    LockEvent,
    LossReason,
    OnceStatus,
    QuorumError,
    Redlock,
    add_listener,
    locked,
    run_once,
)
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys
from aiolock._lua.lease import RENEW
from aiolock._lua.redlock import RL_ACQUIRE, RL_RELEASE
from aiolock._model.holder import text
from aiolock._model.quorum_rules import Rule, Verdict, Votes
from aiolock._transport.call_options import CallOptions
from aiolock._transport.quorum import Quorum, QuorumBackend

from ..support.load import scaled
from ..support.pools import SlowToConnect
from ..support.recorded import dispatched_in, recorded
from ..support.servers import (
    RedisServer,
    ServerBinary,
    clients_of,
    connections_named,
    independent_servers,
    quorum_calls_ended,
)
from ..support.waits import eventually, until_cancelled, within

NODES = 5


@pytest.fixture(scope="module")
def servers(binaries: list[ServerBinary]) -> Iterator[list[RedisServer]]:
    """Five independent servers, shared by this module's tests (each test uses names of
    its own, and resumes what it pauses)."""
    with independent_servers(binaries[0], NODES) as started:
        yield started


@pytest.fixture
async def nodes(servers: list[RedisServer]) -> AsyncIterator[list[redis.asyncio.Redis]]:
    async with clients_of(servers) as clients:
        try:
            yield clients
        finally:
            await quorum_calls_ended(clients)


def key_of(name: str) -> str:
    return LockKeys.build("aiolock", name, "rl:").lock


async def fields(client: redis.asyncio.Redis, name: str) -> dict[str, str]:
    raw = await client.hgetall(key_of(name))
    return {text(k): text(v) for k, v in raw.items()}


async def holders(nodes: list[redis.asyncio.Redis], name: str) -> list[str | None]:
    """The token each node holds the name under (None: not held there)."""
    return [(await fields(node, name)).get("token") for node in nodes]


@contextlib.contextmanager
def paused(server: RedisServer) -> Iterator[None]:
    server.pause()
    try:
        yield
    finally:
        server.resume()


async def test_async_with_holds_every_node_and_releases_them(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    lock = Redlock(nodes, name, ttl=5)
    assert lock.quorum == 3 and len(lock.nodes) == NODES
    assert not await lock.locked() and await lock.info() is None
    async with lock as lease:
        # The fencing token agreed by the quorum is written back to every node.
        await eventually(
            lambda: _all_hold(nodes, name, lease.token),
            what="every node holds the lease (the slowest one answers last)",
        )
        await eventually(
            lambda: _all_fenced(nodes, name, lease.fencing_token),
            what="every node holds the agreed fencing token (a node that granted late, with "
            "its own clock, gets the agreed one at the next renewal)",
        )
        assert await lock.locked()
        info = await lock.info()
        assert info is not None and info.holder is not None
        assert info.holder.fencing_token == lease.fencing_token and info.free == 0
        assert [n.holder is not None for n in info.nodes] == [True] * NODES
    assert lease.released
    await eventually(
        lambda: _none_hold(nodes, name), what="every node released (the last in the background)"
    )
    assert not await lock.locked()


async def _all_hold(nodes: list[redis.asyncio.Redis], name: str, token: str) -> bool:
    return await holders(nodes, name) == [token] * len(nodes)


async def _equal(values: Awaitable[list[int]], expected: list[int]) -> bool:
    return await values == expected


async def _all_fenced(nodes: list[redis.asyncio.Redis], name: str, fence: int) -> bool:
    return [int((await fields(node, name)).get("fence", -1)) for node in nodes] == [fence] * len(
        nodes
    )


async def _none_hold(nodes: list[redis.asyncio.Redis], name: str) -> bool:
    return await holders(nodes, name) == [None] * len(nodes)


async def test_fencing_tokens_increase_across_different_majorities(
    servers: list[RedisServer], nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """The counter-example of the maximum over each majority's counters: node 0 far
    ahead. The first lease is granted by {0, 1} (node 2 frozen), the next by {1, 2} (node 0
    frozen): without the agreed token written back to node 1, the second would be lower.
    The second starts once every call of the first has ended: a call still unanswered
    then (a loaded machine's) has the quorum skip its node, and with node 0 frozen too,
    no majority is left."""
    three = nodes[:3]
    ahead = 4 * 10**15  # far ahead of the clocks, yet exact in Lua (below 2**53)
    await three[0].hset(key_of(name), mapping={"n": ahead, "fence": ahead})
    with paused(servers[2]):
        async with Redlock(three, name, ttl=5, node_timeout=2) as first:
            pass
    assert first.fencing_token > ahead
    await quorum_calls_ended(three)
    with paused(servers[0]):
        async with Redlock(three, name, ttl=5, node_timeout=2) as second:
            pass
    assert second.fencing_token > first.fencing_token


async def test_a_busy_lock_names_its_holder_and_times_out(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    async with Redlock(nodes, name, ttl=10) as lease:
        other = Redlock(nodes, name, ttl=10)
        busy = await other.try_acquire_or_busy()
        assert isinstance(busy, Busy)
        assert busy.holder is not None and busy.holder.fencing_token == lease.fencing_token
        assert busy.retry_after is not None and 0 < busy.retry_after <= 10
        with pytest.raises(AcquireTimeoutError) as caught:
            await asyncio.create_task(other.acquire(timeout=0.2))  # another task waits
        assert caught.value.holder is not None
        assert await other.try_acquire() is None
    # Nothing of the refused attempts is left on any node.
    await eventually(lambda: _none_hold(nodes, name), what="every node released")


async def test_a_refused_attempt_is_given_back_where_it_was_granted(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """Held on three of five nodes: the attempt over five is granted by the two others,
    refused by the quorum, and given back on those two."""
    async with Redlock(nodes[:3], name, ttl=10) as lease:
        # Held on all three first: the lease is granted by two of them, and the third's
        # grant may still be on its way (then the attempt over five is granted by it and
        # the two others, a quorum of five disjoint from the first lock's quorum of three).
        await eventually(
            lambda: _holders_are(nodes, name, [lease.token] * 3 + [None, None]),
            what="the lease on its three nodes",
        )
        assert await Redlock(nodes, name, ttl=10).try_acquire() is None
        # (A node that had not answered when the quorum refused gets it in the background.)
        await eventually(
            lambda: _holders_are(nodes, name, [lease.token] * 3 + [None, None]),
            what="the two grants given back",
        )


async def _holders_are(
    nodes: list[redis.asyncio.Redis], name: str, tokens: list[str | None]
) -> bool:
    return await holders(nodes, name) == tokens


async def test_a_waiter_is_woken_by_the_release_not_by_the_expiry(
    servers: list[RedisServer],
    nodes: list[redis.asyncio.Redis],
    name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A waiter of another process is woken by the release's message, not by the key's
    expiry; the message is dispatched in the event loop's callback that received it (no
    hop through the node session's task, nor the notifier's)."""
    dispatched = dispatched_in(monkeypatch)
    lock = Redlock(nodes, name, ttl=30)
    holding = await lock.acquire()
    # The waiter's clients are another process's: its release is not seen here directly.
    elsewhere = [redis.asyncio.Redis.from_url(server.url) for server in servers]
    waiting = Redlock(elsewhere, name, ttl=30)
    answered = 0
    attempt = Redlock._attempt

    async def counted(self: Redlock, *args: Any, **kwargs: Any) -> Any:
        nonlocal answered
        try:
            return await attempt(self, *args, **kwargs)
        finally:
            answered += self is waiting

    monkeypatch.setattr(Redlock, "_attempt", counted)
    waiter = asyncio.create_task(waiting.acquire(timeout=20))
    # Its first attempt is refused (and marks the state: the release will announce
    # itself); its next comes once it has subscribed, and is refused too; then it sleeps
    # until the key would expire, unless a release's message wakes it.
    notifier = runtime_for(waiting._quorum).notifier
    await eventually(
        lambda: answered >= 2 and notifier.is_subscribed(waiting._channel),
        what="the waiter subscribed, and its attempt after subscribing answered",
    )
    assert sum([await _marked(node, name) for node in nodes]) >= lock.quorum
    loop = asyncio.get_running_loop()
    released_at = loop.time()
    await holding.release()
    lease = await within(waiter, what="the waiter, woken by the release")
    # Without the release's message the waiter would sleep until the key's expiry (30 s).
    assert loop.time() - released_at < scaled(5.0)
    assert lease.fencing_token > holding.fencing_token
    messages = {task for kind, task in dispatched if kind == "message"}
    assert messages == {""}, dispatched  # (in no task)
    await lease.release()
    await quorum_calls_ended(elsewhere)
    for client in elsewhere:
        await client.aclose()


async def _marked(node: redis.asyncio.Redis, name: str) -> bool:
    return "w" in await fields(node, name)


async def test_tasks_contending_get_it_one_at_a_time_with_increasing_tokens(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    inside = 0
    tokens: list[int] = []

    async def worker() -> None:
        nonlocal inside
        for _ in range(10):
            # Each node's call may take 2 s (the default, half a second, is less than a
            # loaded machine's stalls): this test is about the order, not the timing.
            async with Redlock(nodes, name, ttl=5, timeout=scaled(30), node_timeout=2.0) as lease:
                inside += 1
                assert inside == 1
                tokens.append(lease.fencing_token)
                await asyncio.sleep(0.001)
                inside -= 1

    await within(
        asyncio.gather(*(worker() for _ in range(6))), what="60 sections", timeout=scaled(60)
    )
    assert len(tokens) == 60 and tokens == sorted(tokens) and len(set(tokens)) == 60


async def test_a_grant_read_past_its_validity_is_given_back_and_tried_again(
    nodes: list[redis.asyncio.Redis], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first acquire's grant is read between ttl - drift and ttl after it was sent (the
    event loop was held meanwhile): a lease from it would be past its deadline already. It
    is given back, and the acquire tries again; the lease it returns is valid."""
    ttl, drift = 1.2, 0.6
    lock = Redlock(nodes, name, ttl=ttl, drift=drift, node_timeout=drift)
    backend = runtime_for(lock._client).backend
    run = type(backend).run
    loop = asyncio.get_running_loop()
    stalls: list[float] = []

    async def read_late(self: Any, script: Any, keys: Any, args: Any, options: Any) -> Any:
        sent_at = loop.time()
        reply = await run(self, script, keys, args, options)
        if self is backend and script is RL_ACQUIRE and not stalls:
            stalls.append(sent_at)
            time.sleep(max(sent_at + ttl - drift / 2 - loop.time(), 0))  # the loop held
        return reply

    monkeypatch.setattr(type(backend), "run", read_late)
    with recorded(EventKind.ACQUIRED, where=lambda event: event.name == name) as acquired:
        lease = await lock.acquire(timeout=10)
    assert lease.held, f"a lease past its deadline was returned: {lease}"
    assert [event.attempts for event in acquired] == [2]
    await lease.release()


async def test_renewal_keeps_the_lease_and_gives_a_node_its_key_back(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    ttl = scaled(0.6)
    # Each node's call may take half the ttl (a loaded machine), and the connections are open.
    lock = Redlock(nodes, name, ttl=ttl, node_timeout=ttl / 2)
    await (await lock.acquire()).release()
    async with lock as lease:
        await eventually(lambda: _all_hold(nodes, name, lease.token), what="every node holds")
        await nodes[4].delete(key_of(name))  # as if the node had restarted empty
        await eventually(
            lambda: _all_hold(nodes, name, lease.token),
            what="the node lost the key and got it back at the next renewal",
            timeout=scaled(5.0),
        )
        assert int((await fields(nodes[4], name))["fence"]) == lease.fencing_token
        assert int((await fields(nodes[4], name))["n"]) >= lease.fencing_token
        await asyncio.sleep(2 * ttl)
        assert lease.held


async def test_a_node_held_by_another_token_is_not_taken_by_the_renewal(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    ttl = scaled(0.6)
    # Each node's call may take half the ttl (a loaded machine), and the connections are open.
    lock = Redlock(nodes, name, ttl=ttl, node_timeout=ttl / 2)
    await (await lock.acquire()).release()
    async with lock as lease:
        await eventually(lambda: _all_hold(nodes, name, lease.token), what="every node holds")
        await nodes[4].hset(key_of(name), "token", "someone-else")
        await nodes[4].pexpire(key_of(name), 60_000)  # (no longer renewed here)
        await asyncio.sleep(scaled(0.6))
        assert (await fields(nodes[4], name))["token"] == "someone-else"
        assert lease.held  # four nodes still renew it


async def test_a_quorum_saying_not_the_owner_loses_the_lease(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    ttl = scaled(0.6)
    # Each node's call may take half the ttl (a loaded machine), and the connections are open.
    lock = Redlock(nodes, name, ttl=ttl, node_timeout=ttl / 2)
    await (await lock.acquire()).release()
    with pytest.raises(LeaseLostError) as caught:
        async with lock as lease:
            await eventually(lambda: _all_hold(nodes, name, lease.token), what="every node")
            for node in nodes[:3]:
                await node.hset(key_of(name), "token", "someone-else")
            await until_cancelled(what="the lease's loss")
    assert caught.value.reason is LossReason.NOT_OWNER


async def test_a_frozen_node_does_not_delay_the_answers(
    servers: list[RedisServer], nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """Each node's call may take 45 % of the ttl: an acquire and a release that waited for
    the frozen node would take that long each, and a renewal that did would be late."""
    ttl, slack = scaled(1.0), scaled(0.4)
    lock = Redlock(nodes, name, ttl=ttl, node_timeout=0.45 * ttl)
    await (await lock.acquire()).release()  # connections open
    await quorum_calls_ended(nodes)  # (released on the fifth node too)
    loop = asyncio.get_running_loop()
    with paused(servers[0]):
        started = loop.time()
        async with lock as lease:
            await asyncio.sleep(ttl * 1.2)  # renewed meanwhile, by four nodes
            assert lease.held
        assert loop.time() - started < ttl * 1.2 + slack


async def test_cancelled_acquires_leave_nothing_held(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    lock = Redlock(nodes, name, ttl=10)
    await (await lock.acquire()).release()
    for turn in range(8):
        task = asyncio.create_task(lock.acquire())
        for _ in range(turn):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            lease = await task
            await lease.release()
    await eventually(lambda: _none_hold(nodes, name), what="every cancelled acquire given back")


async def test_too_many_failing_nodes_is_a_quorum_error(
    binaries: list[ServerBinary], name: str
) -> None:
    servers = [RedisServer(binaries[0]).start() for _ in range(3)]
    clients = [redis.asyncio.Redis.from_url(server.url) for server in servers]
    try:
        servers[1].kill()
        servers[2].kill()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(QuorumError) as caught:
            await Redlock(clients, name, ttl=5, timeout=2).acquire()
        assert loop.time() - started < 2 + scaled(1.0)
        error = caught.value
        assert error.quorum == 2 and len(error.nodes) == 3
        said = sorted(said.split(":")[0] for said in error.nodes.values())
        assert said in (["error", "error", "ok"], ["error", "error", "not awaited"])
        await eventually(
            lambda: _holders_are(clients[:1], name, [None]), what="the one grant given back"
        )
    finally:
        await quorum_calls_ended(clients)
        for client in clients:
            await client.aclose()
        for server in servers:
            server.stop()


async def test_a_failed_node_call_counted_before_the_decision_leaves_no_unretrieved_error(
    binaries: list[ServerBinary], name: str
) -> None:
    """A node whose call fails (here: its server is gone) while the quorum is still being
    decided has its error counted, as the quorum's; its task's exception is taken too, so
    asyncio does not log "Task exception was never retrieved" when the task is collected."""
    servers = [RedisServer(binaries[0]).start() for _ in range(3)]
    clients = [redis.asyncio.Redis.from_url(server.url) for server in servers]
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        servers[2].kill()
        for _ in range(3):
            async with Redlock(clients, name, ttl=5):
                pass
        await quorum_calls_ended(clients)
        gc.collect()
        assert reported == [], [context.get("message") for context in reported]
    finally:
        loop.set_exception_handler(handler)
        await quorum_calls_ended(clients)
        for client in clients:
            await client.aclose()
        for server in servers:
            server.stop()


async def test_force_release_evicts_the_quorum_holder(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    lock = Redlock(nodes, name, ttl=10)
    with pytest.raises(LeaseLostError):
        async with lock as lease:
            await quorum_calls_ended(nodes)  # (held on the fifth node too)
            evicted = await Redlock(nodes, name).force_release()
            assert evicted is not None and evicted.holder.fencing_token == lease.fencing_token
            assert evicted.released == lock.nodes and evicted.unknown == ()
            assert evicted.majority
            assert await _none_hold(nodes, name)
            await lease.extend()
    assert await Redlock(nodes, name).force_release() is None


async def test_force_release_of_a_minority_says_what_it_deleted_and_where(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """A name held on two of the five nodes only (a Redlock over those two): evicted there,
    and said so, with the holder and the two nodes (not "nothing released")."""
    lease = await Redlock(nodes[:2], name, ttl=30).acquire()
    try:
        await quorum_calls_ended(nodes)
        assert await holders(nodes, name) == [lease.token] * 2 + [None] * 3
        lock = Redlock(nodes, name)
        evicted = await lock.force_release()
        assert evicted is not None, "deleted on two nodes, reported as nothing released"
        assert evicted.holder.fencing_token == lease.fencing_token
        assert evicted.released == lock.nodes[:2] and evicted.unknown == ()
        assert not evicted.majority and evicted.quorum == 3
        assert await _none_hold(nodes, name)
        with pytest.raises(LeaseLostError):
            await lease.extend()
    finally:
        with contextlib.suppress(LeaseLostError):
            await lease.release()


async def test_events_report_a_redlock_as_a_lock(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    seen: list[LockEvent] = []
    remove = add_listener(seen.append)
    try:
        async with Redlock(nodes, name, ttl=5) as lease:
            pass
    finally:
        remove()
    kinds = [event.kind for event in seen if event.name == name]
    assert kinds[:1] == [EventKind.ACQUIRED] and EventKind.RELEASED in kinds
    assert seen[0].fencing_token == lease.fencing_token


async def test_bad_input_is_refused_before_anything_is_sent(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    with pytest.raises(TypeError, match="sequence"):
        Redlock(nodes[0], name)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="at least one"):
        Redlock([], name)
    with pytest.raises(ConfigError, match="twice"):
        Redlock([nodes[0], nodes[0]], name)
    with pytest.raises(ConfigError, match="node_timeout"):
        Redlock(nodes, name, ttl=1, node_timeout=0.6)
    with pytest.raises(ConfigError, match="drift"):
        Redlock(nodes, name, ttl=1, drift=-1)
    with pytest.raises(ConfigError, match="replicas"):
        Redlock(nodes, name, replicas=1)
    with pytest.raises(ConfigError, match="hold_stats"):
        Redlock(nodes, name, hold_stats=True)
    with pytest.raises(TypeError, match="unexpected keyword"):
        Redlock(nodes, name, tll=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="token"):
        await Redlock(nodes, name).acquire(token="a" * 32)
    assert await holders(nodes, name) == [None] * NODES


async def test_two_clients_of_one_server_are_refused_naming_both(
    servers: list[RedisServer], nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """Two client objects that address one server (the same host, port and database, or
    the same socket path) would give it two votes: one empty restart would then lose a
    majority. Refused with a `ConfigError` naming both, by every helper that takes a
    Redlock's clients, before anything is sent. Another database of the server, or an
    alias of its host, is an address of its own: not detected (documented)."""
    port = servers[0].port
    again = redis.asyncio.Redis(host="127.0.0.1", port=port)  # nodes[0]'s server, once more
    other_db = redis.asyncio.Redis(host="127.0.0.1", port=port, db=1)
    alias = redis.asyncio.Redis(host="localhost", port=port)
    sockets = [redis.asyncio.Redis(unix_socket_path="/tmp/aiolock-test.sock") for _ in range(2)]
    try:
        with pytest.raises(ConfigError) as caught:
            Redlock([nodes[0], nodes[1], again], name)
        assert caught.value.argument == "clients"
        message = str(caught.value)
        assert "clients[0]" in message and "clients[2]" in message, message
        assert f"127.0.0.1:{port}" in message, message
        with pytest.raises(ConfigError, match=r"clients\[0\].*clients\[1\].*aiolock-test\.sock"):
            Redlock(sockets, name)

        async def job() -> None:
            raise AssertionError("run under a Redlock that counts a server twice")

        with pytest.raises(ConfigError, match="same server"):
            await run_once([again, nodes[1], nodes[0]], name, job, retention=60)
        with pytest.raises(ConfigError, match="same server"):
            locked([nodes[0], again, nodes[1]], name, on_busy="raise")
        Redlock([nodes[0], other_db, nodes[1]], name)  # another database: accepted
        Redlock([nodes[0], alias, nodes[1]], name)  # an alias: not detected
        assert await holders(nodes, name) == [None] * NODES
    finally:
        for client in (again, other_db, alias, *sockets):
            await client.aclose()


async def test_the_default_node_timeout_has_a_floor_that_a_loaded_host_meets(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """A tenth of the ttl, but at least 50 ms (a loaded host answers a call within that),
    and at most half the ttl: a short ttl's tries are not turned into `QuorumError` by a
    20 ms bound."""
    assert Redlock(nodes, name, ttl=10)._quorum.node_timeout == 1.0
    assert Redlock(nodes, name, ttl=0.2)._quorum.node_timeout == 0.05
    assert Redlock(nodes, name, ttl=0.06)._quorum.node_timeout == 0.03
    assert Redlock(nodes, name, ttl=0.2, node_timeout=0.01)._quorum.node_timeout == 0.01


async def test_locked_takes_the_clients_of_a_redlock(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    seen: list[list[str | None]] = []

    @locked(nodes, name + ":{order}", on_busy="raise", timeout=5)
    async def ship(lease: Lease, order: int) -> int:
        seen.append(await holders(nodes, f"{name}:{order}"))
        return lease.fencing_token

    token = await ship(7)
    assert seen[0].count(None) <= NODES - 3  # held by a quorum at least, under one token
    assert len({held for held in seen[0] if held is not None}) == 1
    assert token > 0
    with pytest.raises(ConfigError, match="hold_stats"):
        locked(nodes, name, on_busy="raise", timeout=1, hold_stats=True)


async def test_run_once_over_a_redlock_marks_the_job_done_on_every_node(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    runs: list[int] = []

    async def job(lease: Lease) -> int:
        runs.append(lease.fencing_token)
        return len(runs)

    # One node slow to write: run_once is decided by the others, its marker there comes later.
    await nodes[0].client_pause(500, all=False)  # (CLIENT PAUSE 500 WRITE)
    first = await run_once(nodes, name, job, retention=60)
    again = await run_once(nodes, name, job, retention=60)
    assert first.status is OnceStatus.RAN and first.value == 1
    assert again.status is OnceStatus.ALREADY_DONE and len(runs) == 1
    assert again.marker is not None and again.marker.fencing_token == runs[0]
    done_key = key_of("once:" + name) + ":done"

    async def stored() -> list[int]:
        return [int(await node.exists(done_key)) for node in nodes]

    # Decided on a majority when run_once returned; the rest are written in the background.
    assert sum(await stored()) >= NODES // 2 + 1
    await eventually(lambda: _equal(stored(), [1] * NODES), what="the done marker on every node")


async def test_a_release_refused_by_a_quorum_is_a_lost_lease(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    lease = await Redlock(nodes, name, ttl=10).acquire()
    await eventually(lambda: _all_hold(nodes, name, lease.token), what="every node holds")
    for node in nodes[:3]:
        await node.hset(key_of(name), "token", "someone-else")
    with pytest.raises(LeaseLostError):
        await lease.release()
    # The two nodes still held under the token were released all the same.
    await eventually(
        lambda: _holders_are(nodes, name, ["someone-else"] * 3 + [None, None]),
        what="the two nodes the lease still held released",
    )


async def test_redlocks_made_per_request_share_one_runtime(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """A Redlock per request, as a Lock per request: the quorum (its watchdog, its pub/sub
    sessions) lives with the clients, not with the Redlock objects."""
    first = Redlock(nodes, name)
    quorum = first._quorum
    del first
    gc.collect()
    assert Redlock(nodes, name + ":other")._quorum is quorum
    assert Redlock(nodes, name, node_timeout=0.5)._quorum is not quorum
    assert Redlock(list(reversed(nodes)), name)._quorum is not quorum


async def test_a_quorums_runtime_goes_with_its_clients(
    servers: list[RedisServer], name: str
) -> None:
    """Clients that a Redlock used, closed and dropped leave nothing behind: the quorum's
    runtime (its backends, its watchdog, the connections they hold) is not kept alive by
    the registry of runtimes, whose key it is."""

    async def used_and_closed() -> weakref.ref[Quorum]:
        async with clients_of(servers[:3]) as clients:
            lock = Redlock(clients, name, ttl=5)
            async with lock:
                pass
            await quorum_calls_ended(clients)
            return weakref.ref(lock._quorum)

    quorum = await used_and_closed()
    gc.collect()
    assert quorum() is None, "the quorum (and its runtime) outlived its clients"


async def test_a_node_whose_fencing_token_differs_gets_the_agreed_one_at_the_next_renewal(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """A node that granted late and missed the write-back of the agreed token (its own,
    higher, left in place) is given the agreed one by the next renewal; its counter stays
    where it was."""
    lock = Redlock(nodes, name, ttl=scaled(3.0), node_timeout=scaled(1.0))
    lease = await lock.acquire()
    await quorum_calls_ended(nodes)
    own = lease.fencing_token + 1_000_000
    await nodes[4].hset(key_of(name), mapping={"fence": own, "n": own})
    await eventually(
        lambda: _all_fenced(nodes, name, lease.fencing_token),
        what="the late node's fencing token corrected by a renewal",
    )
    assert int((await fields(nodes[4], name))["n"]) == own
    await lease.release()


@contextlib.asynccontextmanager
async def one_slow_node(
    servers: list[RedisServer], client_name: str | None = None
) -> AsyncIterator[list[redis.asyncio.Redis]]:
    """A client of each server, the last one's new connections 0.5 s slow to open: its
    first call reaches it after the others have decided, its clock past the fencing
    token they agreed on (the proposal's lead is at most 100 ms)."""
    clients = [
        redis.asyncio.Redis.from_url(server.url, client_name=client_name) for server in servers[:-1]
    ]
    clients.append(
        redis.asyncio.Redis.from_url(
            servers[-1].url, connection_class=SlowToConnect, client_name=client_name
        )
    )
    try:
        yield clients
    finally:
        await quorum_calls_ended(clients)
        for client in clients:
            await client.aclose()


async def test_a_node_granting_after_the_quorum_decided_gets_the_agreed_token(
    servers: list[RedisServer], name: str
) -> None:
    """The late node issued a token of its own, higher than the one agreed: once its call
    has ended it holds the agreed one, as every other node, not only after the first
    renewal (ttl/3 later). The write goes on a connection of its own, closed when it ends:
    once the user closed the clients, nothing of theirs is left open on that node."""
    async with one_slow_node(servers, client_name=name) as clients:
        lease = await Redlock(clients, name, ttl=20).acquire()
        try:
            await quorum_calls_ended(clients)
            held = [(await fields(client, name)).get("fence") for client in clients]
            assert held == [str(lease.fencing_token)] * NODES
        finally:
            await lease.release()

    async def closed() -> bool:
        return await connections_named(servers[-1], name) == 0

    # (A connection of aiolock's own would stay until its watchdog had been idle a while.)
    await eventually(
        closed, what="every connection of the closed clients to the slow node", timeout=scaled(1.0)
    )


async def test_a_node_still_answering_after_the_quorum_decided_costs_no_task_of_its_own(
    servers: list[RedisServer], name: str
) -> None:
    """What an acquire leaves running once a quorum decided is the calls of the nodes that
    have not answered (the slow one's, maybe another's), a task each, bounded by the node
    timeout; what its reply may need (the agreed fencing token
    written back) is started when the reply comes, not waited for by a task of its own
    beside it (one more per late node and acquire, which a Redlock over five servers
    made on most acquires)."""
    async with one_slow_node(servers) as clients:
        lock = Redlock(clients, name, ttl=20)
        async with lock:  # the runtime's own tasks started (its watchdog, its sessions)
            pass
        await quorum_calls_ended(clients)
        await clients[-1].connection_pool.disconnect()  # (slow to connect again)
        before = asyncio.all_tasks()
        lease = await lock.acquire()
        try:
            left = [t for t in asyncio.all_tasks() - before if not t.done()]
            backend = runtime_for(lock._quorum).backend
            assert isinstance(backend, QuorumBackend)
            calls = [t for t in left if t.get_coro().__qualname__ == "_Node.run"]  # type: ignore[union-attr]
            assert calls, left  # the slow node's (and a node answering late's)
            assert all(t in backend._background for t in calls), calls
            # (Not the watchdog's, nor its closing of its connections once it had nothing to
            # renew for a while: on a loaded machine that may fall between the two acquires.)
            others = [
                t
                for t in left
                if t not in calls
                and t.get_name() != "aiolock-renewals"
                and t.get_coro().__qualname__ != "Backend.close_background_client"  # type: ignore[union-attr]
            ]
            assert others == [], others
        finally:
            await lease.release()


async def test_another_process_resumes_the_lease_with_a_token_the_quorum_agrees_on(
    servers: list[RedisServer], name: str
) -> None:
    async with one_slow_node(servers) as nodes, contextlib.AsyncExitStack() as stack:
        lease = await Redlock(nodes, name, ttl=20).acquire()
        stack.push_async_callback(lease.release)  # (once released by the resumer: a no-op)
        # Every node has answered the acquire (the slow one after the quorum decided) and
        # holds the agreed token: whichever nodes answer the resume first agree.
        await quorum_calls_ended(nodes)
        elsewhere = [redis.asyncio.Redis.from_url(server.url) for server in servers]
        for client in elsewhere:
            stack.push_async_callback(client.aclose)
        stack.push_async_callback(quorum_calls_ended, elsewhere)
        resumed = await Redlock(elsewhere, name, ttl=20).resume(lease.token)
        stack.push_async_callback(resumed.release)
        assert resumed.held and resumed.fencing_token == lease.fencing_token
        await quorum_calls_ended(elsewhere)
        for node in nodes:
            assert int((await fields(node, name))["fence"]) == resumed.fencing_token
        await resumed.release()
        with pytest.raises(LeaseLostError):
            await Redlock(elsewhere, name, ttl=20).resume(lease.token)


async def test_an_uncontended_cycle_is_one_call_per_node_each_way(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """The proposed fencing token is the one every node issues: the quorum agrees on it
    without writing it back (a second round trip)."""
    lock = Redlock(nodes, name, ttl=10)
    async with lock:
        pass  # (scripts loaded)
    await quorum_calls_ended(nodes)
    for node in nodes:
        await node.config_resetstat()
    async with lock as lease:
        pass
    await quorum_calls_ended(nodes)
    calls = [await _script_calls(node) for node in nodes]
    assert calls == [2] * NODES  # the acquire, the release
    assert lease.fencing_token > 0


async def _script_calls(node: redis.asyncio.Redis) -> int:
    stats = await node.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


async def test_a_frozen_node_is_not_sent_a_call_per_acquire(
    servers: list[RedisServer], nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """Once a node leaves a call unanswered while the others answer later ones, new calls
    skip it (no connection and timer per call piling up) until it answers again."""
    lock = Redlock(nodes, name, ttl=20)  # each node's call bounded by 2 s
    await (await lock.acquire()).release()
    await quorum_calls_ended(nodes)  # (released on the fifth node too)
    backend = runtime_for(lock._client).backend
    assert isinstance(backend, QuorumBackend)
    frozen, healthy = backend._health[0], backend._health[1]
    loop = asyncio.get_running_loop()
    with paused(servers[0]):
        before, healthy_before = frozen.sent, healthy.sent
        until = loop.time() + 1.0  # (within the node timeout: no call of it ended)
        while loop.time() < until:
            async with lock:
                pass
        sent, healthy_sent = frozen.sent - before, healthy.sent - healthy_before
    # The first calls go (until one has waited UNANSWERED_AFTER), then none while frozen.
    assert sent < healthy_sent / 2, (sent, healthy_sent)
    await eventually(lambda: not frozen.in_flight, what="the frozen node's calls ended")
    async with lock:
        pass
    await eventually(lambda: frozen.answered > 0, what="the node answers again once resumed")


async def test_a_release_that_overtakes_its_acquire_on_a_late_node_forbids_it(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """The quorum decides without the slowest node: the release may reach that node on
    another connection before the acquire does. The late acquire must not hold the key
    there for a whole ttl under a token already released."""
    node, key = nodes[0], key_of(name)
    channel = LockKeys.build("aiolock", name, "rl:").channel
    token = "ab" * 16
    released = await node.eval(RL_RELEASE.source, 2, key, channel, token, "", "")
    assert released[0] == 0
    late = await node.eval(RL_ACQUIRE.source, 2, key, channel, token, 10_000, "h 1 t", 60_000, 0)
    assert late == [-1, 0]
    assert await holders([node], name) == [None]


async def test_a_split_vote_is_not_held_up_by_a_node_that_stopped_answering(
    servers: list[RedisServer], nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """Two nodes grant, two are held by someone else, the fifth is frozen and its calls
    have timed out: the refusal is known without waiting for the fifth's bound (2 s)."""
    lock = Redlock(nodes, name, ttl=20)  # each node's call bounded by 2 s
    await (await lock.acquire()).release()
    await quorum_calls_ended(nodes)
    loop = asyncio.get_running_loop()
    with paused(servers[4]):
        await (await lock.acquire()).release()  # granted by four; the fifth's call times out
        backend = runtime_for(lock._client).backend
        assert isinstance(backend, QuorumBackend)
        frozen = backend._health[4]
        await eventually(lambda: frozen.failing, what="the call timed out")
        for node in nodes[:2]:
            await node.hset(key_of(name), mapping={"token": "someone-else", "fence": 1})
            await node.pexpire(key_of(name), 60_000)
        started = loop.time()
        assert await lock.try_acquire() is None
        assert loop.time() - started < 1.0  # not the fifth's 2 s
    await quorum_calls_ended(nodes)


async def test_a_late_copy_of_an_acquire_on_a_node_that_held_and_released_it_is_refused(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """The acquire was granted on every node, then released on every node: a copy of it
    that arrives now (a retry of a call whose reply was lost) must not hold the key again
    under a token already released."""
    lease = await Redlock(nodes, name, ttl=10).acquire()
    await lease.release()
    await quorum_calls_ended(nodes)  # the release applied on every node
    node, key = nodes[0], key_of(name)
    channel = LockKeys.build("aiolock", name, "rl:").channel
    late = await node.eval(
        RL_ACQUIRE.source, 2, key, channel, lease.token, 10_000, "h 1 t", 60_000, 0
    )
    assert late == [-1, 0]
    assert await holders([node], name) == [None]


async def test_locked_at_the_edge_of_the_quorum(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """Three nodes: held by someone else on one of them, an acquire still gets two (a
    quorum), so the lock is not locked; held on two, it is."""
    three = nodes[:3]
    lock = Redlock(three, name, ttl=10)
    first = await Redlock(three[:1], name, ttl=10).acquire()
    assert not await lock.locked()
    mine = await lock.try_acquire()
    assert mine is not None, "an acquire gets the two other nodes"
    await mine.release()
    await quorum_calls_ended(nodes)
    second = await Redlock(three[1:2], name, ttl=10).acquire()
    assert await lock.locked()
    assert await lock.try_acquire() is None
    await first.release()
    await second.release()


async def test_a_renewal_does_not_hold_a_node_again_for_a_token_forbidden_there(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """A node that missed the acquire gets the release first (which forbids the token
    there), then a late renewal of the lease: the renewal, which gives a node that lost
    the key the lease back, must not give it a token already released."""
    node, key = nodes[0], key_of(name)
    channel = LockKeys.build("aiolock", name, "rl:").channel
    token, fence = "cd" * 16, 1_000_000
    released = await node.eval(RL_RELEASE.source, 2, key, channel, token, "", "")
    assert released[0] == 0  # not held here
    renewed = await node.eval(RENEW.source, 1, key, token, 10_000, f"r{fence}")
    assert renewed == [0]
    assert await holders([node], name) == [None]


async def test_a_late_renewal_of_a_released_lease_does_not_hold_a_node_given_back_since(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """A lease's renewal in flight when it was released reaches a node after the release
    (another connection; a NOSCRIPT answer's second round trip), and after a split vote's
    acquire was granted there and given back (aborted): the renewal, which gives a node
    that lost the key the lease back, must not hold it again for the released token (found
    by the simulation, seed 176: the node stayed held by nobody's lease for a ttl)."""
    node, key = nodes[0], key_of(name)
    channel = LockKeys.build("aiolock", name, "rl:").channel
    released_token, other = "ab" * 16, "cd" * 16
    granted = await node.eval(
        RL_ACQUIRE.source, 2, key, channel, released_token, 10_000, "h 1 t", 60_000, 0
    )
    assert granted[0] == 1
    fence = granted[1]
    assert (await node.eval(RL_RELEASE.source, 2, key, channel, released_token, "", ""))[0] == 1
    assert (await node.eval(RL_ACQUIRE.source, 2, key, channel, other, 10_000, "h 1 t", 60_000, 0))[
        0
    ] == 1
    aborted = await node.eval(RL_RELEASE.source, 2, key, channel, other, "abort", "")
    assert aborted[0] == 1
    renewed = await node.eval(RENEW.source, 1, key, released_token, 10_000, f"r{fence}")
    assert renewed == [0]
    assert await holders([node], name) == [None]
    late_acquire = await node.eval(
        RL_ACQUIRE.source, 2, key, channel, other, 10_000, "h 1 t", 60_000, 0
    )
    assert late_acquire == [-1, 0], "the aborted acquire stays refused"


async def test_a_quorum_call_is_decided_by_the_rule_its_options_name(
    nodes: list[redis.asyncio.Redis], name: str
) -> None:
    """The quorum's backend knows no script: a rule of its own, named in the call's
    options, decides the call and makes its answer; a call that names none is refused."""

    class EveryNode(Rule):
        __slots__ = ()

        def decided(self, replies: Votes, pending: int, quorum: int, keys: int) -> bool:
            return pending == 0

        def verdict(self, replies: Votes, quorum: int, keys: int) -> Verdict:
            return Verdict(reply=sorted(replies))

    lock = Redlock(nodes, name)
    backend = runtime_for(lock._client).backend
    args: list[str | int] = ["ab" * 16, 1000, "r"]  # nothing held: nothing renewed
    options = CallOptions(timeout=5.0, operation="renew", name=name, votes=EveryNode())
    assert await backend.run(RENEW, [key_of(name)], args, options) == list(range(len(nodes)))
    without = CallOptions(timeout=5.0, operation="renew", name=name)
    with pytest.raises(AssertionError, match="the rule of its votes"):
        await backend.run(RENEW, [key_of(name)], args, without)
    assert await holders(nodes, name) == [None] * len(nodes)
