"""Hypothesis stateful test: `Lock` and `Lease` against a model, on a real server and fakeredis.

Two clients, each with a `Lock` per name, on two names. Rules: acquire (a single try),
try_acquire, release, extend, and an external DEL of a lock's key (an operator, an
eviction). The model knows, per name, which lease holds the key in Redis, and per lease
whether it is held, released, lost, or "doomed" (its key was deleted behind its back: it
still believes it is held, and learns otherwise at its next extend or release).

Renewal is off and the ttl long, so nothing changes between two rules. Invariants: Redis's
`locked()` agrees with the model for every name, at most one lease per name is held in the
model, each lease's own state agrees with the model, and fencing tokens increase per name.

Hypothesis rules are synchronous; each drives the async API on a dedicated event loop with
`run_until_complete`, and `teardown` releases everything and closes the clients and the loop.
"""

from __future__ import annotations

import asyncio
import enum
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import pytest
import redis.asyncio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from aiolock import AcquireTimeoutError, Lease, LeaseLostError, Lock, LossReason

from ..support.waits import closed

T = TypeVar("T")

NAMES = 2
CLIENTS = 2
TTL = 60.0


class State(enum.Enum):
    HELD = "held"
    DOOMED = "doomed"  # the key was deleted; the lease does not know yet
    RELEASED = "released"
    LOST = "lost"


@dataclass
class Model:
    """What the model knows of one lease."""

    lease: Lease
    name: int
    state: State


class LockMachine(RuleBasedStateMachine):
    leases = Bundle("leases")

    def __init__(self, make_client: Callable[[], redis.asyncio.Redis]) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clients = [make_client() for _ in range(CLIENTS)]
        prefix = f"stateful:{uuid.uuid4().hex[:8]}"
        self.names = [f"{prefix}:{i}" for i in range(NAMES)]
        self.locks = [
            [Lock(client, name, ttl=TTL, renew=False) for name in self.names]
            for client in self.clients
        ]
        self.models: list[Model] = []
        self.holder: list[Model | None] = [None] * NAMES  # whose token is in Redis
        self.tokens: list[list[int]] = [[] for _ in range(NAMES)]

    def run(self, awaitable: Awaitable[T]) -> T:
        return self.loop.run_until_complete(awaitable)

    def granted(self, name: int, lease: Lease) -> Model:
        assert self.holder[name] is None, "granted a lock the model says is held"
        assert lease.name == self.names[name]
        assert lease.held and not lease.lost and not lease.released
        tokens = self.tokens[name]
        assert not tokens or lease.fencing_token > tokens[-1], "fencing token did not increase"
        tokens.append(lease.fencing_token)
        model = Model(lease, name, State.HELD)
        self.models.append(model)
        self.holder[name] = model
        return model

    # ----------------------------------------------------------------- rules
    @rule(target=leases, client=st.integers(0, CLIENTS - 1), name=st.integers(0, NAMES - 1))
    def acquire(self, client: int, name: int) -> Any:
        lock = self.locks[client][name]
        if self.holder[name] is not None:
            with pytest.raises(AcquireTimeoutError):
                self.run(lock.acquire(timeout=0))
            return multiple()
        return self.granted(name, self.run(lock.acquire(timeout=0)))

    @rule(target=leases, client=st.integers(0, CLIENTS - 1), name=st.integers(0, NAMES - 1))
    def try_acquire(self, client: int, name: int) -> Any:
        lease = self.run(self.locks[client][name].try_acquire())
        if self.holder[name] is not None:
            assert lease is None
            return multiple()
        assert lease is not None
        return self.granted(name, lease)

    @rule(model=leases)
    def release(self, model: Model) -> None:
        lease = model.lease
        if model.state is State.HELD:
            self.run(lease.release())
            model.state = State.RELEASED
            self.holder[model.name] = None
        elif model.state is State.RELEASED:
            self.run(lease.release())  # a second release does nothing
        else:
            with pytest.raises(LeaseLostError) as info:
                self.run(lease.release())
            assert info.value.reason is LossReason.NOT_OWNER
            model.state = State.LOST

    @rule(model=leases)
    def extend(self, model: Model) -> None:
        lease = model.lease
        if model.state is State.HELD:
            self.run(lease.extend())
        elif model.state is State.RELEASED:
            with pytest.raises(RuntimeError, match="released"):
                self.run(lease.extend())
        else:
            with pytest.raises(LeaseLostError) as info:
                self.run(lease.extend())
            assert info.value.reason is LossReason.NOT_OWNER
            model.state = State.LOST

    @rule(name=st.integers(0, NAMES - 1))
    def delete_key_behind_the_holders_back(self, name: int) -> None:
        self.run(self.clients[0].delete(self.locks[0][name].key))
        model = self.holder[name]
        if model is not None:
            model.state = State.DOOMED
            self.holder[name] = None

    # ----------------------------------------------------------------- invariants
    @invariant()
    def redis_agrees_with_the_model(self) -> None:
        for name in range(NAMES):
            locked = self.run(self.locks[1][name].locked())
            assert locked == (self.holder[name] is not None), self.names[name]

    @invariant()
    def at_most_one_held_lease_per_name(self) -> None:
        for name in range(NAMES):
            held = [m for m in self.models if m.name == name and m.state is State.HELD]
            assert len(held) <= 1
            assert held == ([] if self.holder[name] is None else [self.holder[name]])

    @invariant()
    def each_lease_agrees_with_the_model(self) -> None:
        for model in self.models:
            lease = model.lease
            believes_held = model.state in (State.HELD, State.DOOMED)
            assert lease.held == believes_held, (model.state, lease)
            assert lease.released == (model.state is State.RELEASED)
            assert lease.lost == (model.state is State.LOST)
            if model.state is State.LOST:
                assert lease.loss_reason is LossReason.NOT_OWNER

    def teardown(self) -> None:
        try:
            for model in self.models:
                if model.state in (State.HELD, State.DOOMED):
                    try:
                        self.run(model.lease.release())
                    except LeaseLostError:
                        assert model.state is State.DOOMED
            for client in self.clients:
                self.run(client.aclose())
        finally:
            closed(self.loop)


SETTINGS = settings(
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def bound(
    make_client: Callable[[], Callable[[], redis.asyncio.Redis]],
) -> type[RuleBasedStateMachine]:
    """The machine's factory, each example of it with clients from `make_client()`.

    A function, not a class: Hypothesis reads its factory's source (a digest of it keys
    its database). A class's source is found by parsing the whole module, and CPython
    3.11.7's `ast` once failed a run there with "AST constructor recursion depth mismatch"
    (python/cpython#106905, fixed in 3.11.8); a function's is found by its line number,
    and Hypothesis's own parse of it falls back on any error.
    """

    def machine() -> LockMachine:
        return LockMachine(make_client())

    # (Hypothesis calls its factory; its signature names a class, the usual factory.)
    return cast(type[RuleBasedStateMachine], machine)


@pytest.mark.real_only
def test_lock_model_on_a_real_server(server_url: str) -> None:
    def clients() -> Callable[[], redis.asyncio.Redis]:
        return lambda: redis.asyncio.Redis.from_url(server_url)

    run_state_machine_as_test(bound(clients), settings=SETTINGS)


def test_lock_model_on_fakeredis() -> None:
    import fakeredis

    def clients() -> Callable[[], redis.asyncio.Redis]:
        server = fakeredis.FakeServer()  # one per example, shared by its two clients
        return lambda: fakeredis.FakeAsyncRedis(server=server)

    run_state_machine_as_test(bound(clients), settings=SETTINGS)
