"""A term handed to a named successor (`Term.transfer`) and taken back by a new object
(`Election.resume`), also beside candidates of a release before them (rolling upgrade).

Each client stands for a process (its own notifier and wait queue id); fakeredis's share
one server.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import Counter

import pytest
import redis.asyncio

from aiolock import ConfigError, Election, LeaseLostError, LossReason, Term
from aiolock._engine.runtime import runtime_for
from aiolock._lua.election import IDS_SLACK, INFIX
from aiolock._lua.layout import LockKeys
from aiolock._lua.lock import ACQUIRE, acquire_args

from ..conftest import CommandLog, make_client
from ..support.waits import eventually, within
from .test_election import Observer, candidates_queued, described, first_term


class Candidate:
    """A candidate campaigning in a task of its own until it wins one term, which it records
    and resigns at once."""

    def __init__(self, election: Election, order: list[str]) -> None:
        self.election = election
        self.term: Term | None = None
        self._order = order
        self.task = asyncio.create_task(self._campaign())

    async def _campaign(self) -> None:
        async with contextlib.aclosing(self.election.campaign()) as terms:
            async for term in terms:
                async with term:
                    self.term = term
                    self._order.append(self.election.identity)
                break


async def line_up(
    clients: list[redis.asyncio.Redis], name: str, identities: list[str], order: list[str]
) -> list[Candidate]:
    """A candidate per identity (of client 1, 2, ...), queued in Redis in that order."""
    candidates = []
    for i, identity in enumerate(identities, start=1):
        election = Election(clients[i], name, ttl=10, identity=identity)
        candidates.append(Candidate(election, order))
        await candidates_queued(clients[0], election, i)
    return candidates


# --------------------------------------------------------------------------- transfer
async def test_a_transfer_passes_over_the_leaders_own_candidates_that_came_first(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    # The leader's process has a candidate that came before the one named, and that is not
    # in line in Redis when the term is handed over (the grant that made the leader took
    # its process's queue out): the one named gets the term all the same.
    first = await first_term(Election(clients[1], name, ttl=10, identity="first"))
    election = Election(clients[0], name, ttl=10, identity="leader")
    leading = asyncio.create_task(first_term(election))
    await candidates_queued(clients[1], election, 1)
    order: list[str] = []
    own = Candidate(Election(clients[0], name, ttl=10, identity="own"), order)

    def both_waiting() -> bool:
        queue = runtime_for(clients[0]).notifier.queue_for(election._seat._channel)
        return queue is not None and len(queue.waiters) >= 2

    await eventually(both_waiting, what="two candidates waiting in the leader's process")
    successor = Candidate(Election(clients[2], name, ttl=10, identity="successor"), order)
    await candidates_queued(clients[1], election, 2)
    await first.resign()
    leader = await within(leading, what="the leader's term")
    await leader.transfer("successor")
    await within(asyncio.gather(own.task, successor.task), what="every term")
    assert order == ["successor", "own"]


async def test_a_transfer_hands_the_term_to_the_named_candidate_before_those_ahead(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    election = Election(clients[0], name, ttl=10, identity="leader")
    leader = await first_term(election)
    order: list[str] = []
    async with Observer(election) as observer:
        candidates = await line_up(clients, name, ["c1", "c2", "c3"], order)
        await leader.transfer("c3")
        assert not leader.held and not leader.lost
        await within(asyncio.gather(*(c.task for c in candidates)), what="every term")
        await observer.saw(8, "each term won and ended")
    # The successor first, then the others in the order they came.
    assert order == ["c3", "c1", "c2"]
    terms = [c.term for c in candidates]
    assert all(t is not None for t in terms)
    successor = candidates[2].term
    assert successor is not None and successor.fencing_token > leader.fencing_token
    assert observer.described == [
        ("leader", None),
        None,
        ("c3", None),
        None,
        ("c1", None),
        None,
        ("c2", None),
        None,
    ]


@pytest.mark.real_only
async def test_the_successor_takes_the_term_from_the_releases_notification(
    server_url: str, name: str
) -> None:
    """As with a resignation: no acquire of the successor's own, and no expiry waited for;
    the leader sends the successor's move and its release."""
    log_a, log_b = CommandLog(), CommandLog()
    a, b, c = (
        make_client(server_url, log_a),
        make_client(server_url, log_b),
        make_client(server_url),
    )
    try:
        successor = Election(b, name, ttl=10, identity="b")
        warm = await first_term(successor)  # b's scripts loaded
        await warm.lease.extend()
        await warm.resign()
        leading = Election(a, name, ttl=10, identity="a")
        leader = await first_term(leading)
        ahead = Election(c, name, ttl=10, identity="c")
        ahead_terms, successor_terms = ahead.campaign(), successor.campaign()
        ahead_waiting = asyncio.create_task(anext(ahead_terms))
        await candidates_queued(a, leading, 1)
        waiting = asyncio.create_task(anext(successor_terms))
        await candidates_queued(a, leading, 2)
        mark_a, mark_b = log_a.mark(), log_b.mark()
        await leader.transfer("b")
        taken = await within(waiting, what="b to take over")
        assert log_b.since(mark_b) == Counter({"EVAL renew_holder": 1, "EVALSHA el_announce": 1})
        assert log_a.since(mark_a) == Counter({"EVALSHA el_successor": 1, "EVALSHA el_release": 1})
        assert taken.fencing_token > leader.fencing_token and not ahead_waiting.done()
        await successor_terms.aclose()
        await taken.resign()
        next_term = await within(ahead_waiting, what="c to lead after b")
        await ahead_terms.aclose()
        await next_term.resign()
    finally:
        for client in (a, b, c):
            await client.aclose()


async def test_the_first_in_line_with_an_identity_is_named(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """Identities need not be unique: of two candidates named alike, the first in line."""
    leader = await first_term(Election(clients[0], name, ttl=10, identity="leader"))
    order: list[str] = []
    candidates = await line_up(clients, name, ["other", "same", "same"], order)
    await leader.transfer("same")
    first_same, second_same = candidates[1], candidates[2]
    await within(first_same.task, what="the first 'same' to lead")
    assert [c.term for c in (candidates[0], second_same)] == [None, None]
    await within(asyncio.gather(*(c.task for c in candidates)), what="every term")
    assert order == ["same", "other", "same"]
    assert first_same.term is not None and second_same.term is not None
    assert first_same.term.fencing_token < second_same.term.fencing_token


async def test_a_transfer_to_a_candidate_not_campaigning_keeps_the_term(
    clients: list[redis.asyncio.Redis], name: str, commands: CommandLog
) -> None:
    election = Election(clients[0], name, ttl=10, identity="leader")
    leader = await first_term(election)
    order: list[str] = []
    candidates = await line_up(clients, name, ["c1", "c2"], order)
    queue = election.key + ":queue"
    line = await clients[0].zrange(queue, 0, -1)
    with pytest.raises(ConfigError, match="none with identity 'c9' is campaigning") as error:
        await leader.transfer("c9")
    assert error.value.argument == "identity" and error.value.value == "c9"
    assert leader.held
    assert described(await election.leader()) == ("leader", None)
    assert await clients[0].zrange(queue, 0, -1) == line  # the line is unchanged
    await leader.lease.extend()  # still ours in Redis
    await leader.resign()
    await within(asyncio.gather(*(c.task for c in candidates)), what="every term")
    assert order == ["c1", "c2"]


async def test_a_transfer_of_a_term_over_is_refused(
    client: redis.asyncio.Redis, name: str, commands: CommandLog
) -> None:
    election = Election(client, name, ttl=10, identity="leader")
    mark = commands.mark()
    term = await first_term(election)
    with pytest.raises(TypeError, match="identity must be a str"):
        await term.transfer(b"x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="identity must be 1 to 1000 characters"):
        await term.transfer("")
    await term.resign()
    sent = commands.since(mark)
    with pytest.raises(RuntimeError, match="was resigned"):
        await term.transfer("other")
    assert commands.since(mark) == sent  # nothing sent for the refusals
    ended = await first_term(election)
    await client.delete(election.key)  # the term ends in Redis
    with pytest.raises(LeaseLostError) as lost:
        await ended.transfer("other")
    assert lost.value.reason is LossReason.NOT_OWNER and ended.lost


# --------------------------------------------------------------------------- resume
async def test_a_new_election_object_resumes_its_predecessors_term(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """A restarted process (another client, another identity by default) takes the term
    back by its token: the same term, the same record; it renews, resigns and hands over."""
    before = Election(clients[0], name, ttl=10, identity="host-a:1")
    term = await first_term(before, value="http://a")
    async with Observer(before) as observer:
        after = Election(clients[1], name, ttl=10, identity="host-a:2")
        resumed = await after.resume(term.lease.token)
        assert resumed.fencing_token == term.fencing_token
        assert (resumed.identity, resumed.since) == ("host-a:1", term.since)
        assert resumed.held and resumed.remaining() > 9
        recorded = await after.leader()
        assert recorded is not None and recorded.fencing_token == term.fencing_token
        assert described(recorded) == ("host-a:1", "http://a")
        await resumed.lease.extend()
        await resumed.proclaim("http://a2")
        order: list[str] = []
        (candidate,) = await line_up(clients[1:], name, ["next"], order)
        await resumed.resign()
        await within(candidate.task, what="the next candidate to lead")
        await observer.saw(5, "the value, the end, the next term and its end")
    assert observer.described == [
        ("host-a:1", "http://a"),
        ("host-a:1", "http://a2"),
        None,
        ("next", None),
        None,
    ]
    # The predecessor's own object finds its term over.
    with contextlib.suppress(LeaseLostError):
        await term.resign()


async def test_resuming_a_term_that_ended_or_a_bad_token_is_refused(
    client: redis.asyncio.Redis, name: str, commands: CommandLog
) -> None:
    election = Election(client, name, ttl=10)
    mark = commands.mark()
    with pytest.raises(ConfigError, match="token"):
        await election.resume("not a token")
    assert commands.since(mark) == Counter()
    term = await first_term(election)
    await term.resign()
    with pytest.raises(LeaseLostError) as lost:
        await election.resume(term.lease.token)
    assert lost.value.reason is LossReason.NOT_OWNER
    with pytest.raises(LeaseLostError):
        await election.resume(secrets.token_hex(16))
    assert await election.leader() is None


async def test_a_term_won_but_not_announced_is_announced_when_resumed(
    client: redis.asyncio.Redis, name: str
) -> None:
    """A process that died between its win and its announcement: its successor's object
    announces the term with its own identity."""
    election = Election(client, name, ttl=10, identity="restarted")
    keys = LockKeys.build("aiolock", name, INFIX)
    token = secrets.token_hex(16)
    reply = await client.eval(
        ACQUIRE.source, 1, keys.lock, *acquire_args(token, 10_000, "host 1 task")
    )
    assert isinstance(reply, int)
    assert await election.leader() is None
    term = await election.resume(token)
    assert term.fencing_token == reply and term.identity == "restarted"
    assert described(await election.leader()) == ("restarted", None)
    await term.resign()


# --------------------------------------------------------------------------- rolling upgrade
async def test_a_transfer_beside_candidates_of_the_release_before(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """A process of the release before queues by ACQUIRE, without an identity: it cannot be
    named, it keeps its place, and never holds the term while the named successor does;
    its turn comes after. Its own leader's release (EL_RELEASE, unchanged) still grants to
    the head of the line, so a successor moved there by a newer leader is served first."""
    election = Election(clients[0], name, ttl=10, identity="new-leader")
    keys = LockKeys.build("aiolock", name, INFIX)
    leader = await first_term(election)
    # An older candidate, first in line: its acquire and queue entry as that release sent
    # them (ACQUIRE and its arguments have not changed).
    old_token, old_wid = secrets.token_hex(16), secrets.token_hex(8)
    entry = f"old-host 1 1 1000 10000 {old_token} old-task"

    async def old_attempt() -> object:
        args = acquire_args(old_token, 10_000, "old-host 1 old-task", queue=(old_wid, 0, entry))
        return await clients[0].eval(ACQUIRE.source, len(keys.scripts), *keys.scripts, *args)

    busy = await old_attempt()
    assert isinstance(busy, list) and busy[0] == 0
    successor = Election(clients[1], name, ttl=10, identity="new-candidate")
    async with contextlib.aclosing(successor.campaign()) as terms:
        waiting = asyncio.create_task(anext(terms))
        await candidates_queued(clients[0], election, 2)
        with pytest.raises(ConfigError):
            await leader.transfer("old-host:1")  # the older candidate has no identity
        await leader.transfer("new-candidate")
        term = await within(waiting, what="the newer candidate to lead")
        again = await old_attempt()  # the older candidate tries while it leads
        assert isinstance(again, list) and again[0] == 0
        assert described(await election.leader()) == ("new-candidate", None)
        await term.resign()
    # Its release granted the term to the head of the line: the older candidate's token,
    # which the older process's acquire claims.
    assert await clients[0].hget(keys.lock, "token") == old_token.encode()
    taken = await old_attempt()
    assert isinstance(taken, int) and taken > term.fencing_token  # held under its token


async def test_the_identities_of_queues_no_longer_in_line_are_removed_once_many(
    clients: list[redis.asyncio.Redis], name: str
) -> None:
    """A process makes a new wait queue id each time its waiters come back: the identities
    of those gone are removed when a new one comes and they are many, so the hash does not
    grow with every campaign."""
    election = Election(clients[0], name, ttl=10, identity="leader")
    leader = await first_term(election)
    ids = election.key + ":ids"
    stale = [item for i in range(IDS_SLACK) for item in (f"gone{i:02d}", f"c{i}")]
    await clients[0].hset(ids, items=[*stale, "#", IDS_SLACK])  # "#": how many there are
    order: list[str] = []
    (first,) = await line_up(clients, name, ["c1"], order)
    # IDS_SLACK + 1 ids, one of them in line: those of the queues gone are removed.
    (in_line,) = await clients[0].zrange(election.key + ":queue", 0, -1)
    assert await clients[0].hgetall(ids) == {in_line: b"c1", b"#": b"1"}
    assert await clients[0].ttl(ids) > 0
    await leader.transfer("c1")
    await within(first.task, what="c1 to lead")
    assert order == ["c1"]
