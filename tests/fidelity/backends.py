"""The backends a sequence runs on: a real server (a throwaway `RedisServer` of Redis 7 or
Valkey 8, through a synchronous redis-py client) and the simulation's server (`SimServer`:
fakeredis 7.2 with Lua through lupa, its clock the simulated loop's, as in a simulation).

Each call runs on the real server first, right after a TIME in the same round trip; the
simulated server's clock is then set to that TIME plus a fixed shift of about 40 days (`EPOCH` and the loop's start against today): it
runs the call at the instant the real one does, and a value that takes the wall clock where
it should take the virtual one (a module missing from `_TIMED`) stands out.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.asyncio.client import PubSub

from aiolock.testing import RedisServer
from tests.simulation.loop import START, SimLoop
from tests.simulation.server import EPOCH, NetworkFaults, SimServer, virtual_time

from .ops import Command, Context, Op, Step

__all__ = ("ErrorReply", "FakeBackend", "KeyState", "Message", "RealBackend", "State")

T = TypeVar("T")

Cmd = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """A command or script that answered an error."""

    message: str


@dataclass(frozen=True, slots=True)
class KeyState:
    """One key: its type, its PTTL (ms; -1 none) and its value as the read of its type gives
    it (GET, HGETALL, LRANGE, SMEMBERS, ZRANGE WITHSCORES, XRANGE)."""

    type: str
    pttl: int
    value: Any


State = dict[str, KeyState]

Message = tuple[bytes, bytes]
"""A published message: its channel and its data."""

MARKER = "fidelity:end"
"""Published after each call: the messages read before it are the call's."""
MESSAGE_WAIT = 10.0
"""Longest wait for a real server's marker message (seconds)."""


def _read(kind: str, key: str) -> Cmd:
    return {
        "string": ("GET", key),
        "hash": ("HGETALL", key),
        "list": ("LRANGE", key, 0, -1),
        "set": ("SMEMBERS", key),
        "zset": ("ZRANGE", key, 0, -1, "WITHSCORES"),
        "stream": ("XRANGE", key, "-", "+"),
    }.get(kind, ("TYPE", key))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_state(batch: Callable[[list[Cmd]], list[Any]]) -> State:
    """Every key of the database, through `batch` (runs commands, answers their replies)."""
    keys = sorted(_text(k) for k in batch([("KEYS", "*")])[0])
    if not keys:
        return {}
    meta = batch([cmd for key in keys for cmd in (("TYPE", key), ("PTTL", key))])
    kinds = [_text(kind) for kind in meta[::2]]
    values = batch([_read(kind, key) for kind, key in zip(kinds, keys, strict=True)])
    return {
        key: KeyState(kind, int(pttl), value)
        for key, kind, pttl, value in zip(keys, kinds, meta[1::2], values, strict=True)
    }


def _command(step: Step) -> Cmd:
    if isinstance(step, Command):
        return step.args
    script, keys, args = step
    return ("EVAL", script.source, len(keys), *keys, *args)


def describe(step: Step) -> str:
    """A step as its command: the script's name, its KEYS and ARGV."""
    if isinstance(step, Command):
        return " ".join(map(str, step.args))
    script, keys, args = step
    return f"{script.name} KEYS={list(keys)} ARGV={args}"


class RealBackend:
    """A real server started for the run (its database flushed between sequences)."""

    def __init__(self, name: str, server: RedisServer) -> None:
        self.name = name
        self.server = server
        self.client = redis.Redis(port=server.port, socket_timeout=10)
        self.pubsub = self.client.pubsub()
        self.pubsub.psubscribe("*")

    def reset(self) -> None:
        self.client.flushall()
        self.messages()  # the subscription is in place, and nothing is left to read

    def messages(self) -> list[Message]:
        """The messages published since the last call (every channel, in order): read up to
        a marker published now."""
        self.client.publish(MARKER, "")
        found: list[Message] = []
        deadline = time.monotonic() + MESSAGE_WAIT
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=max(deadline - time.monotonic(), 0.001))
            if message is None or message["type"] != "pmessage":
                continue
            if message["channel"] == MARKER.encode():
                return found
            found.append((message["channel"], message["data"]))
        raise TimeoutError(f"{self.name}: no marker message within {MESSAGE_WAIT} s")

    def now_us(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1_000_000 + int(micros)

    def call(self, op: Op, ctx: Context) -> tuple[Step, Any, int]:
        """Build `op` and run it, between two TIMEs in one round trip: the step, its reply,
        and the server's clock (µs) just before it ran."""
        step = op.build(ctx)
        pipe = self.client.pipeline(transaction=False)
        pipe.execute_command("TIME")  # type: ignore[no-untyped-call]
        pipe.execute_command(*_command(step))  # type: ignore[no-untyped-call]
        before, reply = pipe.execute(raise_on_error=False)
        if isinstance(reply, Exception):
            reply = ErrorReply(str(reply))
        seconds, micros = before
        return step, reply, int(seconds) * 1_000_000 + int(micros)

    def _batch(self, commands: list[Cmd]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        return [
            ErrorReply(str(r)) if isinstance(r, Exception) else r
            for r in pipe.execute(raise_on_error=False)
        ]

    def state(self) -> State:
        return read_state(self._batch)

    def close(self) -> None:
        self.pubsub.close()
        self.client.close()


class FakeBackend:
    """The simulation's server (`SimServer`, a fresh one per sequence), its clock set to a
    real server's instant plus a fixed shift."""

    name = "fakeredis"

    def __init__(self) -> None:
        self.loop = SimLoop(0, cost=0.0, slow=0.0)
        self._base_us = time.time_ns() // 1000
        self.server: SimServer | None = None
        self.client: redis.asyncio.Redis | None = None
        self.pubsub: PubSub | None = None

    @property
    def shift_us(self) -> int:
        """How far the simulated server's clock is ahead of the real one's."""
        return round((EPOCH + START) * 1_000_000) - self._base_us

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def reset(self) -> None:
        self._close()
        self.server = SimServer("fake", self.loop, random.Random(0), NetworkFaults())
        self.client = self.server.client(clean=True)
        self.pubsub = self.client.pubsub()
        self._run(self.pubsub.psubscribe("*"))
        self.messages()

    def _close(self) -> None:
        if self.pubsub is not None:
            self._run(self.pubsub.aclose())
            self.pubsub = None
        if self.client is not None:
            self._run(self.client.aclose())
            self.client = None

    def messages(self) -> list[Message]:
        """The messages published since the last call, as `RealBackend.messages` reads them
        (fakeredis delivers them at once: no wait)."""
        with virtual_time(self.loop):
            return self._run(self._messages())

    async def _messages(self) -> list[Message]:
        assert self.pubsub is not None, "reset() first"
        await self._client.publish(MARKER, "")
        found: list[Message] = []
        while (message := await self.pubsub.get_message(timeout=0.0)) is not None:
            if message["type"] != "pmessage":
                continue
            if message["channel"] == MARKER.encode():
                return found
            found.append((message["channel"], message["data"]))
        raise AssertionError("fakeredis: the marker message was not delivered")

    def set_clock(self, real_us: int) -> None:
        """The simulated clock at `real_us` (a real server's TIME) plus the shift."""
        self.loop._now = START + (real_us - self._base_us) / 1_000_000

    def now_us(self) -> int:
        return round((EPOCH + self.loop.time()) * 1_000_000)

    @property
    def _client(self) -> redis.asyncio.Redis:
        assert self.client is not None, "reset() first"
        return self.client

    def call(self, op: Op, ctx: Context) -> tuple[Step, Any]:
        with virtual_time(self.loop):  # a Redlock's proposal reads the client's clock
            step = op.build(ctx)
            try:
                reply = self._run(self._client.execute_command(*_command(step)))  # type: ignore[no-untyped-call]
            except redis.ResponseError as exc:
                reply = ErrorReply(str(exc))
        return step, reply

    async def _each(self, commands: list[Cmd]) -> list[Any]:
        replies: list[Any] = []
        for command in commands:
            try:
                replies.append(await self._client.execute_command(*command))  # type: ignore[no-untyped-call]
            except redis.ResponseError as exc:
                replies.append(ErrorReply(str(exc)))
        return replies

    def _batch(self, commands: list[Cmd]) -> list[Any]:
        with virtual_time(self.loop):
            return self._run(self._each(commands))

    def state(self) -> State:
        return read_state(self._batch)

    def close(self) -> None:
        self._close()
        self.loop.close()
