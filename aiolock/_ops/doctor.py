"""`aiolock doctor`: what in a server's setup can break locks, and what to change.

Facts are read once (`INFO`, `CONFIG GET` where allowed, `ACL WHOAMI`, a few pings) into a
`ServerFacts`; each check is a pure function of those facts, tested as a unit; only the
permission check talks to Redis again: `ACL DRYRUN` for every command aiolock needs (Redis
≥ 7, Valkey; it can check another user than the connected one), or else, for the connected
user, the commands themselves, on scratch keys under the prefix that expire within
seconds (Redis 6.2, or a user not allowed to run `ACL DRYRUN`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, final

import redis.asyncio
import redis.exceptions

from .._model.holder import text
from .._transport.backend import Backend
from .._transport.clients import translate_errors
from ..errors import BackendError
from .acl import (
    ACL_LINE,
    OUTSIDE_SCRIPTS,
    PROBE,
    PROBE_ORDER,
    PROBE_SHA,
    SHARDED,
    Scratch,
    acl_line,
    needed_commands,
    short,
)

__all__ = (
    "ACL_LINE",
    "Diagnosis",
    "Finding",
    "ServerFacts",
    "Severity",
    "check_cluster",
    "check_eviction",
    "check_latency",
    "check_memory",
    "check_notifications",
    "check_persistence",
    "check_replication",
    "check_timeout",
    "check_version",
    "diagnose",
    "needed_commands",
)

Severity = Literal["ok", "info", "warning", "problem"]

_READ_TIMEOUT: Final = 5.0
_SAFE_POLICY: Final = "noeviction"
_MEMORY_WARNING_SHARE: Final = 0.9
_SLOW_ROUND_TRIP: Final = 0.05
_MIN_VERSION: Final = (6, 2)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One thing the doctor found: how bad it is, what it means, and what to change."""

    check: str
    severity: Severity
    message: str
    fix: str | None = None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ServerFacts:
    """What the checks look at, read from one server."""

    info: Mapping[str, Any]
    config: Mapping[str, str]
    """`CONFIG GET` values that could be read (empty where CONFIG is not allowed)."""
    config_error: str | None = None
    info_error: str | None = None
    round_trips: Sequence[float] = ()
    """Seconds, a few PINGs."""

    def setting(self, name: str, info_name: str | None = None) -> str | None:
        """A setting from CONFIG GET, else from INFO (under `info_name`), else None."""
        if name in self.config:
            return self.config[name]
        value = self.info.get(info_name or name.replace("-", "_"))
        return None if value is None else str(value)

    @property
    def version(self) -> str:
        return str(self.info.get("valkey_version") or self.info.get("redis_version") or "?")

    @property
    def product(self) -> str:
        return "Valkey" if "valkey_version" in self.info else "Redis"


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnosis:
    """Everything `aiolock doctor` found about one server."""

    server: Mapping[str, Any]
    findings: tuple[Finding, ...] = field(default=())

    @property
    def problems(self) -> int:
        return sum(f.severity == "problem" for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == "warning" for f in self.findings)


# --------------------------------------------------------------------------- pure checks
def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def check_version(facts: ServerFacts) -> Finding | None:
    version = facts.version
    if version == "?":
        return None
    if _version_tuple(version) < _MIN_VERSION:
        return Finding(
            check="version",
            severity="problem",
            message=f"{facts.product} {version}: aiolock needs Redis 6.2 or later (or Valkey)",
            fix="upgrade the server to Redis ≥ 6.2 or Valkey",
        )
    return Finding(check="version", severity="ok", message=f"{facts.product} {version}")


def check_eviction(facts: ServerFacts) -> Finding | None:
    policy = facts.setting("maxmemory-policy")
    if policy is None:
        return None
    maxmemory = int(facts.setting("maxmemory") or 0)
    limit = "no memory limit (maxmemory 0)" if maxmemory == 0 else f"maxmemory {maxmemory} bytes"
    if policy == _SAFE_POLICY:
        return Finding(
            check="eviction",
            severity="ok",
            message=f"maxmemory-policy noeviction, {limit}: lock keys are never evicted; "
            "when memory is full, acquires fail loudly (BackendError: OOM)",
        )
    what = (
        "volatile-* policies evict keys that have an expiry, and every aiolock key has one "
        "(volatile-ttl picks those closest to expiring first, often lock keys)"
        if policy.startswith("volatile-")
        else "allkeys-* policies may evict any key, lock keys included"
        if policy.startswith("allkeys-")
        else f"policy {policy!r} is not noeviction"
    )
    fix = "CONFIG SET maxmemory-policy noeviction (and in the server's config file)"
    if maxmemory == 0:
        return Finding(
            check="eviction",
            severity="warning",
            message=f"maxmemory-policy {policy} with {limit}: nothing is evicted today, but "
            f"once a limit is set, {what}: a lock evicted while held lets a second holder in",
            fix=fix,
        )
    return Finding(
        check="eviction",
        severity="problem",
        message=f"maxmemory-policy {policy} with {limit}: {what}. A lock evicted while held "
        "lets a second holder in before the first learns of it (at its next renewal)",
        fix=fix,
    )


def check_memory(facts: ServerFacts) -> Finding | None:
    maxmemory = int(facts.setting("maxmemory") or 0)
    used = int(facts.info.get("used_memory") or 0)
    if maxmemory <= 0 or used < _MEMORY_WARNING_SHARE * maxmemory:
        return None
    return Finding(
        check="memory",
        severity="warning",
        message=f"{used * 100 // maxmemory} % of maxmemory in use: near the limit, writes "
        "(acquires included) are refused or keys evicted, by the policy",
        fix="raise maxmemory or free memory",
    )


def check_persistence(facts: ServerFacts) -> Finding | None:
    appendonly = facts.setting("appendonly", "aof_enabled")
    if appendonly is None:
        return None
    aof = appendonly.lower() in {"yes", "1"}
    fsync = facts.setting("appendfsync") or "?"
    save = facts.setting("save")
    restart = (
        "after a restart every lock is gone: a new holder can get in while the old one still "
        "works, until its next renewal (ttl/3) tells it, and fencing tokens keep increasing"
    )
    delayed = (
        "or keep a restarted server down for longer than your longest lock ttl before it "
        "takes traffic (a delayed restart), so every lock it lost had expired anyway"
    )
    if aof and fsync == "always":
        return Finding(
            check="persistence",
            severity="ok",
            message="append-only file with appendfsync always: locks survive a restart",
        )
    if aof:
        return Finding(
            check="persistence",
            severity="info",
            message=f"append-only file with appendfsync {fsync}: a crash can lose about the "
            "last second of writes, so a lock taken in that second can be granted again",
            fix=f"appendfsync always to lose none, {delayed}",
        )
    if save:
        return Finding(
            check="persistence",
            severity="warning",
            message=f"RDB snapshots only (save {save!r}): {restart}, for every lock taken "
            "since the last snapshot",
            fix=f"CONFIG SET appendonly yes (appendfsync always or everysec), {delayed}",
        )
    return Finding(
        check="persistence",
        severity="warning",
        message=f"no persistence (no append-only file, no snapshots): {restart}",
        fix=f"CONFIG SET appendonly yes (appendfsync always or everysec), {delayed}",
    )


def check_replication(facts: ServerFacts) -> Finding | None:
    if "role" not in facts.info:
        return None
    role = str(facts.info["role"])
    if role in {"slave", "replica"}:
        primary = facts.info.get("master_host")
        return Finding(
            check="replication",
            severity="problem",
            message="this server is a replica: it refuses writes (READONLY), so no lock can "
            "be taken on it",
            fix=f"connect aiolock to the primary{f' ({primary})' if primary else ''}",
        )
    replicas = int(facts.info.get("connected_slaves") or 0)
    if replicas:
        return Finding(
            check="replication",
            severity="warning",
            message=f"primary with {replicas} replica(s): replication is asynchronous, so "
            "a failover can promote a replica that never saw a lock, and grant it twice. "
            "With Sentinel, give aiolock a Sentinel(...).master_for(...) client",
            fix="do not fail over while locks are held, or rely on fencing tokens for "
            "safety (they stay increasing on a replica whose clock is not behind)",
        )
    return Finding(check="replication", severity="ok", message="single node (no replicas)")


def _clustered(facts: ServerFacts) -> bool:
    """Whether the server is a Redis Cluster node."""
    mode = str(facts.info.get("redis_mode") or facts.info.get("server_mode") or "standalone")
    return str(facts.info.get("cluster_enabled", "0")) in {"1", "yes"} or mode == "cluster"


def check_cluster(facts: ServerFacts) -> Finding | None:
    if not facts.info:
        return None
    mode = str(facts.info.get("redis_mode") or facts.info.get("server_mode") or "standalone")
    if mode == "sentinel":
        return Finding(
            check="cluster",
            severity="problem",
            message="this is a Sentinel, not a data node",
            fix="give aiolock a Sentinel(...).master_for(...) client, which finds the primary",
        )
    if _clustered(facts):
        return Finding(
            check="cluster",
            severity="warning",
            message="a Redis Cluster node: locks work through a redis.asyncio.RedisCluster "
            "client, but a client of this node alone gets MOVED for names served elsewhere, "
            "and these checks see this node only (ls, show and stats read every primary)",
            fix="give aiolock a redis.asyncio.RedisCluster(...) client",
        )
    return None


def check_notifications(facts: ServerFacts) -> Finding | None:
    events = facts.setting("notify-keyspace-events")
    if events is None:
        return None
    shown = events or "(none)"
    return Finding(
        check="notifications",
        severity="info",
        message=f"notify-keyspace-events {shown}: aiolock does not use keyspace "
        "notifications (waiters hear of releases on the lock's own channel), so any "
        "setting works",
    )


def check_timeout(facts: ServerFacts) -> Finding | None:
    value = facts.setting("timeout")
    if value is None or not value.isdigit() or int(value) == 0:
        return None
    return Finding(
        check="timeout",
        severity="info",
        message=f"idle connections are closed after {value} s: aiolock's renewal "
        "connection reconnects when a renewal finds it closed (a lock with ttl/3 above "
        f"{value} s pays a reconnect per renewal)",
    )


def check_latency(facts: ServerFacts) -> Finding | None:
    if not facts.round_trips:
        return None
    best = min(facts.round_trips)
    message = f"round trip {best * 1000:.2f} ms (best of {len(facts.round_trips)} PINGs)"
    if best > _SLOW_ROUND_TRIP:
        return Finding(
            check="latency",
            severity="warning",
            message=message + ": slow; every acquire, renewal and release pays it",
            fix="keep ttls well above 100 round trips, and the server close to the clients",
        )
    return Finding(check="latency", severity="info", message=message)


_PURE_CHECKS: Final = (
    check_version,
    check_cluster,
    check_replication,
    check_eviction,
    check_memory,
    check_persistence,
    check_notifications,
    check_timeout,
    check_latency,
)


# --------------------------------------------------------------------------- reading
_CONFIG_NAMES: Final = (
    "maxmemory",
    "maxmemory-policy",
    "appendonly",
    "appendfsync",
    "save",
    "notify-keyspace-events",
    "timeout",
)


async def read_facts(client: redis.asyncio.Redis) -> ServerFacts:
    """INFO, the CONFIG values that may be read, and a few round trips."""
    info_error = None
    try:
        with translate_errors("doctor", None, _READ_TIMEOUT):
            async with asyncio.timeout(_READ_TIMEOUT):
                info = await client.info()
    except BackendError as exc:
        if not Backend.refused(exc):
            raise
        info, info_error = {}, str(exc.__cause__ or exc)
    config: dict[str, str] = {}
    config_error = None
    for name in _CONFIG_NAMES:
        try:
            async with asyncio.timeout(_READ_TIMEOUT):
                reply = await client.config_get(name)
        except redis.exceptions.ResponseError as exc:  # CONFIG refused (ACL, managed)
            config_error = str(exc)
            break
        except (redis.exceptions.RedisError, OSError) as exc:
            raise BackendError(f"doctor failed: {exc}", operation="doctor", name=None) from exc
        for key, value in reply.items():
            config[text(key)] = text(value)
    trips: list[float] = []
    for _ in range(5):
        started = time.perf_counter()
        try:
            with translate_errors("doctor", None, _READ_TIMEOUT):
                async with asyncio.timeout(_READ_TIMEOUT):
                    await client.ping()
        except BackendError as exc:
            if not Backend.refused(exc):
                raise
            break  # PING refused (ACL): no round-trip figure
        trips.append(time.perf_counter() - started)
    return ServerFacts(
        info=info,
        config=config,
        config_error=config_error,
        info_error=info_error,
        round_trips=trips,
    )


# --------------------------------------------------------------------------- permissions
def _permission_finding(
    user: str,
    denied: Sequence[str],
    how: str,
    prefix: str,
    *,
    unchecked: Sequence[str] = (),
    sharded: bool = False,
) -> Finding:
    fix = (
        acl_line(user, prefix, sharded=sharded)
        .replace(" reset on >PASSWORD", "")
        .replace(" resetchannels", "")
    )
    needed = [d for d in denied if short(d) not in SHARDED]
    if sharded and denied and not needed:
        return Finding(
            check="permissions",
            severity="warning",
            message=f"user {user!r} may not run: {', '.join(short(d) for d in denied)} "
            f"({how}): release notifications fall back to classic pub/sub, heard on every "
            "node over the cluster bus",
            fix=fix,
        )
    if not denied and unchecked:
        return Finding(
            check="permissions",
            severity="warning",
            message=f"user {user!r} may run the commands aiolock needs on {prefix}:* "
            f"({how}), except perhaps {', '.join(unchecked)}, which could not be checked",
            fix=fix,
        )
    if not denied:
        return Finding(
            check="permissions",
            severity="ok",
            message=f"user {user!r} may run every command aiolock needs on {prefix}:* ({how})",
        )
    return Finding(
        check="permissions",
        severity="problem",
        message=f"user {user!r} may not run: {', '.join(short(d) for d in denied)} "
        f"({how}): locks fail with BackendError",
        fix=fix,
    )


async def _command(client: redis.asyncio.Redis, *args: str) -> object:
    return await client.execute_command(*args)  # type: ignore[no-untyped-call]


def _denied(error: BaseException) -> bool:
    return isinstance(error, redis.exceptions.NoPermissionError) or "NOPERM" in str(error)


async def check_permissions(
    client: redis.asyncio.Redis,
    *,
    prefix: str,
    user: str | None,
    version: str,
    sharded: bool = False,
) -> Finding:
    """ACL DRYRUN for every needed command (Redis ≥ 7), else try them (the connected user).
    `sharded` (a cluster of Redis 7+ or Valkey): sharded pub/sub is checked too; without
    it, notifications fall back to classic pub/sub (a warning, not a problem)."""
    scratch = Scratch.make(prefix)
    try:
        async with asyncio.timeout(_READ_TIMEOUT):
            me = text(await _command(client, "ACL", "WHOAMI"))
    except redis.exceptions.ResponseError:  # WHOAMI refused: the user we connected as
        me = str(client.connection_pool.connection_kwargs.get("username") or "default")
    target = user or me
    reason_no_dryrun = f"ACL DRYRUN needs Redis 7 (this is {version})"
    if _version_tuple(version) >= (7,):
        denied: list[str] = []
        unchecked: list[str] = []
        try:
            for command in (*needed_commands(), *(SHARDED if sharded else ())):
                arguments = scratch.arguments(command)
                if arguments is None:
                    unchecked.append(command)
                    continue
                dryrun = ("ACL", "DRYRUN", target, command, *arguments)
                try:
                    async with asyncio.timeout(_READ_TIMEOUT):
                        reply = text(await _command(client, *dryrun))
                except redis.exceptions.ResponseError as exc:
                    if _denied(exc):
                        raise  # ACL DRYRUN itself refused
                    unchecked.append(command)
                    continue
                if reply != "OK":
                    denied.append(f"{command}: {reply}")
        except redis.exceptions.ResponseError as exc:
            if not _denied(exc):
                raise
            reason_no_dryrun = f"ACL DRYRUN refused to {me!r}"
        else:
            return _permission_finding(
                target,
                denied,
                "checked with ACL DRYRUN",
                prefix,
                unchecked=unchecked,
                sharded=sharded,
            )
    if target != me:
        return Finding(
            check="permissions",
            severity="warning",
            message=f"cannot check user {target!r}: {reason_no_dryrun}",
            fix=f"run the doctor as an admin on Redis ≥ 7, or connect as {target!r}",
        )
    failed, unchecked = await _try_commands(client, scratch)
    return _permission_finding(me, failed, "tried", prefix, unchecked=unchecked)


async def _try_commands(
    client: redis.asyncio.Redis, scratch: Scratch
) -> tuple[list[str], list[str]]:
    """Run every needed command on the scratch keys: the failures, as "command: error",
    and the needed commands the probe does not know how to run."""
    failed: list[str] = []
    needed = set(needed_commands())
    unchecked = sorted(needed - set(PROBE_ORDER) - set(OUTSIDE_SCRIPTS))
    argv: list[str] = []
    for command in PROBE_ORDER:
        arguments = scratch.arguments(command)
        if command not in needed or arguments is None:
            continue
        argv += [command, str(len(arguments)), *arguments]
    keys = [scratch.lock, scratch.holds, scratch.queue]
    try:
        async with asyncio.timeout(_READ_TIMEOUT):
            # Expire the scratch keys even if DEL is refused: PEXPIRE runs before it.
            failed += [text(line) for line in await client.eval(PROBE, len(keys), *keys, *argv)]
    except redis.exceptions.ResponseError as exc:
        failed.append(f"eval: {exc}")
    try:
        async with asyncio.timeout(_READ_TIMEOUT):
            await client.evalsha(PROBE_SHA, len(keys), *keys)
    except redis.exceptions.ResponseError as exc:
        if _denied(exc):
            failed.append(f"evalsha: {exc}")
    try:
        async with asyncio.timeout(_READ_TIMEOUT):
            await client.exists(scratch.lock)
    except redis.exceptions.ResponseError as exc:
        failed.append(f"exists: {exc}")
    try:
        async with asyncio.timeout(_READ_TIMEOUT):
            async with client.pipeline(transaction=True) as pipe:
                pipe.time()
                await pipe.execute()
    except redis.exceptions.ResponseError as exc:  # MULTI or EXEC refused
        failed.append(f"multi: {exc}")
    pubsub = client.pubsub()
    try:
        async with asyncio.timeout(_READ_TIMEOUT):
            await pubsub.subscribe(scratch.channel)
            await pubsub.get_message(timeout=1.0)  # the confirmation, or the refusal
            await pubsub.unsubscribe(scratch.channel)
    except redis.exceptions.ResponseError as exc:
        failed.append(f"subscribe: {exc}")
    finally:
        await pubsub.aclose()
    # Clean up at once where allowed: the scratch keys expire within seconds anyway.
    with contextlib.suppress(redis.exceptions.ResponseError, TimeoutError):
        async with asyncio.timeout(_READ_TIMEOUT):
            await client.delete(*keys)
    return failed, unchecked


# --------------------------------------------------------------------------- all of it
async def diagnose(
    client: redis.asyncio.Redis, *, prefix: str = "aiolock", acl_user: str | None = None
) -> Diagnosis:
    """Read the server's facts, run every check, and check the permissions.

    Raises:
        BackendError: the server could not be reached or refused INFO.
    """
    facts = await read_facts(client)
    findings = [f for check in _PURE_CHECKS if (f := check(facts)) is not None]
    if facts.info_error is not None:
        findings.append(
            Finding(
                check="server",
                severity="warning",
                message=f"INFO refused ({facts.info_error}): the server's settings were not "
                "checked, only the permissions",
                fix="run the doctor as a user allowed INFO and CONFIG GET (an admin)",
            )
        )
    elif facts.config_error is not None:
        findings.append(
            Finding(
                check="config",
                severity="info",
                message=f"CONFIG GET refused ({facts.config_error}); settings read from INFO "
                "where it has them",
            )
        )
    try:
        findings.append(
            await check_permissions(
                client,
                prefix=prefix,
                user=acl_user,
                version=facts.version,
                sharded=_clustered(facts) and _version_tuple(facts.version) >= (7,),
            )
        )
    except (redis.exceptions.RedisError, TimeoutError) as exc:
        findings.append(
            Finding(
                check="permissions",
                severity="warning",
                message=f"could not check the permissions: {exc}",
            )
        )
    server = {
        "product": facts.product,
        "version": facts.version,
        "mode": str(facts.info.get("redis_mode") or facts.info.get("server_mode") or "?"),
        "role": str(facts.info.get("role", "?")),
    }
    return Diagnosis(server=server, findings=tuple(findings))
