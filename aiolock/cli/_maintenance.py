"""The commands that act on a server or check it: `release --force` and `doctor`."""

from __future__ import annotations

import argparse
import sys

from .._model.holder import LockInfo
from .._ops.doctor import diagnose
from .._ops.inspection import force_release
from ._connection import DEFAULT_URL, connect, open_client, redact
from ._errors import EXIT_FAILED, EXIT_OK, UsageError
from ._json_views import doctor_dict, print_json, release_dict
from ._redlock_commands import doctor_redlock, nodes_of, release_redlock
from ._tables import doctor_renderable, make_console, release_confirmed, release_message
from ._text import quoted


async def release_command(args: argparse.Namespace, url: str | None) -> int:
    if not args.force:
        raise UsageError(
            f"release evicts the current holder of {quoted(args.name)}: confirm with --force"
        )
    interactive = sys.stdin.isatty()
    if not args.yes and not interactive:
        raise UsageError(
            "refusing to force-release without confirmation: stdin is not a terminal; "
            "pass --yes to confirm"
        )
    nodes = nodes_of(args, url)
    if nodes is not None:
        return await release_redlock(args, nodes)
    console = make_console()

    async def confirm(holder: LockInfo) -> bool:
        return args.yes or release_confirmed(console, holder)

    client = await open_client(url)
    try:
        result = await force_release(client, args.name, prefix=args.prefix, confirm=confirm)
    finally:
        await client.aclose()
    if args.json:
        print_json(release_dict(result, args.name))
    else:
        console.print(release_message(result, args.name))
    return EXIT_OK if result.outcome == "released" else EXIT_FAILED


async def doctor_command(args: argparse.Namespace, url: str | None) -> int:
    nodes = nodes_of(args, url)
    if nodes is not None:
        return await doctor_redlock(args, nodes)
    client = connect(url)
    try:
        diagnosis = await diagnose(client, prefix=args.prefix, acl_user=args.acl_user)
    finally:
        await client.aclose()
    code = EXIT_FAILED if diagnosis.problems else EXIT_OK
    if args.json:
        print_json(doctor_dict(diagnosis, redact(url or DEFAULT_URL)))
        return code
    make_console().print(doctor_renderable(diagnosis, redact(url or DEFAULT_URL)))
    return code
