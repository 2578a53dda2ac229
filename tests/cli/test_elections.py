"""Elections in `aiolock ls`, `show` and `watch`: the leader's identity, its term, its
value and the candidates waiting, beside the other kinds, against a real server.

Each client stands for a process (its own wait queue).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio

from aiolock import Election, Lock, Term
from aiolock._model.holder import HOST

from ..support.waits import within
from .conftest import Run, eventually

pytestmark = pytest.mark.real_only

AsyncRunCli = Callable[..., Awaitable[Run]]


async def test_ls_show_and_watch_name_the_leader_its_term_and_the_candidates(
    server_url: str, tag: str, clients: list[redis.asyncio.Redis], arun: AsyncRunCli
) -> None:
    name = f"{tag}:scheduler"
    leader = Election(clients[0], name, ttl=20, identity="host-a:1234")
    terms = leader.campaign(value="http://host-a:8080")
    term: Term = await within(
        asyncio.create_task(anext(terms), name="scheduling"), what="the first term"
    )
    campaigns = [Election(clients[i], name, ttl=20, identity=f"c{i}").campaign() for i in (1, 2)]
    waiting = [asyncio.create_task(anext(campaign)) for campaign in campaigns]
    lock = await Lock(clients[0], f"{tag}:other", ttl=10).acquire()

    async def rows() -> list[dict[str, Any]]:
        result = await arun("--url", server_url, "ls", f"{tag}:*", "--json")
        assert result.code == 0, result.err
        listed: list[dict[str, Any]] = result.json()
        return listed

    async def both_waiting() -> bool:
        return any(row["waiters"] == 2 for row in await rows())

    try:
        await eventually(both_waiting, what="ls shows the two candidates waiting")
        listed = await rows()
        assert [(row["name"], row["kind"]) for row in listed] == [
            (f"{tag}:other", "lock"),
            (name, "election"),
        ]
        assert len({tuple(row) for row in listed}) == 1  # the same keys, whatever the kind
        other, election = listed
        assert other["leader"] is None
        assert (election["leader"], election["state"], election["held"]) == (
            "host-a:1234", "held", 1,
        )  # fmt: skip
        assert election["fencing_token"] == term.fencing_token
        assert (election["host"], election["pid"], election["task"]) == (
            HOST, os.getpid(), "scheduling",
        )  # fmt: skip

        table = await arun("--url", server_url, "ls", f"{tag}:*")
        (line,) = [ln for ln in table.out.splitlines() if "election" in ln]
        for text in ("host-a:1234", str(term.fencing_token), "1/1"):
            assert text in line, text
        assert line.split()[-1] == "2"

        shown = await arun("--url", server_url, "show", name, "--kind", "election", "--json")
        assert shown.code == 0, shown.err
        detail = shown.json()["election"]
        assert detail["key"] == f"aiolock:el:{{{name}}}"
        assert detail["leader"] == {
            "name": name,
            "identity": "host-a:1234",
            "fencing_token": term.fencing_token,
            "since": term.since,
            "value": "http://host-a:8080",
            "term": term.fencing_token,  # its deprecated old name, until 0.2
        }
        assert [entry["count"] for entry in detail["queue"]] == [1, 1]
        text = (await arun("--url", server_url, "show", name)).out
        for expected in (
            "election",
            "'host-a:1234'",
            "'http://host-a:8080'",
            "2 waiting",
            "candidates: 2 process(es), 2 waiter(s)",
        ):
            assert expected in text, expected
        rows_shown = [ln.split() for ln in text.splitlines()]
        assert ["term", "fencing", "token", str(term.fencing_token)] in rows_shown

        only = await arun("--url", server_url, "ls", f"{tag}:*", "--kind", "election", "--json")
        assert [row["name"] for row in only.json()] == [name]
        live = await arun("--url", server_url, "watch", f"{tag}:*", "--count", "1")
        assert "1 lock(s), 0 semaphore(s), 0 rwlock(s), 1 election(s) in use" in live.out
        assert "host-a:1234" in live.out
    finally:
        await lock.release()
        await terms.aclose()
        await term.resign()
        pending = dict(zip(waiting, campaigns, strict=True))
        while pending:  # in the order they queued (which the tasks' order does not say)
            done, _ = await asyncio.wait(pending, timeout=10, return_when=asyncio.FIRST_COMPLETED)
            assert done, "no candidate got the term"
            for task in done:
                await pending.pop(task).aclose()
                await task.result().resign()
    shown = await arun("--url", server_url, "show", name, "--kind", "election", "--json")
    assert shown.json()["election"]["leader"] is None
