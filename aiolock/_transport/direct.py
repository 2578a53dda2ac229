"""Direct sends: a script call packed by hiredis and written on a connection of the user's
client's pool, its reply read there, without redis-py's command layers: on one connection
the calls of every task share (`SharedConnection`) where the pool and the call allow it,
else on a connection of its own for the call."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
import redis.exceptions

from .base import (
    PACKS,
    Command,
    Sent,
    Transport,
    checkin,
    checkout,
    exchange_packed,
    pack,
    write,
)
from .clients import ClientLibrary
from .shared_connection import GiveBack
from .sharing import Sharing
from .write_batch import WriteBatch

__all__ = ("DirectTransport", "direct_connections", "exchange", "sends_directly")


def sends_directly(client: redis.asyncio.Redis, library: ClientLibrary) -> bool:
    """Whether aiolock may send its scripts on `client`'s connections itself.

    A script call through `execute_command` packs its arguments in Python and goes through
    redis-py's retry and instrumentation layers, which aiolock replaces with its own
    bounds; sending on a pooled connection directly, packed by hiredis, costs a fraction.
    Only the library's own connection classes with the default UTF-8 encoding qualify: any
    other connection (fakeredis, Sentinel-managed, a subclass), encoding, or a client
    bound to a single connection goes through `execute_command`.
    """
    pool = client.connection_pool
    return not client.single_connection_client and direct_connections(
        library, pool.connection_class, pool.connection_kwargs
    )


def direct_connections(
    library: ClientLibrary, connection_class: type[Any], kwargs: dict[str, Any]
) -> bool:
    """Whether aiolock may send on connections of `connection_class` made with `kwargs`
    itself (see `sends_directly`)."""
    return (
        PACKS
        and connection_class in library.direct
        and str(kwargs.get("encoding", "utf-8")).lower().replace("_", "-") in ("utf-8", "utf8")
        and kwargs.get("encoding_errors", "strict") == "strict"
    )


async def exchange(
    connection: redis.asyncio.connection.AbstractConnection,
    command: Command,
    on_sent: Sent,
    then: Command | None,
    batch: WriteBatch,
) -> Any:
    """One command on `connection`, packed by hiredis, written (or held in `batch`, the
    running loop's), its reply read (with `then`, a `WAIT`: both written at once and both
    replies returned); see `exchange_packed`."""
    packed = pack(command)
    if then is not None:
        packed += pack(then)
    return await exchange_packed(
        connection, packed, on_sent, pair=then is not None, send=write, batch=batch
    )


class DirectTransport(Transport):
    """Script calls sent on the user's pooled connections by aiolock itself."""

    __slots__ = ("sharing",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sharing = Sharing()
        """Which calls go on a pool's shared connection (`_transport.sharing`)."""

    async def send(
        self,
        client: redis.asyncio.Redis,  # type: ignore[override]
        command: Command,
        on_sent: Sent,
        then: Command | None = None,
    ) -> Any:
        """One command on a connection of `client`'s pool: for a call that waits only for
        its one reply (no `then`, no `on_sent`) while other calls of this transport are
        under way, the pool's shared one (`_transport.sharing`); else one of its own (see
        `exchange`).

        A connection closed while redis-py's checkout was handing it over (its user closed
        the client) is not connected again, as redis-py's write would: that is a
        `ConnectionError`, and the call is sent again as its caller decides (a call that
        may outlive its caller, on a connection of its own, not in the pool the user
        closed). (The quick checkout hands over a connected one without a pause.)"""
        pool = client.connection_pool
        sharing = self.sharing
        sharing.under_way += 1
        try:
            if then is None and on_sent is None and sharing.wanted(pool):
                routed = await sharing.route(pool, _take, command)
                if routed is not None:
                    return await sharing.call(*routed, self.batch)
            connection, quick = await checkout(pool, str(command[0]))
            try:
                if not quick and not connection.is_connected:
                    raise redis.exceptions.ConnectionError(
                        "the connection was closed under the call"
                    )
                return await exchange(connection, command, on_sent, then, self.batch)
            finally:
                await checkin(pool, connection, quick)
        finally:
            sharing.under_way -= 1


async def _take(pool: Any) -> tuple[Any, GiveBack]:
    """A connection of `pool` to share (`Sharing.share`), and how it goes back."""
    connection, quick = await checkout(pool, "EVALSHA")

    async def give_back(connection: Any) -> None:
        await checkin(pool, connection, quick)

    return connection, give_back
