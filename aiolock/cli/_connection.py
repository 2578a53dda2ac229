"""Reaching the server named by `--url`: a client with the command line's timeouts, a
cluster client when that server is a Redis Cluster node, the URL shown without its password."""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any, Final

import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from .._transport.backend import Backend
from .._transport.clients import AsyncClient, translate_errors
from ..errors import BackendError
from ._errors import UsageError

DEFAULT_URL: Final = "redis://localhost:6379/0"
CONNECT_TIMEOUT: Final = 5.0


def redact(url: str) -> str:
    """The URL without its password."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


_CLIENT_OPTIONS: Final[dict[str, Any]] = {
    "socket_connect_timeout": CONNECT_TIMEOUT,
    "socket_timeout": CONNECT_TIMEOUT,
    # A key name that is not UTF-8 (only another writer makes one) is read back as text
    # with `surrogateescape` (its bytes as U+DC80 to U+DCFF), and written as those bytes
    # again: such a lock is listed, shown and released like any other (a name given on the
    # command line is decoded by Python the same way).
    "encoding_errors": "surrogateescape",
}


def connect(url: str | None) -> redis.asyncio.Redis:
    try:
        return redis.asyncio.Redis.from_url(url or DEFAULT_URL, **_CLIENT_OPTIONS)
    except ValueError as exc:
        raise UsageError(f"invalid --url {redact(url or DEFAULT_URL)!r}: {exc}") from None


async def open_client(url: str | None) -> AsyncClient:
    """A client of the server at `url`; if that server is a Redis Cluster node, a client
    of the whole cluster (every primary is read). One round trip to ask."""
    client = connect(url)
    try:
        with translate_errors("connect", None, CONNECT_TIMEOUT):
            async with asyncio.timeout(CONNECT_TIMEOUT):
                info = await client.info("cluster")
    except BackendError as exc:
        if Backend.refused(exc):  # INFO not allowed to this user: taken for a lone server
            return client
        await client.aclose()
        raise
    except BaseException:
        await client.aclose()
        raise
    if str(info.get("cluster_enabled", 0)) not in ("1", "yes"):
        return client
    await client.aclose()
    return RedisCluster.from_url(url or DEFAULT_URL, **_CLIENT_OPTIONS)
