"""The commands that read: `ls`, `show`, `watch` and `stats`."""

from __future__ import annotations

import argparse
import asyncio
import datetime
from collections.abc import Iterator, Sequence
from typing import Any

from rich.live import Live
from rich.rule import Rule

from .._ops.inspection import KINDS, Kind, LockState, read_locks, scan_lock_names
from .._transport.clients import AsyncClient
from ._connection import DEFAULT_URL, open_client, redact
from ._errors import EXIT_FAILED, EXIT_OK
from ._json_views import in_use, print_json, row_dict, show_dict, stats_dict
from ._parser import chosen_kinds
from ._redlock_commands import nodes_of, show_redlock
from ._tables import (
    kind_and_name,
    locks_table,
    make_console,
    rule_width,
    show_renderable,
    stats_table,
)
from ._text import and_list, article, duration, printable, quoted


async def ls_command(args: argparse.Namespace, url: str | None) -> int:
    nodes_of(args, url)  # refused here
    kinds = chosen_kinds(args)
    client = await open_client(url)
    try:
        states = await _held(client, args.prefix, args.pattern, kinds)
    finally:
        await client.aclose()
    if args.json:
        print_json([row_dict(state) for state in states])
        return EXIT_OK
    console = make_console()
    if not states:
        console.print(
            f"no {_what(kinds)} in use (prefix {quoted(args.prefix)}, pattern "
            f"{quoted(args.pattern)})"
        )
        return EXIT_OK
    console.print(locks_table(states))
    return EXIT_OK


async def show_command(args: argparse.Namespace, url: str | None) -> int:
    nodes = nodes_of(args, url)
    if nodes is not None:
        return await show_redlock(args, nodes)
    kinds = chosen_kinds(args)
    client = await open_client(url)
    try:
        states = {
            kind.label: (
                await read_locks(client, [args.name], prefix=args.prefix, kind=kind.infix)
            )[0]
            for kind in kinds
        }
    finally:
        await client.aclose()
    known = [state for state in states.values() if state.known]
    if args.json:
        shown: dict[str, Any] = {"name": args.name}
        for kind in KINDS:
            state = states.get(kind.label)
            shown[kind.label] = (
                show_dict(state, args.prefix, kind) if state is not None and state.known else None
            )
        print_json(shown)
        return EXIT_OK if known else EXIT_FAILED
    console = make_console()
    if not known:
        console.print(
            f"nothing known about {and_list([k.label for k in kinds], 'or')} {quoted(args.name)} "
            f"(prefix {quoted(args.prefix)})"
        )
        return EXIT_FAILED
    if len(known) == 1:
        console.print(show_renderable(known[0], args.prefix))
        return EXIT_OK
    console.print(
        f"{quoted(args.name)} is {'both ' if len(known) == 2 else ''}"
        f"{and_list([f'{article(state.kind)} {state.kind}' for state in known])} (separate keys, "
        "unrelated); --kind shows one"
    )
    for state in known:
        console.print(Rule(kind_and_name(state), align="left"), width=rule_width(console))
        console.print(show_renderable(state, args.prefix))
    return EXIT_OK


async def watch_command(args: argparse.Namespace, url: str | None) -> int:
    nodes_of(args, url)  # refused here
    kinds = chosen_kinds(args)
    client = await open_client(url)
    where = printable(redact(url or DEFAULT_URL))
    try:
        if args.json:
            for last in _refreshes(args.count):
                states = await _held(client, args.prefix, args.pattern, kinds)
                print_json([row_dict(state) for state in states], indent=None)
                if not last:
                    await asyncio.sleep(args.interval)
            return EXIT_OK
        console = make_console()
        with Live(console=console, auto_refresh=False, transient=False) as live:
            for last in _refreshes(args.count):
                states = await _held(client, args.prefix, args.pattern, kinds)
                now = datetime.datetime.now().astimezone().strftime("%H:%M:%S")
                counts = ", ".join(
                    f"{sum(state.kind == kind.label for state in states)} {kind.label}(s)"
                    for kind in kinds
                )
                title = f"{counts} in use at {now} on {where}, every {duration(args.interval)}" + (
                    "" if args.count else " (Ctrl-C to stop)"
                )
                live.update(locks_table(states, title=title), refresh=True)
                if not last:
                    await asyncio.sleep(args.interval)
        return EXIT_OK
    finally:
        await client.aclose()


def _refreshes(count: int | None) -> Iterator[bool]:
    """One item per refresh, True for the last one (none is last without a count).

    A cancellation of the command's task (Ctrl-C) that was swallowed on the way ends the
    refreshes: on Python 3.11 `asyncio.wait_for`, which redis-py sends with when a socket
    timeout is set, loses a cancellation that lands as the awaited call completes, and the
    task goes on as if none had come."""
    done = 0
    while count is None or done < count:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        done += 1
        yield count is not None and done >= count


async def stats_command(args: argparse.Namespace, url: str | None) -> int:
    nodes_of(args, url)  # refused here
    kinds = chosen_kinds(args)
    client = await open_client(url)
    try:
        states = await _scan_states(client, args.prefix, args.pattern, kinds, with_holds=True)
    finally:
        await client.aclose()
    all_stats = [(state.kind, state.hold_stats(ttl=args.ttl)) for state in states]
    if args.json:
        print_json([{"kind": kind, **stats_dict(stats)} for kind, stats in all_stats])
        return EXIT_OK
    console = make_console()
    if not all_stats:
        console.print(
            f"no {_what(kinds)} with recorded holds (prefix {quoted(args.prefix)}, pattern "
            f"{quoted(args.pattern)})"
        )
        return EXIT_OK
    console.print(stats_table(all_stats))
    return EXIT_OK


async def _scan_states(
    client: AsyncClient,
    prefix: str,
    pattern: str,
    kinds: Sequence[Kind],
    *,
    with_holds: bool = False,
) -> list[LockState]:
    """A snapshot of every name of `kinds` matching `pattern`, by name, then kind."""
    states: list[LockState] = []
    for kind in kinds:
        names = await scan_lock_names(
            client, prefix=prefix, pattern=pattern, with_holds=with_holds, kind=kind.infix
        )
        states.extend(await read_locks(client, names, prefix=prefix, kind=kind.infix))
    order = {kind.label: i for i, kind in enumerate(KINDS)}
    return sorted(states, key=lambda state: (state.name, order[state.kind]))


async def _held(
    client: AsyncClient, prefix: str, pattern: str, kinds: Sequence[Kind] = KINDS
) -> list[LockState]:
    return [state for state in await _scan_states(client, prefix, pattern, kinds) if in_use(state)]


def _what(kinds: Sequence[Kind]) -> str:
    """ "locks, semaphores or rwlocks", "locks", ... for messages."""
    return and_list([f"{kind.label}s" for kind in kinds], "or")
