"""An election shared by processes of this version and of the release before
`Term.transfer()`, as during a rolling upgrade: never two leaders, and a transfer goes to the
candidate named.

The release before runs the same election scripts (ACQUIRE, EL_RELEASE, EL_ANNOUNCE,
EL_PROCLAIM, EL_READ, RENEW: transfer only adds EL_ACQUIRE and EL_SUCCESSOR); its candidates
queue by ACQUIRE, without an identity, and its leaders only resign. `OlderSeat` is its seat.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Sequence

import pytest
import redis.asyncio

from aiolock import ConfigError, Election, fenced_set
from aiolock._engine.acquisition import Call
from aiolock._lua.lock import ACQUIRE, acquire_args
from aiolock._model.holder import HOST, pid
from aiolock._primitives.election import _Seat

from ..support.waits import within

pytestmark = pytest.mark.real_only

TERMS = 4
"""Terms each candidate leads before it stops campaigning."""


class OlderSeat(_Seat):
    """The seat of the release before: a candidate that queues sends ACQUIRE, and records
    no identity."""

    __slots__ = ()

    def _acquire_call(
        self, token: str, task: str, queue: tuple[str, int, str] | None, claims: Sequence[str]
    ) -> Call:
        holder = f"{HOST} {pid()} {task}"
        args = acquire_args(token, self._config.ttl_ms, holder, queue=queue, claims=claims)
        return ACQUIRE, self._keys.scripts if queue is not None else self._keys.state, args


def older(client: redis.asyncio.Redis, election: Election) -> Election:
    """`election` (on `client`), campaigning as a process of the release before would."""
    seat = election._seat
    election._seat = OlderSeat(client, seat.name, seat._config, identity=election.identity)
    return election


class Run:
    """What the leaders saw: the fencing tokens in the order their terms began, the
    fenced writes refused, the transfers made and whether the one named led next."""

    def __init__(self, client: redis.asyncio.Redis, key: str) -> None:
        self.client, self.key = client, key
        self.tokens: list[int] = []
        self.refused = 0
        self.named: str | None = None
        self.transfers: list[tuple[str, str]] = []  # (named, next leader)
        self.campaigning: set[str] = set()


async def candidate(election: Election, run: Run, *, newer: bool, rng: random.Random) -> None:
    run.campaigning.add(election.identity)
    led = 0
    async with contextlib.aclosing(election.campaign()) as terms:
        async for term in terms:
            async with term:
                led += 1
                if run.named is not None:
                    run.transfers.append((run.named, election.identity))
                    run.named = None
                run.tokens.append(term.fencing_token)
                if not await fenced_set(run.client, run.key, election.identity, term.fencing_token):
                    run.refused += 1
                leader = await election.leader()
                assert leader is not None and leader.identity == election.identity
                if led == TERMS:
                    run.campaigning.discard(election.identity)
                others = sorted(run.campaigning - {election.identity})
                if newer and others:
                    named = rng.choice(others)
                    try:
                        run.named = named
                        await term.transfer(named)
                    except ConfigError:
                        run.named = None  # an older candidate: it cannot be named
            if led == TERMS:
                break


async def test_older_and_newer_candidates_never_lead_together(server_url: str, name: str) -> None:
    rng = random.Random(46)
    clients = [redis.asyncio.Redis.from_url(server_url) for _ in range(4)]
    try:
        elections = [
            older(clients[0], Election(clients[0], name, ttl=10, identity="old-0")),
            Election(clients[1], name, ttl=10, identity="new-1"),
            older(clients[2], Election(clients[2], name, ttl=10, identity="old-2")),
            Election(clients[3], name, ttl=10, identity="new-3"),
        ]
        run = Run(clients[0], f"{name}:fenced")
        for election in elections:
            run.campaigning.add(election.identity)
        tasks = [candidate(e, run, newer=e.identity.startswith("new"), rng=rng) for e in elections]
        await within(asyncio.gather(*tasks), what="every candidate's terms", timeout=60)
        # One term at a time: each term's fencing token above the one before it, every
        # fenced write accepted (a leader overlapping a later one would be refused).
        assert len(run.tokens) == TERMS * len(elections)
        assert run.tokens == sorted(run.tokens) and len(set(run.tokens)) == len(run.tokens)
        assert run.refused == 0
        # Every transfer made went to the one named, older and newer alike in line.
        assert run.transfers, "no transfer was made"
        assert all(named == leader for named, leader in run.transfers), run.transfers
        assert all(named.startswith("new") for named, _ in run.transfers)
    finally:
        for client in clients:
            await client.aclose()
