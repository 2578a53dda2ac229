"""Leader election: terms won in order, announced, renewed, lost and handed over; the leader
as `leader()` reads it and as observers see it change; client-go's callbacks.

Each client stands for a process (its own notifier and wait queue id); fakeredis's share
one server.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Self

import pytest
import redis.asyncio

from aiolock import (
    ConfigError,
    Election,
    EventKind,
    Leader,
    LeaseLostError,
    Lock,
    LossReason,
    Term,
)
from aiolock._engine.runtime import runtime_for
from aiolock._lua.election import EL_ANNOUNCE, EL_PROCLAIM, LOG_KEPT, stored_value
from aiolock._transport.call_options import CallOptions

from ..conftest import CommandLog, make_client
from ..deployments.proxy import FaultProxy
from ..support.load import scaled
from ..support.recorded import recorded
from ..support.servers import RedisServer
from ..support.waits import eventually, until_cancelled, within


def described(leader: Leader | None) -> tuple[str, str | None] | None:
    """A leader as the tests compare them: who, and the value proclaimed."""
    return None if leader is None else (leader.identity, leader.value)


class Observer:
    """Everything one `observe()` yields, in order, in a task of its own."""

    def __init__(self, election: Election) -> None:
        self.seen: list[Leader | None] = []
        self._changes = election.observe()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        first = await within(anext(self._changes), what="the observer's first leader")
        self.seen.append(first)
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        async for leader in self._changes:
            self.seen.append(leader)

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._changes.aclose()

    @property
    def described(self) -> list[tuple[str, str | None] | None]:
        return [described(leader) for leader in self.seen]

    async def saw(self, count: int, what: str) -> None:
        await eventually(lambda: len(self.seen) >= count, what=f"{what} ({self.seen})")


async def first_term(election: Election, **kwargs: str | None) -> Term:
    """The first term `election` wins (the caller's to resign; its campaign is closed)."""
    async with contextlib.aclosing(election.campaign(**kwargs)) as terms:
        return await within(anext(terms), what=f"{election.identity} to win a term")


async def candidates_queued(client: redis.asyncio.Redis, election: Election, count: int) -> None:
    async def enough() -> bool:
        return await client.zcard(election.key + ":queue") >= count

    await eventually(enough, what=f"{count} candidate(s) queued in Redis", interval=0.001)


# --------------------------------------------------------------------------- one candidate
async def test_a_term_is_announced_with_its_identity_value_and_number(
    client: redis.asyncio.Redis, name: str
) -> None:
    election = Election(client, name, ttl=10, identity="host-a:1234")
    assert await election.leader() is None
    with recorded(where=lambda event: event.name == name) as events:
        async with contextlib.aclosing(election.campaign(value="http://host-a:8080")) as terms:
            async for term in terms:
                async with term:
                    leader = await election.leader()
                    assert leader is not None
                    assert (leader.identity, leader.value) == ("host-a:1234", "http://host-a:8080")
                    assert leader.fencing_token == term.fencing_token == term.lease.fencing_token
                    assert leader.since == term.since and leader.name == name
                    await term.proclaim("http://host-a:9090")
                    assert described(await election.leader()) == (
                        "host-a:1234",
                        "http://host-a:9090",
                    )
                    await term.proclaim(None)
                    assert described(await election.leader()) == ("host-a:1234", None)
                break
    assert await election.leader() is None
    kinds = [event.kind for event in events]
    assert kinds.count(EventKind.TERM_WON) == 1 and kinds.count(EventKind.TERM_RESIGNED) == 1
    won = next(event for event in events if event.kind is EventKind.TERM_WON)
    assert won.fencing_token == term.fencing_token and won.wait is not None


async def test_the_loop_campaigns_again_after_each_term_and_terms_increase(
    client: redis.asyncio.Redis, name: str
) -> None:
    election = Election(client, name, ttl=10)
    numbers: list[int] = []
    async with contextlib.aclosing(election.campaign()) as terms:
        async for term in terms:
            async with term:
                numbers.append(term.fencing_token)
            if len(numbers) == 3:
                break
    assert numbers == sorted(set(numbers)) and len(numbers) == 3


async def test_a_term_left_unused_is_resigned_before_the_next_campaign(
    client: redis.asyncio.Redis, name: str
) -> None:
    election = Election(client, name, ttl=10)
    async with contextlib.aclosing(election.campaign()) as terms:
        first = await anext(terms)  # never entered
        second = await within(anext(terms), what="a second term")
        assert first.lease.released and second.fencing_token > first.fencing_token
        await second.resign()
        await second.resign()  # again: nothing
    assert await election.leader() is None


async def test_leaving_the_loop_leaves_the_term_to_the_caller(
    client: redis.asyncio.Redis, name: str
) -> None:
    election = Election(client, name, ttl=10)
    terms = election.campaign()
    term = await anext(terms)
    await terms.aclose()
    assert term.held
    assert described(await election.leader()) == (election.identity, None)
    async with term:
        pass
    assert await election.leader() is None


async def test_leaving_the_loop_while_waiting_leaves_nothing_queued(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    leader = await first_term(Election(clients[0], name, ttl=10))
    candidate = Election(clients[1], name, ttl=10)
    terms = candidate.campaign()
    waiting = asyncio.create_task(anext(terms))
    await candidates_queued(clients[0], candidate, 1)
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    await terms.aclose()
    assert await clients[0].zcard(candidate.key + ":queue") == 0
    await leader.resign()


async def test_a_task_holding_a_term_cannot_campaign_again(
    client: redis.asyncio.Redis, name: str
) -> None:
    election = Election(client, name, ttl=10)
    term = await first_term(election)
    try:
        async with term:
            with pytest.raises(RuntimeError, match="already held by this task"):
                await anext(election.campaign())
    finally:
        await term.resign()


# --------------------------------------------------------------------------- candidates
async def test_candidates_are_served_in_order_and_a_resign_hands_over_at_once(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    elections = [Election(c, name, ttl=10, identity=f"c{i}") for i, c in enumerate(clients)]
    leader = await first_term(elections[0])
    order: list[str] = []
    numbers = [leader.fencing_token]

    async def candidate(election: Election) -> None:
        async with contextlib.aclosing(election.campaign()) as terms:
            async for term in terms:
                async with term:
                    order.append(election.identity)
                    numbers.append(term.fencing_token)
                    assert described(await election.leader()) == (election.identity, None)
                break

    tasks = []
    for i in (3, 1, 2):
        tasks.append(asyncio.create_task(candidate(elections[i])))
        await candidates_queued(clients[0], elections[0], len(tasks))
    await leader.resign()
    await within(asyncio.gather(*tasks), what="every candidate to lead in turn")
    assert order == ["c3", "c1", "c2"]
    assert numbers == sorted(numbers) and len(set(numbers)) == 4


@pytest.mark.real_only
async def test_a_resign_hands_the_term_over_with_one_notification(
    server_url: str, name: str
) -> None:
    """The next candidate, waiting, takes the term from the release's notification: no
    acquire of its own, only the grant's renewal and its announcement."""
    log = CommandLog()
    a, b = make_client(server_url), make_client(server_url, log)
    try:
        second = Election(b, name, ttl=10, identity="b")
        warm = await first_term(second)  # b's scripts loaded
        await warm.lease.extend()
        await warm.resign()
        first = await first_term(Election(a, name, ttl=10, identity="a"))
        second_terms = second.campaign()
        waiting = asyncio.create_task(anext(second_terms))
        await candidates_queued(a, second, 1)
        mark = log.mark()
        await first.resign()
        taken = await within(waiting, what="b to take over")
        # The grant's renewal goes by the script's text (a server without it runs it too).
        assert log.since(mark) == Counter({"EVAL renew_holder": 1, "EVALSHA el_announce": 1})
        assert taken.fencing_token > first.fencing_token
        await second_terms.aclose()
        await taken.resign()
    finally:
        await a.aclose()
        await b.aclose()


@pytest.mark.real_only
async def test_a_candidate_whose_term_ended_before_its_announcement_gets_no_term(
    server: RedisServer, name: str
) -> None:
    """B wins, but its announcement is held on its way while B's term expires and A wins and
    announces: when B's announcement arrives, the record stays A's and B's campaign yields
    no term (it campaigns again)."""
    proxy = await FaultProxy(server.port).start()
    a, b = make_client(server.url), make_client(proxy.url)
    stale = Election(b, name, ttl=10, identity="b")
    campaign = stale.campaign()
    announcing: asyncio.Task[Term] | None = None
    try:
        held = proxy.hold_requests(EL_ANNOUNCE.sha.encode())
        announcing = asyncio.create_task(anext(campaign))
        await within(held.wait(), what="b's announcement held on its way")
        await a.delete(stale.key)  # b's term expired
        term_a = await first_term(Election(a, name, ttl=10, identity="a"))
        with recorded(EventKind.LOST, where=lambda event: event.name == name) as lost:
            await proxy.restore()
            await eventually(
                lambda: announcing is not None and (announcing.done() or bool(lost)),
                what="b's announcement answered",
            )
        assert not announcing.done(), f"a term yielded to b: {announcing.result()}"
        assert described(await stale.leader()) == ("a", None)
        announcing.cancel()  # (b waits for its next term)
        await asyncio.gather(announcing, return_exceptions=True)
        await term_a.resign()
    finally:
        if announcing is not None and not announcing.done():
            announcing.cancel()
            await asyncio.gather(announcing, return_exceptions=True)
        await campaign.aclose()
        await proxy.restore()
        await a.aclose()
        await b.aclose()
        await proxy.aclose()


# --------------------------------------------------------------------------- loss
async def test_a_lost_term_cancels_the_leaders_work(client: redis.asyncio.Redis, name: str) -> None:
    election = Election(client, name, ttl=scaled(1.0))
    terms = election.campaign()
    term = await within(anext(terms), what="a term")
    with (
        recorded(EventKind.TERM_LOST, where=lambda event: event.name == name) as lost,
        pytest.raises(LeaseLostError) as caught,
    ):
        async with term:
            await client.delete(election.key)  # the term is gone from Redis
            await until_cancelled(what="the lost term's work")
    assert caught.value.reason is LossReason.NOT_OWNER and caught.value.body_completed is False
    assert term.lost and [event.fencing_token for event in lost] == [term.fencing_token]
    with pytest.raises(LeaseLostError):
        await term.proclaim("late")
    # The campaign goes on: the next term is a new one.
    again = await within(anext(terms), what="the next term")
    assert again.fencing_token > term.fencing_token
    await terms.aclose()
    await again.resign()


async def test_proclaiming_after_the_term_ended_in_redis_is_refused(
    client: redis.asyncio.Redis, name: str
) -> None:
    election = Election(client, name, ttl=10)
    term = await first_term(election)
    await client.delete(election.key)
    with pytest.raises(LeaseLostError):
        await term.proclaim("mine")
    assert term.lost
    assert await election.leader() is None


async def test_a_late_copy_of_a_proclamation_changes_nothing(
    client: redis.asyncio.Redis, name: str
) -> None:
    election = Election(client, name, ttl=10)
    term = await first_term(election, value="v0")
    await term.proclaim("v1")
    await term.proclaim("v2")
    keys = [election.key, election.key + ":log"]
    backend = runtime_for(client).backend
    for number, value in ((1, "v1"), (2, "v2")):  # copies of both, arriving late
        reply = await backend.run(
            EL_PROCLAIM, keys, [term.lease.token, stored_value(value), number],
            CallOptions(timeout=5, operation="proclaim", name=name),
        )  # fmt: skip
        assert int(reply[0]) == 1
    assert described(await election.leader()) == (election.identity, "v2")
    assert await client.xlen(election.key + ":log") == 3  # won, v1, v2
    await term.resign()


# --------------------------------------------------------------------------- observers
async def test_observers_see_every_change_in_order(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    watcher = Election(clients[0], name, ttl=10, identity="watcher")
    a = Election(clients[1], name, ttl=10, identity="a")
    b = Election(clients[2], name, ttl=10, identity="b")
    async with Observer(watcher) as observer:
        term_a = await first_term(a, value="a0")
        await term_a.proclaim("a1")
        waiting = asyncio.create_task(first_term(b, value="b0"))
        await candidates_queued(clients[0], b, 1)
        await term_a.resign()
        term_b = await within(waiting, what="b to take over")
        await term_b.resign()
        await observer.saw(6, "six changes")
    assert observer.described == [None, ("a", "a0"), ("a", "a1"), None, ("b", "b0"), None]
    terms = [leader.fencing_token for leader in observer.seen if leader is not None]
    assert terms == [term_a.fencing_token] * 2 + [term_b.fencing_token]


async def test_an_observer_sees_a_dead_leaders_term_end_without_a_message(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """A term that expires sends nothing: the observer reads the record again when the
    term would have expired, and sees that nobody leads."""
    election = Election(clients[1], name, ttl=scaled(0.5), identity="dies")
    async with Observer(Election(clients[0], name, identity="watcher")) as observer:
        term = await first_term(election)
        await observer.saw(2, "the leader")
        # Its key goes without a word, as when its process died and the term expired
        # (an expiry set here instead races the leader's live watchdog: a renewal that
        # lands before the key expires keeps the term).
        await clients[1].delete(election.key)
        await observer.saw(3, "the end of its term")
        assert observer.described == [None, ("dies", None), None]
        with pytest.raises(LeaseLostError):
            await term.resign()


async def test_an_expired_term_is_logged_as_ended_before_the_next_one(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """The leader dies while another candidate waits; the candidate wins at the expiry,
    long before the observer would read the record again (at the dead term's 30 s): the
    observer is told of the end of the dead term, then of the new one."""
    a = Election(clients[1], name, ttl=30, identity="a")
    b = Election(clients[2], name, ttl=10, identity="b")
    async with Observer(Election(clients[0], name, identity="watcher")) as observer:
        term_a = await first_term(a)
        await observer.saw(2, "a's term")  # (read with its expiry 30 s away)
        await clients[1].pexpire(a.key, 300)  # a dies: its term expires in 0.3 s
        term_b = await first_term(b)
        await eventually(
            lambda: described(observer.seen[-1]) == ("b", None),
            what=f"b's term observed ({observer.seen})",
        )
        assert observer.described == [None, ("a", None), None, ("b", None)]
    with pytest.raises(LeaseLostError):
        await term_a.resign()
    await term_b.resign()


async def test_a_late_resignation_does_not_end_the_next_leaders_term(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """A's term expires (its process paused past the ttl), B wins and announces, then A's
    resignation arrives: B's term goes on, recorded and logged as B's."""
    a = Election(clients[1], name, ttl=10, identity="a")
    b = Election(clients[2], name, ttl=10, identity="b")
    term_a = await first_term(a)
    await clients[1].pexpire(a.key, 1)  # a's term expires, a not knowing it yet

    async def expired() -> bool:
        return not await clients[1].exists(a.key)

    await eventually(expired, what="a's term expired")
    term_b = await first_term(b)
    async with Observer(Election(clients[0], name, identity="watcher")) as observer:
        with pytest.raises(LeaseLostError):
            await term_a.resign()  # late: the term is b's
        assert described(await b.leader()) == ("b", None)
        await term_b.proclaim("after")  # a change after the resignation's, if it made one
        await observer.saw(2, "b's proclamation")
        assert observer.described == [("b", None), ("b", "after")]
    log = (await b._read("0-0")).changes
    assert [c.event for c in log if c.fencing_token == term_b.fencing_token] == ["won", "value"]
    await term_b.resign()


@pytest.mark.real_only
async def test_an_observer_misses_no_change_while_its_connection_is_down(
    server: RedisServer, name: str
) -> None:
    """Changes published while the observer's pub/sub connection was being replaced are
    read from the log once it is subscribed again."""
    a, b, c = make_client(server.url), make_client(server.url), make_client(server.url)
    try:
        async with Observer(Election(a, name, identity="watcher")) as observer:
            notifier = runtime_for(a).notifier
            assert await b.client_kill_filter(_type="pubsub") >= 1
            # Changes come while it reconnects (its backoff starts at 50 ms)...
            term_b = await first_term(Election(b, name, identity="b"), value="b0")
            await term_b.proclaim("b1")
            await term_b.resign()
            term_c = await first_term(Election(c, name, identity="c"))
            await observer.saw(5, "every change, once subscribed again")
            assert observer.described == [None, ("b", "b0"), ("b", "b1"), None, ("c", None)]
            assert notifier.running
            await term_c.resign()
    finally:
        for client in (a, b, c):
            await client.aclose()


async def test_an_observer_further_behind_than_the_log_sees_the_leader_now(
    client: redis.asyncio.Redis, name: str
) -> None:
    """More changes than the log keeps came while the observer was not reading: it gives
    the leader as it is now, not a change older than the ones it gave before."""
    election = Election(client, name, ttl=10)
    changes = election.observe()
    assert await anext(changes) is None
    term = await first_term(election, value="0")
    for i in range(1, LOG_KEPT + 10):
        await term.proclaim(str(i))
    now = await within(anext(changes), what="the leader now")
    assert described(now) == (election.identity, str(LOG_KEPT + 9))
    await term.proclaim("last")
    later = await within(anext(changes), what="the next change")
    assert described(later) == (election.identity, "last")
    await changes.aclose()
    await term.resign()


# --------------------------------------------------------------------------- callbacks
async def test_client_go_callbacks(clients: list[redis.asyncio.Redis], name: str) -> None:
    calls: list[str] = []
    started = asyncio.Event()
    stop = asyncio.Event()

    async def on_started_leading(term: Term) -> None:
        calls.append(f"started {term.identity}")
        started.set()
        await stop.wait()

    def on_stopped_leading() -> None:
        calls.append("stopped")

    async def on_new_leader(identity: str) -> None:
        calls.append(f"leader {identity}")

    election = Election(clients[0], name, ttl=scaled(1.0), identity="me")
    run = asyncio.create_task(
        election.run(
            on_started_leading,
            on_stopped_leading=on_stopped_leading,
            on_new_leader=on_new_leader,
        )
    )
    await within(started.wait(), what="on_started_leading")
    await eventually(lambda: "leader me" in calls, what="on_new_leader")
    # A lost term: on_started_leading is cancelled, on_stopped_leading called, and the
    # candidate campaigns again (a new term, a new leader).
    started.clear()
    await clients[1].delete(election.key)
    await within(started.wait(), what="a second term", timeout=scaled(20))
    await eventually(lambda: calls.count("leader me") == 2, what="the second term observed")
    stop.set()
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run
    assert calls[:4] == ["started me", "leader me", "stopped", "started me"] or calls[:4] == [
        "leader me", "started me", "stopped", "started me",
    ]  # fmt: skip
    assert await election.leader() is None


# --------------------------------------------------------------------------- input
async def test_bad_arguments_are_refused_before_anything_is_sent(
    client: redis.asyncio.Redis, commands: CommandLog, name: str
) -> None:
    mark = commands.mark()
    with pytest.raises(TypeError, match="identity must be a str"):
        Election(client, name, identity=b"me")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="identity must be 1 to 1000 characters") as error:
        Election(client, name, identity="")
    assert error.value.argument == "identity"
    with pytest.raises(ConfigError, match="ttl"):
        Election(client, name, ttl=0)
    with pytest.raises(ConfigError, match="name"):
        Election(client, "")
    election = Election(client, name)
    with pytest.raises(ConfigError, match="value must be 0 to 65536 characters"):
        await anext(election.campaign(value="x" * 65537))
    with pytest.raises(TypeError, match="on_started_leading must be callable"):
        await election.run(None)  # type: ignore[arg-type]
    assert commands.since(mark) == Counter()


# --------------------------------------------------------------------------- counts
@pytest.mark.real_only
async def test_what_a_term_costs(server: RedisServer, name: str) -> None:
    """Commands the server runs (scripts' own included): a term won and announced, a
    proclamation, a resignation, a read of the leader."""
    from .test_commands import commandstats

    client = make_client(server.url)
    try:
        warm = Election(client, f"{name}:warm-up")
        term = await first_term(warm)
        await term.proclaim("x")
        await term.resign()
        await warm.leader()
        election = Election(client, name, ttl=30)
        spent = []
        for step in ("win", "proclaim", "resign", "read"):
            before = commandstats(await client.info("commandstats"))
            if step == "win":
                term = await first_term(election)
            elif step == "proclaim":
                await term.proclaim("v")
            elif step == "resign":
                await term.resign()
            else:
                await election.leader()
            after = commandstats(await client.info("commandstats"))
            spent.append(after - before - Counter({"info": 1}))
    finally:
        await client.aclose()
    win, proclaim, resign, read = spent
    assert win == Counter(
        evalsha=2, hmget=2, time=2, hset=2, pexpire=2, xrevrange=1, xadd=1, publish=1
    ), win
    assert proclaim == Counter(
        evalsha=1, hmget=1, hset=1, xrevrange=1, xadd=1, pexpire=1, publish=1
    ), proclaim
    assert resign == Counter(
        evalsha=1, hmget=2, hdel=2, xrevrange=1, xadd=1, pexpire=1, publish=1
    ), resign
    assert read == Counter(evalsha=1, hmget=1, pttl=1, xrevrange=1), read


async def test_elections_and_locks_do_not_share_keys(
    client: redis.asyncio.Redis, name: str
) -> None:
    assert Election(client, name).key != Lock(client, name).key
    assert Election(client, name).key == f"aiolock:el:{{{name}}}"


@pytest.mark.real_only
async def test_a_watch_is_told_when_its_subscription_is_lost_and_made_again(
    server: RedisServer, name: str
) -> None:
    """What an observer relies on after a lost connection: its watch is told when the
    connection goes, and again once the channel is subscribed on the new one (a change
    published in between is then read from the log)."""
    client = make_client(server.url)
    try:
        notifier = runtime_for(client).notifier
        watch = notifier.watch(f"{name}:changed")
        try:
            await notifier.watch_ready(watch)
            assert watch.subscribed.is_set() and not await watch.wait(0)
            assert await client.client_kill_filter(_type="pubsub") == 1
            await eventually(lambda: not watch.subscribed.is_set(), what="the connection lost")
            assert await watch.wait(0)  # told when it went
            await within(watch.subscribed.wait(), what="subscribed again")
            assert await watch.wait(0)  # told when it came back
            await client.publish(f"{name}:changed", "x")
            assert await within(watch.wait(None), what="a message")
        finally:
            notifier.unwatch(watch)
    finally:
        await client.aclose()
