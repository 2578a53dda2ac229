"""The arguments: one parser for every command, the options they share (before or after
the command) and the checks of numbers given."""

from __future__ import annotations

import argparse
from typing import Any

from .. import __version__
from .._ops.inspection import KINDS, Kind, kind_named
from .._version import DISTRIBUTION
from ._connection import DEFAULT_URL
from ._flash_sale import DemoConfig
from ._text import and_list


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _connection_options(common, argparse.SUPPRESS)
    parser = argparse.ArgumentParser(
        prog="aiolock",
        description="See and manage aiolock locks, semaphores, read-write locks and elections in "
        "a Redis server.",
        epilog="exit codes: 0 ok, 1 operation failed, 2 usage or connection error, 130 interrupted",
    )
    parser.add_argument(
        "--version", action="version", version=f"aiolock {__version__} ({DISTRIBUTION})"
    )
    _connection_options(parser, None)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help_, description=help_, parents=[common])

    ls = command("ls", "list the locks, semaphores, read-write locks and elections in use")
    ls.add_argument("pattern", nargs="?", default="*", help="glob on names (default *)")
    _kind_option(ls)

    show = command(
        "show", "show everything known about one lock, semaphore, read-write lock or election"
    )
    show.add_argument("name", help="the lock's, semaphore's, read-write lock's or election's name")
    _kind_option(show)

    release = command("release", "evict the holder of a lock (token-guarded)")
    release.add_argument("name", help="the lock's name")
    release.add_argument("--force", action="store_true", help="required: yes, evict the holder")
    release.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")

    watch = command(
        "watch",
        "a live table of the locks, semaphores, read-write locks and elections in use, until Ctrl-C",
    )
    watch.add_argument("pattern", nargs="?", default="*", help="glob on names (default *)")
    _kind_option(watch)
    watch.add_argument("--interval", type=_seconds, default=1.0, help="seconds between refreshes")
    watch.add_argument("--count", type=_positive_int, default=None, help="refresh N times, exit")

    stats = command(
        "stats",
        "hold times per lock, semaphore, read-write lock and election, and the ttl they suggest",
    )
    stats.add_argument("pattern", nargs="?", default="*", help="glob on names (default *)")
    stats.add_argument(
        "--ttl", type=_seconds, default=None, help="ttl your code uses, for names not held now"
    )
    _kind_option(stats)

    doctor = command("doctor", "check a server for what can break locks, and say what to change")
    doctor.add_argument(
        "--acl-user",
        default=None,
        help="check this ACL user's permissions (default: the connected user; another "
        "user needs Redis >= 7 and a connection allowed to run ACL DRYRUN)",
    )

    demo = command("demo", "a flash sale under aiolock, on a throwaway server, checked")
    defaults = DemoConfig()
    demo.add_argument("--stock", type=_positive_int, default=defaults.stock, help="units")
    demo.add_argument("--workers", type=_positive_int, default=defaults.workers)
    demo.add_argument("--processes", type=_positive_int, default=defaults.processes)
    demo.add_argument("--ttl", type=_seconds, default=defaults.ttl, help="lock ttl, seconds")
    demo.add_argument("--hold", type=_seconds, default=defaults.hold, help="mean hold, seconds")
    demo.add_argument("--slow-holds", type=_non_negative_int, default=defaults.slow_holds)
    demo.add_argument(
        "--slow-hold", type=_seconds, default=defaults.slow_hold, help="seconds (> ttl)"
    )
    demo.add_argument(
        "--fakeredis",
        action="store_true",
        help="run on fakeredis in this process (workers become tasks)",
    )
    return parser


def _connection_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "--url",
        default=default,
        help=f"Redis URL (default: $REDIS_URL, else {DEFAULT_URL}; for demo: a throwaway server)",
    )
    parser.add_argument(
        "--node",
        action="append",
        default=argparse.SUPPRESS if default is argparse.SUPPRESS else None,
        metavar="URL",
        help="a Redlock's server, once per node (instead of --url): show, release and "
        "doctor read the name on every node, and show the quorum's holder",
    )
    parser.add_argument(
        "--node-timeout",
        type=_node_timeout,
        default=argparse.SUPPRESS if default is argparse.SUPPRESS else 1.0,
        metavar="SECONDS",
        help="with --node: how long each node is given to answer (default 1; at most 15)",
    )
    parser.add_argument(
        "--prefix",
        default=argparse.SUPPRESS if default is argparse.SUPPRESS else "aiolock",
        help="key prefix of the locks (default aiolock)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if default is argparse.SUPPRESS else False,
        help="print JSON instead of tables (its keys: the documentation's command-line page)",
    )


def _kind_option(parser: argparse.ArgumentParser) -> None:
    labels = [kind.label for kind in KINDS]
    parser.add_argument(
        "--kind",
        choices=labels,
        default=None,
        help=f"only this kind (default: {and_list(labels)}; rwlock: a read-write lock)",
    )


def chosen_kinds(args: argparse.Namespace) -> tuple[Kind, ...]:
    """The kinds a command looks at: `--kind`, else all of them."""
    return KINDS if args.kind is None else (kind_named(args.kind),)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < 86400:
        raise argparse.ArgumentTypeError(f"must be between 0 and 86400 seconds: {text!r}")
    return value


def _node_timeout(text: str) -> float:
    value = _seconds(text)
    if value > 15:
        raise argparse.ArgumentTypeError(f"must be at most 15 seconds: {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value
