"""`aiolock demo`: the flash sale of `aiolock.cli._flash_sale` run from the command line, with a
progress bar on a terminal and its summary as a table (or JSON)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .._model.config import LockConfig
from .._transport.clients import translate_errors
from ._connection import CONNECT_TIMEOUT, connect, redact
from ._errors import EXIT_FAILED, EXIT_OK
from ._flash_sale import DemoConfig, DemoSummary, demo_server, run_demo
from ._json_views import print_json
from ._redlock_commands import nodes_of
from ._tables import demo_table, make_console
from ._text import duration, printable


async def demo_command(args: argparse.Namespace, url: str | None) -> int:
    nodes_of(args, url)  # refused here
    # The lock's settings fail here, not in every worker process (ConfigError: exit 2).
    LockConfig.build(
        ttl=args.ttl, renew=True, renew_interval=None, timeout=None, max_hold=None,
        prefix=args.prefix,
    )  # fmt: skip
    config = DemoConfig(
        stock=args.stock,
        workers=args.workers,
        processes=min(args.processes, args.workers),
        ttl=args.ttl,
        hold=args.hold,
        slow_holds=args.slow_holds,
        slow_hold=args.slow_hold,
        prefix=args.prefix,
    )
    if url is not None and not args.fakeredis:
        # A clear error for a wrong --url before any process starts.
        client = connect(url)
        try:
            with translate_errors("ping", None, CONNECT_TIMEOUT):
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    await client.ping()
        finally:
            await client.aclose()
    console = make_console()
    async with demo_server(
        None if args.fakeredis else url,
        fakeredis_only=args.fakeredis,
        label=redact(url) if url else None,
    ) as server:
        if args.json:
            summary = await run_demo(server, config)
            print_json(summary.as_dict())
            return EXIT_OK if summary.ok else EXIT_FAILED
        how = f"{config.processes} processes" if server.url is not None else "tasks of this process"
        console.print(
            f"flash sale: {config.stock} units, {config.workers} workers in {how}, one lock "
            f"with ttl {duration(config.ttl)}\n{config.slow_holds} slow hold(s) of "
            f"{duration(config.slow_hold)} outlive the ttl on purpose, kept by the watchdog\n"
            f"server: {printable(server.description)}"
        )
        summary = await _demo_with_progress(
            console, config, lambda cb: run_demo(server, config, on_progress=cb)
        )
    console.print(demo_table(summary))
    return EXIT_OK if summary.ok else EXIT_FAILED


async def _demo_with_progress(
    console: Console,
    config: DemoConfig,
    run: Callable[[Callable[[int], None] | None], Awaitable[DemoSummary]],
) -> DemoSummary:
    if not console.is_terminal:
        return await run(None)
    progress = Progress(
        TextColumn("selling"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = progress.add_task("sold", total=config.stock)
    with progress:
        return await run(lambda sold: progress.update(task, completed=sold))
