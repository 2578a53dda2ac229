"""An election as a least-privilege ACL user: the lock's ACL line (`test_security.py`) and
the commands of the change log (`ACL_EXTRA`) are all its scripts call, on every server."""

from __future__ import annotations

import asyncio
import re

import pytest

from aiolock import Election, Leader
from aiolock._lua import election as election_scripts
from aiolock._lua.election import IDS_SLACK, IDS_SUFFIX
from aiolock._lua.lock import Script

from ..conftest import make_client
from ..support.servers import RedisServer
from ..support.waits import eventually, within
from .test_security import (
    ACL_SETUSER,
    HANDSHAKE_REFUSALS,
    _log_objects,
    acl_commands,
    any_server,  # noqa: F401 - the fixture, one server per version
)

pytestmark = pytest.mark.real_only

ELECTION_ACL = ACL_SETUSER + "".join(f" +{command}" for command in election_scripts.ACL_EXTRA)


def test_the_election_scripts_call_what_the_lock_line_and_the_extra_grant() -> None:
    scripts = [v for v in vars(election_scripts).values() if isinstance(v, Script)]
    calls = re.compile(r"redis\.p?call\(\s*['\"]([A-Za-z|]+)['\"]")
    needed = {command.lower() for s in scripts for command in calls.findall(s.source)}
    extra = set(election_scripts.ACL_EXTRA)
    assert not needed - acl_commands() - extra, needed - acl_commands() - extra
    assert extra <= needed and not extra & acl_commands()


async def test_an_election_as_a_least_privilege_user(any_server: RedisServer, name: str) -> None:  # noqa: F811
    admin = make_client(any_server.url)
    await admin.execute_command(*ELECTION_ACL.replace("PASSWORD", "s3cret").split())  # type: ignore[no-untyped-call]
    await admin.execute_command("ACL", "LOG", "RESET")  # type: ignore[no-untyped-call]
    user = make_client(any_server.url, username="aiolock-app", password="s3cret")
    other = make_client(any_server.url, username="aiolock-app", password="s3cret")
    try:
        changes = Election(other, name, identity="watcher").observe()
        assert await within(anext(changes), what="the first leader") is None
        election = Election(user, name, ttl=5, identity="a")
        campaign = election.campaign(value="v0")
        term = await within(anext(campaign), what="a term")
        await campaign.aclose()
        await term.proclaim("v1")
        seen: list[Leader | None] = []
        while len(seen) < 2:
            seen.append(await within(anext(changes), what="a change"))
        await term.resign()
        assert await within(anext(changes), what="the end") is None
        assert [(s.identity, s.value) for s in seen if s is not None] == [("a", "v0"), ("a", "v1")]
        await changes.aclose()
        await asyncio.sleep(0)
        refused = set(_log_objects(await admin.execute_command("ACL", "LOG")))  # type: ignore[no-untyped-call]
        assert refused <= HANDSHAKE_REFUSALS, f"the election was refused: {refused}"
    finally:
        await user.aclose()
        await other.aclose()
        await admin.aclose()


async def test_a_transfer_as_a_least_privilege_user(any_server: RedisServer, name: str) -> None:  # noqa: F811
    """A candidate in line (EL_ACQUIRE, with the identities of queues gone removed) and a
    transfer (EL_SUCCESSOR) need nothing beyond the election's line."""
    admin = make_client(any_server.url)
    await admin.execute_command(*ELECTION_ACL.replace("PASSWORD", "s3cret").split())  # type: ignore[no-untyped-call]
    await admin.execute_command("ACL", "LOG", "RESET")  # type: ignore[no-untyped-call]
    user = make_client(any_server.url, username="aiolock-app", password="s3cret")
    other = make_client(any_server.url, username="aiolock-app", password="s3cret")
    try:
        leading = Election(user, name, ttl=5, identity="a")
        campaign = leading.campaign()
        term = await within(anext(campaign), what="a term")
        await campaign.aclose()
        gone = [item for i in range(IDS_SLACK) for item in (f"gone{i}", "x")]
        await admin.hset(leading.key + IDS_SUFFIX, items=[*gone, "#", IDS_SLACK])
        successor = Election(other, name, ttl=5, identity="b").campaign()
        waiting = asyncio.create_task(anext(successor))

        async def queued() -> bool:
            return await admin.hlen(leading.key + IDS_SUFFIX) == 2  # "b" and "#"

        await eventually(queued, what="b in line, the identities of queues gone removed")
        await term.transfer("b")
        taken = await within(waiting, what="b to lead")
        await successor.aclose()
        assert taken.identity == "b"
        await taken.resign()
        refused = set(_log_objects(await admin.execute_command("ACL", "LOG")))  # type: ignore[no-untyped-call]
        assert refused <= HANDSHAKE_REFUSALS, f"the transfer was refused: {refused}"
    finally:
        await user.aclose()
        await other.aclose()
        await admin.aclose()
