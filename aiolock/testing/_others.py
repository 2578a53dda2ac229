"""`hold_elsewhere` and `expire_now` for the primitives that are more than one key of one
server: a `Redlock` (its nodes, all or some), an `Election` (a leader elsewhere, the
current term expired) and a `MultiLock` (every name)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Final, cast

from .._engine.lease import Lease
from .._engine.runtime import runtime_for
from .._lua.election import stored_value
from .._lua.lock import release_args
from .._lua.redlock import RL_RELEASE
from .._primitives.election import Election
from .._primitives.multilock import MultiLease, MultiLock
from .._primitives.redlock import Redlock
from .._primitives.term import Term
from .._transport.call_options import CallOptions
from .._transport.clients import AsyncRedis, ValkeyClient, check_client, is_cluster
from ..errors import ConfigError, LeaseLostError

__all__ = ("OneServer", "another_process", "expire_other", "hold_other", "node_clients")

OneServer = AsyncRedis | ValkeyClient
"""A client of one server: redis-py's (fakeredis's too) or valkey-py's."""

Whole = Redlock | Election | MultiLock

ELSEWHERE: Final = "elsewhere"
"""The identity of the leader `hold_elsewhere` makes, as `Election.leader()` shows it."""
_TIMEOUT: Final = 5.0
"""Longest wait for a server to answer `expire_now`, seconds."""


def another_process(client: object, argument: str = "client") -> AsyncRedis:
    """A second client on `client`'s connection pool: aiolock keeps a runtime (notifier,
    wait queues, queue id) per client, so its leases are another process's."""
    checked = check_client(client)
    if is_cluster(checked):
        raise TypeError(
            f"{argument} must be a client of one server (a redis.asyncio.Redis, fakeredis's or "
            f"a valkey.asyncio.Valkey), got the cluster client {type(client).__name__}"
        )
    one = cast(AsyncRedis, checked)
    return type(one)(connection_pool=one.connection_pool)


def node_clients(client: object, redlock: Redlock, nodes: object) -> list[object]:
    """The clients of the nodes `nodes` (indexes into `client`, a Redlock's list of clients;
    every node if None), checked before anything is sent."""
    count = len(redlock.nodes)
    if isinstance(client, str | bytes) or not isinstance(client, Sequence):
        raise TypeError(
            "client must be the Redlock's list of clients (one per node, in its order), "
            f"got {type(client).__name__}"
        )
    if len(client) != count:
        raise ConfigError(
            f"client must hold the Redlock's {count} clients (one per node, in its order), "
            f"got {len(client)}",
            argument="client",
            value=client,
        )
    if nodes is None:
        return list(client)
    accepted = f"node indexes from 0 to {count - 1}, each once, at least one"
    if isinstance(nodes, str | bytes) or not isinstance(nodes, Sequence):
        raise TypeError(f"nodes must be a sequence of {accepted}, got {type(nodes).__name__}")
    if (
        not nodes
        or len(set(nodes)) != len(nodes)
        or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < count for i in nodes)
    ):
        raise ConfigError(f"nodes must be {accepted}, got {nodes!r}", argument="nodes", value=nodes)
    return [client[i] for i in nodes]


def hold_other(
    client: object,
    target: Whole,
    *,
    nodes: object,
    ttl: float,
    timeout: float | None,
) -> contextlib.AbstractAsyncContextManager[Lease | Term | MultiLease]:
    """`hold_elsewhere` for a Redlock, an Election or a MultiLock (arguments checked here,
    before anything is sent)."""
    if nodes is not None and not isinstance(target, Redlock):
        raise TypeError(f"nodes applies to a Redlock, not to {type(target).__name__}")
    if isinstance(target, Redlock):
        chosen = node_clients(client, target, nodes)
        others = [another_process(each, "client[i]") for each in chosen]
        prefix = target._config.prefix
        # (A client on a pool it was given owns no connection until it sends: nothing to
        # close if the Redlock refuses its settings.)
        redlock = Redlock(others, target.name, ttl=ttl, timeout=timeout, prefix=prefix)
        return _held_lease(others, redlock)
    other = another_process(client)
    if isinstance(target, MultiLock):
        prefix = target.locks[0]._config.prefix
        multi = MultiLock(other, target.names, ttl=ttl, timeout=timeout, prefix=prefix)
        return _held_lease([other], multi)
    prefix = target._seat._config.prefix
    election = Election(other, target.name, ttl=ttl, identity=ELSEWHERE, prefix=prefix)
    return _held_term(other, election, timeout)


@contextlib.asynccontextmanager
async def _held_lease(
    others: Sequence[AsyncRedis], primitive: Redlock | MultiLock
) -> AsyncIterator[Lease | MultiLease]:
    lease: Lease | MultiLease | None = None
    try:
        lease = await primitive.acquire()
        yield lease
    finally:
        try:
            if lease is not None:
                with contextlib.suppress(LeaseLostError):
                    await lease.release()
        finally:
            for other in others:
                await other.aclose()


@contextlib.asynccontextmanager
async def _held_term(
    other: AsyncRedis, election: Election, timeout: float | None
) -> AsyncIterator[Term]:
    term: Term | None = None
    try:
        loop = asyncio.get_running_loop()
        while term is None:  # a term lost before it was announced: campaign again
            started = loop.time()
            lease = await election._seat.acquire(timeout=timeout)
            waited = loop.time() - started
            term = await election._announce(lease, stored_value(None), waited=waited)
        yield term
    finally:
        try:
            if term is not None and not term.lease.lost:
                with contextlib.suppress(LeaseLostError):
                    await term.resign()
        finally:
            await other.aclose()


async def expire_other(client: object, target: Whole, *, nodes: object) -> bool:
    """`expire_now` for a Redlock (its holders on the nodes chosen), an Election (the
    current term) or a MultiLock (every name's holder)."""
    if nodes is not None and not isinstance(target, Redlock):
        raise TypeError(f"nodes applies to a Redlock, not to {type(target).__name__}")
    if isinstance(target, Redlock):
        chosen = [check_client(each) for each in node_clients(client, target, nodes)]
        evicted = await asyncio.gather(*(_evict_on(each, target) for each in chosen))
        return any(evicted)
    checked = check_client(client)
    keys = [lock.key for lock in target.locks] if isinstance(target, MultiLock) else [target.key]
    deleted = 0
    for key in keys:  # one at a time: the names may live in different slots of a cluster
        deleted += int(await checked.delete(key))
    return deleted > 0


async def _evict_on(client: object, redlock: Redlock) -> bool:
    """Evict the holder of `redlock` on one node, token-guarded, as `force_release` does
    there: its renewal is refused on this node from then on (the key is not given back)."""
    checked = check_client(client)
    token = await checked.hget(redlock.key, "token")
    if token is None:
        return False
    token = token.decode() if isinstance(token, bytes) else str(token)
    reply = await runtime_for(checked).backend.run(
        RL_RELEASE,
        redlock._release_keys,
        release_args(token=token, forced=True),
        CallOptions(timeout=_TIMEOUT, operation="expire", name=redlock.name),
    )
    return int(reply[0]) == 1
