"""`aiolock doctor`: each check as a unit, and the command against servers set up to fail."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

import aiolock._ops.doctor
from aiolock._ops.doctor import (
    ACL_LINE,
    ServerFacts,
    check_cluster,
    check_eviction,
    check_latency,
    check_memory,
    check_permissions,
    check_persistence,
    check_replication,
    check_timeout,
    check_version,
    needed_commands,
)

from ..support.servers import RedisServer
from .conftest import Run, closed_port

README = Path(__file__).resolve().parents[2] / "README.md"


def facts(info: dict[str, Any] | None = None, **config: str) -> ServerFacts:
    base = {"redis_version": "7.2.4", "role": "master", "connected_slaves": 0}
    return ServerFacts(
        info={**base, **(info or {})},
        config={k.replace("_", "-"): v for k, v in config.items()},
    )


# --------------------------------------------------------------------------- units
def test_noeviction_is_the_only_safe_policy() -> None:
    ok = check_eviction(facts(maxmemory="1000000", maxmemory_policy="noeviction"))
    assert ok is not None and ok.severity == "ok"
    for policy in ("volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"):
        finding = check_eviction(facts(maxmemory="1000000", maxmemory_policy=policy))
        assert finding is not None and finding.severity == "problem", policy
        assert "expiry" in finding.message  # why volatile-* is not safe: lock keys have one
        assert finding.fix is not None and "noeviction" in finding.fix
    allkeys = check_eviction(facts(maxmemory="1000000", maxmemory_policy="allkeys-lru"))
    assert allkeys is not None and allkeys.severity == "problem"
    unlimited = check_eviction(facts(maxmemory="0", maxmemory_policy="allkeys-lru"))
    assert unlimited is not None and unlimited.severity == "warning"
    assert check_eviction(ServerFacts(info={}, config={})) is None  # unknown: not judged


def test_persistence() -> None:
    none = check_persistence(facts(appendonly="no", save=""))
    assert none is not None and none.severity == "warning"
    assert none.fix is not None and "delayed restart" in none.fix
    rdb = check_persistence(facts(appendonly="no", save="3600 1"))
    assert rdb is not None and rdb.severity == "warning" and "snapshot" in rdb.message
    everysec = check_persistence(facts(appendonly="yes", appendfsync="everysec"))
    assert everysec is not None and everysec.severity == "info"
    always = check_persistence(facts(appendonly="yes", appendfsync="always"))
    assert always is not None and always.severity == "ok"
    from_info = check_persistence(ServerFacts(info={"aof_enabled": 1}, config={}))
    assert from_info is not None and from_info.severity != "warning"


def test_replication_cluster_and_sentinel() -> None:
    replica = check_replication(facts({"role": "slave", "master_host": "10.0.0.1"}))
    assert replica is not None and replica.severity == "problem"
    assert replica.fix is not None and "10.0.0.1" in replica.fix
    primary = check_replication(facts({"connected_slaves": 2}))
    assert primary is not None and primary.severity == "warning"
    assert "master_for" in primary.message
    alone = check_replication(facts())
    assert alone is not None and alone.severity == "ok"
    cluster = check_cluster(facts({"cluster_enabled": 1, "redis_mode": "cluster"}))
    assert cluster is not None and cluster.severity == "warning"
    assert "RedisCluster" in cluster.message and cluster.fix is not None
    sentinel = check_cluster(facts({"redis_mode": "sentinel"}))
    assert sentinel is not None and sentinel.severity == "problem"
    assert check_cluster(facts({"redis_mode": "standalone"})) is None


def test_version_memory_timeout_latency() -> None:
    old = check_version(facts({"redis_version": "6.0.9"}))
    assert old is not None and old.severity == "problem"
    valkey = check_version(facts({"valkey_version": "8.0.1", "redis_version": "7.2.4"}))
    assert valkey is not None and valkey.severity == "ok" and "Valkey 8.0.1" in valkey.message
    full = check_memory(facts({"used_memory": 95}, maxmemory="100"))
    assert full is not None and full.severity == "warning"
    assert check_memory(facts({"used_memory": 50}, maxmemory="100")) is None
    assert check_memory(facts({"used_memory": 50}, maxmemory="0")) is None
    idle = check_timeout(facts(timeout="60"))
    assert idle is not None and "60 s" in idle.message
    assert check_timeout(facts(timeout="0")) is None
    slow = check_latency(ServerFacts(info={}, config={}, round_trips=(0.2, 0.3)))
    assert slow is not None and slow.severity == "warning"


def test_the_readme_acl_line_grants_what_aiolock_needs() -> None:
    """The doctor checks the commands the scripts call; the README must grant the same."""
    line = next(ln for ln in README.read_text().splitlines() if ln.startswith("ACL SETUSER"))
    granted = set(re.findall(r"\+([a-z|]+)", line))
    assert granted == set(needed_commands()), granted ^ set(needed_commands())
    assert line == ACL_LINE


# --------------------------------------------------------------------------- the command
@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    try:
        yield client
    finally:
        client.close()


def doctor(run: Callable[..., Run], url: str, *extra: str) -> tuple[int, dict[str, Any]]:
    result = run("doctor", "--url", url, "--json", *extra)
    assert result.code in {0, 1}, result.err
    return result.code, result.json()


def by_check(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {finding["check"]: finding for finding in report["findings"]}


def test_a_fresh_throwaway_server(server: RedisServer, run: Callable[..., Run]) -> None:
    code, report = doctor(run, server.url)
    found = by_check(report)
    assert code == 0
    assert report["problems"] == 0
    assert found["eviction"]["severity"] == "ok"
    assert found["persistence"]["severity"] == "warning"  # the test servers keep nothing
    assert found["permissions"]["severity"] == "ok"


def test_an_evicting_policy_is_a_problem(
    server: RedisServer, admin: redis.Redis, run: Callable[..., Run]
) -> None:
    admin.config_set("maxmemory", "100mb")
    admin.config_set("maxmemory-policy", "volatile-ttl")
    code, report = doctor(run, server.url)
    assert code == 1
    eviction = by_check(report)["eviction"]
    assert eviction["severity"] == "problem"
    assert "volatile-ttl" in eviction["message"]
    text = run("doctor", "--url", server.url)
    assert text.code == 1
    assert "noeviction" in text.out and "problem" in text.out


def test_the_least_privilege_user_of_the_readme_passes(
    server: RedisServer, admin: redis.Redis, run: Callable[..., Run]
) -> None:
    line = ACL_LINE.replace("aiolock-app", "app").replace("PASSWORD", "pw")
    admin.execute_command(*line.split())  # type: ignore[no-untyped-call]
    code, report = doctor(run, f"redis://app:pw@127.0.0.1:{server.port}/0")
    found = by_check(report)
    assert code == 0, report
    assert found["permissions"]["severity"] == "ok"
    assert found["server"]["severity"] == "warning"  # INFO is not granted: settings unchecked
    # The probe's scratch keys expire within seconds (this user may not delete them).
    assert all(0 < admin.pttl(key) <= 5000 for key in admin.keys("aiolock:{doctor-*"))


def test_missing_permissions_are_named_with_the_fix(
    server: RedisServer, admin: redis.Redis, run: Callable[..., Run]
) -> None:
    line = ACL_LINE.replace("aiolock-app", "app").replace("PASSWORD", "pw")
    reduced = line.replace(" +zrem", "").replace(" +publish", "")
    admin.execute_command(*reduced.split())  # type: ignore[no-untyped-call]
    code, report = doctor(run, f"redis://app:pw@127.0.0.1:{server.port}/0")
    permissions = by_check(report)["permissions"]
    assert code == 1
    assert permissions["severity"] == "problem"
    assert "zrem" in permissions["message"] and "publish" in permissions["message"]
    assert "hset" not in permissions["message"]
    assert "+zrem" in permissions["fix"] and "+publish" in permissions["fix"]
    version = tuple(int(p) for p in admin.info()["redis_version"].split(".")[:2])
    if version >= (7, 0):  # an admin checks another user without its password
        code, report = doctor(run, server.url, "--acl-user", "app")
        assert code == 1
        checked = by_check(report)["permissions"]
        assert "ACL DRYRUN" in checked["message"] and "zrem" in checked["message"]


async def test_on_a_cluster_sharded_pub_sub_is_checked_and_its_lack_is_a_warning(
    server: RedisServer, admin: redis.Redis
) -> None:
    version = tuple(int(p) for p in admin.info()["redis_version"].split(".")[:2])
    if version < (7, 0):
        pytest.skip("ACL DRYRUN and sharded pub/sub need Redis 7")
    line = ACL_LINE.replace("aiolock-app", "app").replace("PASSWORD", "pw")
    admin.execute_command(*line.split())  # type: ignore[no-untyped-call]
    client = redis.asyncio.Redis(port=server.port)
    try:
        lacking = await check_permissions(
            client, prefix="aiolock", user="app", version="7.0.0", sharded=True
        )
        assert lacking.severity == "warning", lacking
        for command in ("spublish", "ssubscribe", "sunsubscribe"):
            assert command in lacking.message and f"+{command}" in (lacking.fix or "")
        assert "classic pub/sub" in lacking.message
        # Not a cluster: not asked for.
        plain = await check_permissions(client, prefix="aiolock", user="app", version="7.0.0")
        assert plain.severity == "ok", plain
        admin.execute_command("ACL", "SETUSER", "app", "+spublish", "+ssubscribe", "+sunsubscribe")  # type: ignore[no-untyped-call]
        granted = await check_permissions(
            client, prefix="aiolock", user="app", version="7.0.0", sharded=True
        )
        assert granted.severity == "ok", granted
        # A lock command missing as well: a problem, and the fix names both.
        admin.execute_command("ACL", "SETUSER", "app", "-zrem", "-spublish")  # type: ignore[no-untyped-call]
        both = await check_permissions(
            client, prefix="aiolock", user="app", version="7.0.0", sharded=True
        )
        assert both.severity == "problem", both
        assert "+zrem" in (both.fix or "") and "+spublish" in (both.fix or "")
    finally:
        await client.aclose()


def test_json_before_or_after_the_command(server: RedisServer, run: Callable[..., Run]) -> None:
    before = run("--json", "--url", server.url, "doctor")
    after = run("doctor", "--url", server.url, "--json")
    assert before.code == after.code == 0
    assert before.json()["server"] == after.json()["server"]
    assert run("--json", "ls", "--url", server.url).json() == []


def test_an_unreachable_server_is_exit_code_2(run: Callable[..., Run]) -> None:
    result = run("doctor", "--url", f"redis://127.0.0.1:{closed_port()}/0")
    assert result.code == 2
    assert "cannot talk to Redis" in result.err


def test_a_command_the_doctor_cannot_check_is_said_not_hidden(
    server: RedisServer, run: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script that starts calling a command the probe has no arguments for (the list of
    commands comes from the scripts themselves) gives a warning naming it, not a crash."""
    known = aiolock._ops.doctor.needed_commands()
    monkeypatch.setattr(aiolock._ops.doctor, "needed_commands", lambda: (*known, "xadd"))
    code, report = doctor(run, server.url)
    permissions = by_check(report)["permissions"]
    assert code == 0
    assert permissions["severity"] == "warning"
    assert "xadd" in permissions["message"] and "could not be checked" in permissions["message"]
