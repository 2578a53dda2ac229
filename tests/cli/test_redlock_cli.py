"""The command line over a Redlock's independent servers (`--node URL`, once per node):
`show` reads every node and the quorum's holder, `release --force` evicts it on every node,
`doctor` checks each node; commands that read one server refuse `--node`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
import redis.asyncio

from aiolock import Lease, LeaseLostError, LossReason, Redlock

from ..support.load import scaled
from ..support.servers import (
    RedisServer,
    ServerBinary,
    clients_of,
    independent_servers,
    quorum_calls_ended,
)
from ..support.waits import within
from .conftest import Run, closed_port


@pytest.fixture(scope="module")
def three(binaries: list[ServerBinary]) -> Iterator[list[RedisServer]]:
    """Three independent servers, shared by this module's tests (each uses names of its own)."""
    with independent_servers(binaries[0], 3) as started:
        yield started


@pytest.fixture
async def clients(three: list[RedisServer]) -> AsyncIterator[list[redis.asyncio.Redis]]:
    """A client of each of the three servers, for the Redlock a test holds."""
    async with clients_of(three) as made:
        yield made


def node_args(servers: list[RedisServer]) -> list[str]:
    return [arg for server in servers for arg in ("--node", server.url)]


async def test_show_reads_every_node_and_the_quorums_holder(
    three: list[RedisServer],
    clients: list[redis.asyncio.Redis],
    tag: str,
    arun: Callable[..., Awaitable[Run]],
) -> None:
    name = f"{tag}:show"
    free = await arun("show", name, *node_args(three), "--json")
    assert free.code == 1 and free.json()["holder"] is None
    lease = await Redlock(clients, name, ttl=30).acquire()
    await quorum_calls_ended(clients)  # (the third node's acquire landed too)
    shown = await arun("show", name, *node_args(three), "--json")
    assert shown.code == 0, shown.err
    data = shown.json()
    assert data["quorum"] == 2
    assert data["holder"]["fencing_token"] == lease.fencing_token
    assert [n["holder"]["fencing_token"] for n in data["nodes"]] == [lease.fencing_token] * 3
    assert {n["node"] for n in data["nodes"]} == {f"127.0.0.1:{s.port}" for s in three}
    table = await arun("show", name, *node_args(three))
    assert table.code == 0
    assert str(lease.fencing_token) in table.out and "a quorum of 2 of 3" in table.out
    # A node that does not answer: shown with its error, the quorum's view kept.
    unreachable = f"redis://127.0.0.1:{closed_port()}/0"
    partly = await arun("show", name, *node_args(three[:2]), "--node", unreachable, "--json")
    assert partly.code == 0, partly.err
    errors = [n["error"] for n in partly.json()["nodes"]]
    assert errors[:2] == [None, None] and errors[2]
    assert partly.json()["holder"]["fencing_token"] == lease.fencing_token
    # Fewer than a quorum answer: said, with each node's error, exit code 2.
    failed = await arun(
        "show", name, "--node", three[0].url, "--node", unreachable, "--node",
        f"redis://127.0.0.1:{closed_port()}/0",
    )  # fmt: skip
    assert failed.code == 2 and "fewer than 2 of the nodes" in failed.err
    await lease.release()


async def test_release_force_evicts_the_holder_on_every_node(
    three: list[RedisServer],
    clients: list[redis.asyncio.Redis],
    tag: str,
    arun: Callable[..., Awaitable[Run]],
) -> None:
    name = f"{tag}:release"
    lease = await Redlock(clients, name, ttl=30, renew_interval=0.2).acquire()
    await quorum_calls_ended(clients)  # (the third node's acquire landed too)
    done = await arun("release", name, "--force", "--yes", *node_args(three), "--json")
    assert done.code == 0, done.err
    assert done.json()["holder"]["fencing_token"] == lease.fencing_token
    loss = await within(lease.wait_lost(), what="the holder told of its eviction")
    assert loss is not None and loss.reason is LossReason.NOT_OWNER
    again = await arun("release", name, "--force", "--yes", *node_args(three), "--json")
    assert again.code == 1 and again.json()["outcome"] == "not_held"
    refused = await arun("release", name, "--force", *node_args(three))  # stdin not a tty
    assert refused.code == 2 and "--yes" in refused.err


async def test_release_force_of_a_minority_says_what_it_deleted_and_where(
    three: list[RedisServer],
    clients: list[redis.asyncio.Redis],
    tag: str,
    arun: Callable[..., Awaitable[Run]],
) -> None:
    """Held on one node of three (a Redlock over it alone): `release --force` deletes it
    there and says so, naming the node (exit code 0), rather than "not held: nothing
    released" (exit code 1)."""
    name = f"{tag}:minority"
    where = f"127.0.0.1:{three[0].port}"
    async with contextlib.AsyncExitStack() as leases:
        lease = await Redlock(clients[:1], name, ttl=30).acquire()
        leases.push_async_callback(released, lease)
        done = await arun("release", name, "--force", "--yes", *node_args(three), "--json")
        assert done.code == 0, (done.out, done.err)
        data = done.json()
        assert data["outcome"] == "released" and data["released"] is True
        assert data["nodes"] == [where] and data["unknown"] == []
        assert data["holder"]["fencing_token"] == lease.fencing_token
        assert await clients[0].hget(f"aiolock:rl:{{{name}}}", "token") is None
        lease = await Redlock(clients[:1], name, ttl=30).acquire()
        leases.push_async_callback(released, lease)
        table = await arun("release", name, "--force", "--yes", *node_args(three))
        assert table.code == 0, (table.out, table.err)
        assert where in table.out and "1 of 3" in table.out, table.out
        assert str(lease.fencing_token) in table.out, table.out


async def released(lease: Lease) -> None:
    """Release `lease` if still held (evicted: it is lost, which its release says)."""
    with contextlib.suppress(LeaseLostError):
        await lease.release()


@pytest.mark.parametrize("fault", ["killed", "frozen"])
async def test_a_dead_or_frozen_node_is_waited_for_the_node_timeout(
    binaries: list[ServerBinary], tag: str, arun: Callable[..., Awaitable[Run]], fault: str
) -> None:
    """One node of three killed or frozen (SIGSTOP): `show`, `release --force --yes` and
    `doctor` read every node, and give the failed one the node timeout to answer (1 s
    by default; `--node-timeout`, here more on a loaded machine), shown as such, the
    others read as usual, rather than their connections' 5 s per command."""
    name = f"{tag}:failed"
    with independent_servers(binaries[0], 3) as servers:
        async with clients_of(servers) as clients:
            lease = await Redlock(clients, name, ttl=30).acquire()
            await quorum_calls_ended(clients)
            if fault == "killed":
                servers[2].kill()
            else:
                servers[2].pause()
            try:
                timings: dict[str, float] = {}
                bound = max(1.0, scaled(1.0))
                given = [*node_args(servers), "--node-timeout", f"{bound:g}", "--json"]
                loop = asyncio.get_running_loop()
                runs: dict[str, Run] = {}
                for command in (["show", name], ["doctor"], ["release", name, "--force", "--yes"]):
                    began = loop.time()
                    runs[command[0]] = await arun(*command, *given)
                    timings[command[0]] = loop.time() - began
            finally:
                if fault == "frozen":
                    servers[2].resume()
                await released(lease)
                await quorum_calls_ended(clients)  # (the failed node's release ended too)
    shown = runs["show"].json()
    assert runs["show"].code == 0, runs["show"].err
    assert shown["holder"]["fencing_token"] == lease.fencing_token
    assert [n["error"] is not None for n in shown["nodes"]] == [False, False, True]
    doctor = runs["doctor"].json()["nodes"]
    assert all("findings" in n for n in doctor[:2]) and doctor[2]["error"]
    evicted = runs["release"].json()
    assert runs["release"].code == 0, runs["release"].err
    assert evicted["unknown"] == [f"127.0.0.1:{servers[2].port}"] and len(evicted["nodes"]) == 2
    if fault == "frozen":
        for said in (shown["nodes"][2]["error"], doctor[2]["error"]):
            assert f"{bound:.3g}s" in said, said
    for what, took in timings.items():
        assert took < bound + scaled(1.5), (what, timings)


def test_doctor_checks_each_node(three: list[RedisServer], run: Callable[..., Run]) -> None:
    unreachable = f"redis://127.0.0.1:{closed_port()}/0"
    report = run("doctor", *node_args(three[:2]), "--node", unreachable, "--json")
    nodes = report.json()["nodes"]
    assert [n["url"] for n in nodes] == [three[0].url, three[1].url, unreachable]
    assert all("findings" in n for n in nodes[:2]) and nodes[2]["error"]
    assert report.code == 1  # a node that cannot be read is a problem
    healthy = run("doctor", *node_args(three))
    assert healthy.code == 0, healthy.out
    assert all(f"node {server.url}" in healthy.out for server in three)


@pytest.mark.parametrize("command", ["ls", "watch", "stats", "demo"])
def test_commands_of_one_server_refuse_nodes(
    three: list[RedisServer], run: Callable[..., Run], command: str
) -> None:
    refused = run(command, *node_args(three))
    assert refused.code == 2 and "--url" in refused.err and "--node" in refused.err


def test_url_and_nodes_together_or_a_node_twice_are_refused(
    three: list[RedisServer], run: Callable[..., Run]
) -> None:
    both = run("show", "x", "--url", three[0].url, *node_args(three))
    assert both.code == 2 and "either --url" in both.err
    twice = run("show", "x", "--node", three[0].url, "--node", three[0].url)
    assert twice.code == 2 and "twice" in twice.err


async def test_nodes_given_before_the_command_work_too(
    three: list[RedisServer], tag: str, arun: Callable[..., Awaitable[Run]]
) -> None:
    shown = await arun(*node_args(three), "show", f"{tag}:free", "--json")
    assert shown.code == 1 and shown.json()["holder"] is None
