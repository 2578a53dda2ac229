"""Ports chosen here are kept from the other processes that choose ports the same way: a
second test suite run beside this one must not start a server on a port this one chose,
nor take it while this one's server restarts there."""

from __future__ import annotations

import json
import selectors
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiolock.testing import RedisServer, ServerBinary, ServerStartError, _ports, _servers

BOUND = 30.0
"""Longest wait for the other process to start, choose its ports, or end."""

OTHER = """
import json, sys
from aiolock.testing import _servers
print(json.dumps(_servers.free_ports(3)), flush=True)
sys.stdin.read()  # hold the claims until told to end
"""


@pytest.fixture
def other_process() -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """Another process that chose three ports and holds them until its stdin closes."""
    with subprocess.Popen(
        [sys.executable, "-c", OTHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            yield child, json.loads(_read_line(child))
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(BOUND)


def _read_line(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        if not selector.select(BOUND):
            pytest.fail(f"the other process chose no ports within {BOUND:g}s")
    return child.stdout.readline()


def _end(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    child.stdin.close()
    try:
        child.wait(BOUND)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the other process did not end within {BOUND:g}s")


def test_ports_another_process_chose_are_not_chosen_here(
    other_process: tuple[subprocess.Popen[str], list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other process chose its ports and has not started its servers yet (they are
    free): the choice here passes them by, though they come first.

    Break seen failing: without the claims, the first three ports chosen here were the
    other process's."""
    child, theirs = other_process
    drawn = iter(theirs)
    real = _servers._port_rng.randrange
    monkeypatch.setattr(
        _servers._port_rng, "randrange", lambda lo, hi: next(drawn, None) or real(lo, hi)
    )
    mine = _servers.free_ports(3)
    assert not set(mine) & set(theirs), (mine, theirs)
    assert all(not _ports.claim(port) for port in theirs)
    _end(child)
    # Its claims ended with it.
    try:
        assert all(_ports.claim(port) for port in theirs)
    finally:
        for port in theirs:
            _ports.release(port)


def test_a_restart_on_a_port_another_process_claimed_meanwhile_is_refused(
    binaries: list[ServerBinary], other_process: tuple[subprocess.Popen[str], list[int]]
) -> None:
    """This process's server stopped; its port is claimed by another process before the
    restart (its claim had been given up): the restart is refused as a taken port, never
    started where the other process's server is about to listen."""
    _, theirs = other_process
    server = RedisServer(binaries[0])
    server.port = theirs[0]
    with pytest.raises(ServerStartError, match="taken") as raised:
        server.start()
    assert raised.value.port_taken
    assert not server.running


def test_a_claim_is_kept_while_its_server_restarts(binaries: list[ServerBinary]) -> None:
    """A server's port stays claimed by this process across stop and start."""
    with RedisServer(binaries[0]) as server:
        port = server.port
        assert _ports.claimed_here(port)
        server.stop()
        assert _ports.claimed_here(port)
        server.start()
        assert server.port == port


def test_the_oldest_claims_are_given_up_beyond_the_cap(tmp_path: Path) -> None:
    """A long run chooses thousands of ports: a process keeps only its latest `HELD`
    (a claim made again counts as the latest)."""
    book = _ports._Book(tmp_path / "ports", held=2)
    try:
        assert book.claim(10001) and book.claim(10002) and book.claim(10001)
        assert book.claim(10003)
        assert book.holds(10001) and book.holds(10003)
        assert not book.holds(10002)
    finally:
        book.close()


def test_servers_started_together_move_to_new_ports_when_one_is_taken(
    binaries: list[ServerBinary], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program that does not choose ports as the tests do listens on the second port of
    the set before its server starts: both servers start again on a new set, and what
    follows their start runs once, when both run (`start_on_free_ports`)."""
    real = _servers.free_ports
    servers = [RedisServer(binaries[0]), RedisServer(binaries[0])]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = int(squatter.getsockname()[1])
        sets: list[list[int]] = []
        ran: list[list[bool]] = []

        def choose(count: int, *, offset: int = 0) -> list[int]:
            ports = real(count, offset=offset)
            sets.append([ports[0], taken] if not sets else ports)
            return sets[-1]

        monkeypatch.setattr(_servers, "free_ports", choose)
        try:
            _servers.start_on_free_ports(
                servers, then=lambda: ran.append([server.running for server in servers])
            )
            assert len(sets) == 2 and ran == [[True, True]]
            assert [server.port for server in servers] == sets[1]
            assert taken not in sets[1]
        finally:
            for server in servers:
                server.stop()


def test_what_follows_the_start_failing_stops_every_server(
    binaries: list[ServerBinary],
) -> None:
    """Its error propagates (no other set of ports is tried), no server is left running."""
    servers = [RedisServer(binaries[0]), RedisServer(binaries[0])]

    def then() -> None:
        raise ServerStartError("the cluster was not up")

    with pytest.raises(ServerStartError, match="not up"):
        _servers.start_on_free_ports(servers, then=then)
    assert [(server.running, server.port) for server in servers] == [(False, 0), (False, 0)]
