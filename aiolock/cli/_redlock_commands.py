"""`show`, `release --force` and `doctor` over a Redlock's independent servers (`--node URL`,
once per node): each node read at once, and the quorum's view."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis.asyncio
from rich import box
from rich.console import Group
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from .._model.holder import LockInfo
from .._ops.doctor import Diagnosis, diagnose
from .._primitives.redlock import Redlock, RedlockInfo, RedlockRelease
from .._transport.backend import Backend
from .._transport.clients import translate_errors
from ..errors import BackendError, QuorumError
from ._connection import connect, redact
from ._errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError, error
from ._json_views import doctor_dict, info_dict, print_json
from ._tables import doctor_renderable, make_console, release_confirmed, rule_width
from ._text import duration, printable, quoted

NODE_TIMEOUT = 1.0
"""Seconds each node is given to answer a read or a release by default (`--node-timeout`;
the smallest bound of a Redlock's `info()`): a dead or frozen node is shown as such after
that, the others read as usual."""

ONE_SERVER_COMMANDS = ("ls", "watch", "stats", "demo")
"""Commands of one server or cluster (`--url`; `demo`: a throwaway one), never a Redlock's
nodes."""


def nodes_of(args: argparse.Namespace, url: str | None) -> list[str] | None:
    """The `--node` URLs given (None: the command reads `--url`); a usage error if the
    command cannot take them, or if `--url` is given too."""
    nodes: list[str] | None = getattr(args, "node", None)
    if not nodes:
        return None
    if args.command in ONE_SERVER_COMMANDS:
        raise UsageError(
            f"{args.command} reads one server or one cluster (--url); a Redlock's --node "
            "servers are read by show, release and doctor"
        )
    if getattr(args, "url", None):
        raise UsageError("give either --url (one server or cluster) or --node (a Redlock's)")
    if len(set(nodes)) != len(nodes):
        raise UsageError("each --node must be another server: one was given twice")
    return nodes


@contextlib.asynccontextmanager
async def _clients(nodes: Sequence[str]) -> AsyncIterator[list[redis.asyncio.Redis]]:
    clients: list[redis.asyncio.Redis] = []
    try:
        clients.extend(connect(url) for url in nodes)  # those made are closed if one fails
        yield clients
    finally:
        for client in clients:
            await client.aclose()


def _quorum_failure(failure: QuorumError) -> int:
    said = ", ".join(
        f"{printable(node)}: {printable(what)}" for node, what in failure.nodes.items()
    )
    error(f"fewer than {failure.quorum} of the nodes could be read ({said})")
    return EXIT_USAGE


def _redlock_dict(info: RedlockInfo | None, name: str, nodes: Sequence[str]) -> dict[str, Any]:
    if info is None:
        return {"name": name, "quorum": len(nodes) // 2 + 1, "holder": None, "nodes": []}
    return {
        "name": name,
        "quorum": info.quorum,
        "holder": info_dict(info.holder),
        "nodes": [
            {"node": node.node, "holder": info_dict(node.holder), "error": node.error}
            for node in info.nodes
        ],
    }


def _redlock_renderable(info: RedlockInfo) -> Group:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("NODE", "HOST", "PID", "TASK", "FENCING TOKEN", "EXPIRES IN"):
        table.add_column(column, justify="right" if column == "PID" else "left")
    for node in info.nodes:
        holder = node.holder
        if node.error is not None:
            table.add_row(printable(node.node), Text(printable(node.error), style="red"))
        elif holder is None:
            table.add_row(printable(node.node), Text("free", style="dim"))
        else:
            table.add_row(
                printable(node.node),
                printable(holder.host),
                str(holder.pid),
                printable(holder.task),
                str(holder.fencing_token),
                duration(holder.expires_in),
            )
    held = info.holder
    quorum = (
        Text(f"no holder of a quorum ({info.quorum} of {len(info.nodes)} nodes)")
        if held is None
        else Text(
            f"held by {printable(held.host)} pid {held.pid} ({printable(held.task)}), fencing "
            f"token {held.fencing_token}: a quorum of {info.quorum} of {len(info.nodes)} nodes"
        )
    )
    return Group(quorum, table)


async def show_redlock(args: argparse.Namespace, nodes: Sequence[str]) -> int:
    async with _clients(nodes) as clients:
        try:
            redlock = Redlock(clients, args.name, prefix=args.prefix, node_timeout=_bound(args))
            info = await redlock.info()
        except QuorumError as exc:
            return _quorum_failure(exc)
    if args.json:
        print_json(_redlock_dict(info, args.name, nodes))
        return EXIT_OK if info is not None else EXIT_FAILED
    console = make_console()
    if info is None:
        console.print(
            f"no node holds Redlock {quoted(args.name)} (prefix {quoted(args.prefix)}, "
            f"{len(nodes)} nodes)"
        )
        return EXIT_FAILED
    console.print(_redlock_renderable(info))
    return EXIT_OK


def _most_held(info: RedlockInfo | None) -> LockInfo | None:
    """The quorum's holder, else the holder of any node (a minority left held)."""
    if info is None:
        return None
    return info.holder or next((n.holder for n in info.nodes if n.holder is not None), None)


async def release_redlock(args: argparse.Namespace, nodes: Sequence[str]) -> int:
    """`release --force` over the nodes (the caller has checked --force and --yes): with
    --yes the nodes are read once, by the eviction itself."""
    console = make_console()
    evicted: RedlockRelease | None = None
    async with _clients(nodes) as clients:
        redlock = Redlock(clients, args.name, prefix=args.prefix, node_timeout=_bound(args))
        try:
            holder = None if args.yes else _most_held(await redlock.info())
            if not args.yes and holder is None:
                outcome = "not_held"
            elif not args.yes and holder is not None and not release_confirmed(console, holder):
                outcome = "declined"
            else:
                evicted = await redlock.force_release()
                outcome = "released" if evicted is not None else "not_held"
        except QuorumError as exc:
            return _quorum_failure(exc)
    if args.json:
        print_json(
            {
                "name": args.name,
                "outcome": outcome,
                "released": evicted is not None,
                "holder": info_dict(evicted.holder if evicted is not None else None),
                "nodes": list(evicted.released) if evicted is not None else [],
                "unknown": list(evicted.unknown) if evicted is not None else [],
            }
        )
    elif evicted is not None:
        console.print(_released_text(args.name, evicted, len(nodes)))
    elif outcome == "declined":
        console.print(f"left Redlock {quoted(args.name)} as it is")
    else:
        console.print(f"Redlock {quoted(args.name)} is not held: nothing released")
    return EXIT_OK if evicted is not None else EXIT_FAILED


def _released_text(name: str, evicted: RedlockRelease, count: int) -> str:
    """What `release --force` deleted, and where, in a sentence or two."""
    where = ", ".join(printable(node) for node in evicted.released)
    said = (
        f"released Redlock {quoted(name)} on {len(evicted.released)} of {count} nodes "
        f"({where}), fencing token {evicted.holder.fencing_token}: "
    )
    if evicted.majority:
        said += "its holder finds out at its next renewal"
    else:
        said += (
            f"its holder held fewer than a quorum ({evicted.quorum}): keys left by an "
            "acquire or a lease that ended"
        )
    if evicted.unknown:
        unknown = ", ".join(printable(node) for node in evicted.unknown)
        said += f"; not read or no answer, its key left to expire there: {unknown}"
    return said


async def doctor_redlock(args: argparse.Namespace, nodes: Sequence[str]) -> int:
    """`doctor` on every node at once; a node that cannot be read (that does not answer a
    PING within the node timeout) is a problem of its own."""
    async with _clients(nodes) as clients:
        diagnosed = await asyncio.gather(
            *(_diagnose_node(client, args) for client in clients), return_exceptions=True
        )
    for failure in diagnosed:
        if isinstance(failure, BaseException) and not isinstance(failure, BackendError):
            raise failure
    reports: list[tuple[str, Diagnosis | str]] = [
        (redact(url), _said(one)) for url, one in zip(nodes, diagnosed, strict=True)
    ]
    failed = any(isinstance(found, str) or found.problems for _, found in reports)
    if args.json:
        print_json(
            {
                "nodes": [
                    {"url": where, "error": found}
                    if isinstance(found, str)
                    else doctor_dict(found, where)
                    for where, found in reports
                ]
            }
        )
        return EXIT_FAILED if failed else EXIT_OK
    console = make_console()
    for where, found in reports:
        console.print(Rule(f"node {printable(where)}", align="left"), width=rule_width(console))
        if isinstance(found, str):
            console.print(Text(f"cannot talk to Redis at {where}: {found}", style="red"))
        else:
            console.print(doctor_renderable(found, where))
    return EXIT_FAILED if failed else EXIT_OK


async def _diagnose_node(client: redis.asyncio.Redis, args: argparse.Namespace) -> Diagnosis:
    """The doctor's checks on one node, once it answered a PING within the node timeout
    (a PING refused, by an ACL, is an answer: the checks say what is refused)."""
    bound = _bound(args)
    try:
        with translate_errors("ping", None, bound):
            async with asyncio.timeout(bound):
                await client.ping()
    except BackendError as exc:
        if not Backend.refused(exc):
            raise
    return await diagnose(client, prefix=args.prefix, acl_user=args.acl_user)


def _bound(args: argparse.Namespace) -> float:
    """Seconds each node is given to answer (`--node-timeout`)."""
    return float(getattr(args, "node_timeout", None) or NODE_TIMEOUT)


def _said(found: Diagnosis | BaseException) -> Diagnosis | str:
    """A node's diagnosis, or why it has none, as printable text."""
    if isinstance(found, Diagnosis):
        return found
    return printable(" ".join(str(found.__cause__ or found).split()) or str(found))
