"""`aiolock`: see the locks, semaphores, read-write locks and elections in a Redis server,
evict a stuck holder, run the demo.

```
aiolock ls [PATTERN]              in use: holder(s), age, ttl left, fencing token, waiters
aiolock show NAME                 everything known about one lock, semaphore, rwlock or election
aiolock release NAME --force      evict the holder of a lock (token-guarded, asks first)
aiolock watch [PATTERN]           a live `ls` table, until Ctrl-C
aiolock stats [PATTERN]           hold times per lock, semaphore and rwlock, and the ttl they suggest
aiolock doctor                    what in the server's setup can break locks
aiolock demo                      a flash sale on a throwaway server, checked
```

Options before or after the command: `--url` (default `$REDIS_URL`, else
`redis://localhost:6379/0`), `--prefix` (default `aiolock`) and `--json` (machine-readable
output instead of tables, on every command). `ls`, `show`, `watch` and `stats` take
`--kind lock|semaphore|rwlock|election` (default: all four; rwlock: a read-write lock). A
lock, a semaphore, a read-write lock and an election may share a name: their keys differ
(`PREFIX:{NAME}`, `PREFIX:sem:{NAME}`, `PREFIX:rw:{NAME}`, `PREFIX:el:{NAME}`), and `show`
shows each, labelled. An election's holder is its leader's term (a lease: its fencing
token is the term's number), its waiters are its candidates.

JSON output (`--json`); every key is always present, null where it does not apply.
Durations are seconds, times Unix seconds on the server's clock.

- `ls` (and each line of `watch`): a list of rows, by name, locks before semaphores before
  read-write locks before elections: `name`, `kind` ("lock", "semaphore", "rwlock" or
  "election"), `state` ("held",
  "free", or "reserved": a lock handed over to a queued process that has not claimed it
  yet), `held` (permits taken, those handed over included; a lock: 1; a read-write lock:
  its writer or its readers), `limit` (a lock: 1; a semaphore: the limit in force; null
  for a read-write lock), `host`, `pid`, `task`, `fencing_token`, `ttl` (a lock's holder,
  a read-write lock's writer; null for a semaphore or without one), `age` (the holder's, a
  semaphore's oldest permit's, a read-write lock's oldest lease's), `expires_in` (the
  holder's or the reservation's; a semaphore's soonest permit's, a read-write lock's
  soonest lease's), `reserved_for` (a lock's reservation: the queue id), `waiters` (tasks
  waiting, in queue entries that have not expired; a read-write lock's writers and readers),
  `writers_waiting` and `readers_waiting` (a read-write lock's; null for the other kinds),
  `holders` (a list: each holder, a semaphore's permits by slot, a read-write lock's writer
  or readers, as in `show`), `leader` (an election's leader's identity; null while nobody
  leads, and for the other kinds).
- `show`: `{"name": NAME, "lock": {...} or null, "semaphore": {...} or null, "rwlock":
  {...} or null, "election": {...} or null}`; null when Redis knows nothing of that kind
  under NAME (or `--kind` left
  it out). Each object: `name`, `kind`, `key` (its state hash), `state` ("held",
  "reserved" or "free"), `limit`, `held`, `free` (permits free now; null for a lock or a
  read-write lock), `holder` (a lock's holder, a read-write lock's writer: `name`,
  `fencing_token`, `host`, `pid`, `task`, `acquired_at`, `ttl`, `expires_in`, `slot`; null
  for a semaphore), `holders` (each: `slot` (null but for a semaphore), `side` ("write" or
  "read" for a read-write lock, else null), `fencing_token`, `host`, `pid`, `task`,
  `acquired_at`, `age`, `ttl`, `expires_in`, `reserved_for` (the queue id of a permit
  handed over and not claimed yet, else null)), `age`, `reservation` (a lock's:
  `queue_id`, `expires_in`), `last_fencing_token`, `typical_hold`, `waiters`,
  `writers_waiting`, `readers_waiting` (as in `ls`), `queue` (each process queued, in
  order: `queue_id`, `position`, `host`, `pid`, `count`, `expires_in`, `expired`; a
  read-write lock's writers), `reader_queue` (a read-write lock's readers, as `queue`; null
  for the other kinds), `recent_holds_ms` (newest first), `hold_stats` (as in `stats`),
  `leader` (an election's: `identity`, `term`, `since`, `value`; null while nobody leads,
  and for the other kinds), `server_time`.
- `stats`: a list, by name, locks before semaphores before read-write locks before
  elections: `name`,
  `kind`, `count`, `p50`, `p99`, `max`, `ttl`, `fixed`, `fixed_p99`, `recommended_ttl`,
  `near_ttl`, `over_ttl`, `advice`.

Values from Redis (names, hosts, tasks, queue ids) are printed as text, never as rich
markup or emoji codes; every character `str.isprintable` calls unprintable (control
characters, an ANSI sequence's ESC, bidirectional overrides) is shown escaped (`\\x1b`),
a name's bytes that are not UTF-8 as `\\xff` (the name is read and written with
`surrogateescape`, as Python decodes the command line), and a value longer than 1,000
characters is cut short with its length (names in `ls`, `watch` and `stats` rows: 60).
`--json` gives every value whole.

Exit codes: 0 ok; 1 the operation failed (the demo's invariant, nothing released, nothing
known under the name given to `show`, a problem found by `doctor`); 2 usage or connection
error (unreachable server, not a Redis server); 130 interrupted (Ctrl-C, also the normal end
of `watch` without `--count`).

Needs the `cli` extra (`pip install "aiolock-redis[cli]"`) for `rich`. Added in 0.1; semaphores,
read-write locks and `--kind` in 0.2; elections in 0.3.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import os
import sys
import urllib.parse
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any, Final

import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from . import __version__
from ._backend import Backend
from ._clients import AsyncClient, translate_errors
from ._config import MAX_NAME_LENGTH, LockConfig
from ._demo import DemoConfig, DemoError, DemoSummary, demo_server, run_demo
from ._doctor import Diagnosis, diagnose
from ._holdstats import HoldStats
from ._info import LockInfo
from ._inspect import (
    KINDS,
    ForceRelease,
    Kind,
    LockState,
    QueueEntry,
    force_release,
    kind_named,
    read_locks,
    scan_lock_names,
)
from ._layout import LockKeys
from ._version import DISTRIBUTION
from .errors import BackendError, ConfigError

try:
    from rich import box
    from rich.console import Console, Group
    from rich.live import Live
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.prompt import Confirm
    from rich.rule import Rule
    from rich.table import Table
    from rich.text import Text
except ImportError:  # pragma: no cover - depends on the installed extras
    _HAVE_RICH = False
else:
    _HAVE_RICH = True

__all__ = (
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "main",
)

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
"""The operation failed: the demo's invariant, nothing released, no such lock, a problem
found by `doctor`."""
EXIT_USAGE: Final = 2
"""Bad usage, or Redis could not be reached (or is not Redis)."""
EXIT_INTERRUPTED: Final = 130

DEFAULT_URL: Final = "redis://localhost:6379/0"
_CONNECT_TIMEOUT: Final = 5.0


class _UsageError(Exception):
    """A mistake on the command line: one line on stderr, exit code 2."""


def main(argv: list[str] | None = None) -> int:
    """Run the `aiolock` command line with `argv` (default: `sys.argv[1:]`).

    Returns:
        The exit code: 0 ok, 1 operation failed, 2 usage or connection error,
        130 interrupted.
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or argparse's own usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if not _HAVE_RICH:  # pragma: no cover - tested in a subprocess without rich
        _error('the aiolock command line needs rich: pip install "aiolock-redis[cli]"')
        return EXIT_USAGE
    url = args.url or os.environ.get("REDIS_URL") or None
    try:
        return asyncio.run(_COMMANDS[args.command](args, url))
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED
    except _UsageError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except BackendError as exc:
        where = _redact(url or DEFAULT_URL)
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        detail = _shown(" ".join(str(cause).split()) or type(cause).__name__)
        if Backend.refused(exc):
            _error(f"Redis at {where} refused the command: {detail}")
            return EXIT_FAILED
        _error(f"cannot talk to Redis at {where}: {detail}")
        return EXIT_USAGE
    except DemoError as exc:
        _error(f"demo failed: {exc}")
        return EXIT_FAILED
    except (ConfigError, ValueError) as exc:
        _error(str(exc))
        return EXIT_USAGE


# --------------------------------------------------------------------------- arguments
def _parser() -> argparse.ArgumentParser:
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
        "--prefix",
        default=argparse.SUPPRESS if default is argparse.SUPPRESS else "aiolock",
        help="key prefix of the locks (default aiolock)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if default is argparse.SUPPRESS else False,
        help="print JSON instead of tables (its keys: the aiolock.cli module's docstring)",
    )


def _kind_option(parser: argparse.ArgumentParser) -> None:
    labels = [kind.label for kind in KINDS]
    parser.add_argument(
        "--kind",
        choices=labels,
        default=None,
        help=f"only this kind (default: {_and(labels)}; rwlock: a read-write lock)",
    )


def _kinds(args: argparse.Namespace) -> tuple[Kind, ...]:
    """The kinds a command looks at: `--kind`, else all of them."""
    return KINDS if args.kind is None else (kind_named(args.kind),)


def _and(words: Sequence[str], last: str = "and") -> str:
    """ "a", "a and b", "a, b and c"."""
    return f" {last} ".join(filter(None, (", ".join(words[:-1]), words[-1]))) if words else ""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < 86400:
        raise argparse.ArgumentTypeError(f"must be between 0 and 86400 seconds: {text!r}")
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


# --------------------------------------------------------------------------- plumbing
def _error(message: str) -> None:
    sys.stderr.write(f"aiolock: {message}\n")
    sys.stderr.flush()


def _redact(url: str) -> str:
    """The URL without its password."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


_CLIENT_OPTIONS: Final[dict[str, Any]] = {
    "socket_connect_timeout": _CONNECT_TIMEOUT,
    "socket_timeout": _CONNECT_TIMEOUT,
    # A key name that is not UTF-8 (only another writer makes one) is read back as text
    # with `surrogateescape` (its bytes as U+DC80 to U+DCFF), and written as those bytes
    # again: such a lock is listed, shown and released like any other (a name given on the
    # command line is decoded by Python the same way).
    "encoding_errors": "surrogateescape",
}


def _connect(url: str | None) -> redis.asyncio.Redis:
    try:
        return redis.asyncio.Redis.from_url(url or DEFAULT_URL, **_CLIENT_OPTIONS)
    except ValueError as exc:
        raise _UsageError(f"invalid --url {_redact(url or DEFAULT_URL)!r}: {exc}") from None


async def _open(url: str | None) -> AsyncClient:
    """A client of the server at `url`; if that server is a Redis Cluster node, a client
    of the whole cluster (every primary is read). One round trip to ask."""
    client = _connect(url)
    try:
        with translate_errors("connect", None, _CONNECT_TIMEOUT):
            async with asyncio.timeout(_CONNECT_TIMEOUT):
                info = await client.info("cluster")
    except BackendError as exc:
        if Backend.refused(exc):  # INFO not allowed to this user: taken for a lone server
            return client
        await client.aclose()
        raise
    except BaseException:
        await client.aclose()
        raise
    if str(info.get("cluster_enabled", 0)) not in ("1", "yes"):
        return client
    await client.aclose()
    return RedisCluster.from_url(url or DEFAULT_URL, **_CLIENT_OPTIONS)


_PIPE_WIDTH: Final = 160
"""Output width when stdout is not a terminal and COLUMNS is not set: rows stay whole."""


def _console() -> Console:
    # Every string printed is literal text: no markup ("[b]"), no emoji codes (":ok:"),
    # no highlighting. Styles come from `Text` objects and style arguments only, and every
    # value from Redis or the command line goes through `_shown` first.
    console = Console(highlight=False, soft_wrap=False, markup=False, emoji=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = _PIPE_WIDTH
    return console


_SHOWN_LIMIT: Final = MAX_NAME_LENGTH
"""Characters of one value shown in a message or by `show`: a longer one (never a name the
library takes) is cut short, with its length; `--json` gives it whole."""
_CELL_LIMIT: Final = 60
"""Characters of a name shown in a row of `ls`, `watch` and `stats` (the table stays
readable beside a long one); `show` shows up to `_SHOWN_LIMIT`."""

_ESCAPES: Final = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escaped(char: str) -> str:
    """One character that is not printable as an escape: `\\n`, `\\x1b` (a control
    character, an ANSI sequence's ESC), `\\u202e` (a bidirectional override, a line
    separator, a zero-width character), `\\xff` for a byte that was not UTF-8 (decoded with
    `surrogateescape`)."""
    code = ord(char)
    if char in _ESCAPES:
        return _ESCAPES[char]
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _shown(value: object, limit: int = _SHOWN_LIMIT) -> str:
    """A value from Redis (or the command line) as a terminal may show it: every character
    that `str.isprintable` calls unprintable escaped (see `_escaped`; the terminal acts on
    none of it), cut short past `limit` characters. Printed as text, never as markup (see
    `_console`)."""
    text = str(value)
    shown = text[:limit]
    if not shown.isprintable():
        shown = "".join(char if char.isprintable() else _escaped(char) for char in shown)
    if len(text) > limit:
        shown += f"… ({len(text)} characters)"
    return shown


def _quoted(value: object) -> str:
    """`_shown(value)` in quotes, as a name appears in a sentence."""
    return f"'{_shown(value)}'"


def _print_json(data: object, *, indent: int | None = 2) -> None:
    sys.stdout.write(json.dumps(data, indent=indent, default=str) + "\n")
    sys.stdout.flush()


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _utc(unix: float) -> str:
    moment = datetime.datetime.fromtimestamp(unix, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _info_dict(info: LockInfo | None) -> dict[str, Any] | None:
    return None if info is None else dataclasses.asdict(info)


def _stats_dict(stats: HoldStats) -> dict[str, Any]:
    return {**dataclasses.asdict(stats), "advice": stats.advice}


def _label(state: LockState) -> str:
    return f"{state.kind} {_quoted(state.name)}"


def _sides(state: LockState) -> bool:
    """Whether `state` is a read-write lock's (a writer and readers, two queues)."""
    return kind_named(state.kind).sides


def _side(state: LockState, info: LockInfo) -> str | None:
    """A read-write lock's lease's side, "write" or "read" (None for the other kinds)."""
    if not _sides(state):
        return None
    return "write" if info == state.holder else "read"


def _live(state: LockState) -> list[LockInfo]:
    """The holders that hold (a semaphore's permits handed over and not claimed excluded)."""
    return [info for info in state.holders if info.slot not in state.reserved_slots]


def _held_count(state: LockState) -> int:
    """Permits taken: holders, and what was handed over to a queued process."""
    return len(state.holders) + (1 if state.reservation is not None else 0)


def _limit(state: LockState) -> int | None:
    """Holders allowed at once: 1 for a lock, a semaphore's limit in force (None: unknown)."""
    return state.limit if kind_named(state.kind).shared else 1


def _holder_dict(state: LockState, info: LockInfo) -> dict[str, Any]:
    acquired_ms = round(info.acquired_at * 1000)
    age = max(round(state.server_time * 1000) - acquired_ms, 0) / 1000 if acquired_ms else None
    return {
        "slot": info.slot,
        "side": _side(state, info),
        "fencing_token": info.fencing_token,
        "host": info.host,
        "pid": info.pid,
        "task": info.task,
        "acquired_at": info.acquired_at,
        "age": age,
        "ttl": info.ttl,
        "expires_in": info.expires_in,
        "reserved_for": state.reserved_slots.get(info.slot) if info.slot is not None else None,
    }


def _soonest(state: LockState) -> LockInfo | None:
    """The holder whose lease expires first."""
    return min(state.holders, key=lambda info: info.expires_in, default=None)


def _row(state: LockState) -> dict[str, Any]:
    """One row of `ls --json` (the keys are documented in the module docstring)."""
    holder = state.holder
    soonest = _soonest(state)
    expires_in = soonest.expires_in if soonest is not None else None
    if expires_in is None and state.reservation is not None:
        expires_in = state.reservation.expires_in
    return {
        "name": state.name,
        "kind": state.kind,
        "state": state.state,
        "held": _held_count(state),
        "limit": _limit(state),
        "host": holder.host if holder else None,
        "pid": holder.pid if holder else None,
        "task": holder.task if holder else None,
        "fencing_token": holder.fencing_token if holder else None,
        "age": state.age,
        "ttl": holder.ttl if holder else None,
        "expires_in": expires_in,
        "reserved_for": state.reservation.queue_id if state.reservation else None,
        "waiters": state.waiters,
        **_sides_waiting(state),
        "holders": [_holder_dict(state, info) for info in state.holders],
        "leader": state.leader.identity if state.leader else None,
    }


def _sides_waiting(state: LockState) -> dict[str, int | None]:
    """`writers_waiting` and `readers_waiting`: a read-write lock's, else null."""
    sides = _sides(state)
    return {
        "writers_waiting": state.writers_waiting if sides else None,
        "readers_waiting": state.readers_waiting if sides else None,
    }


def _in_use(state: LockState) -> bool:
    """Held, handed over, or waited for (the holder's lease expired, the waiters have not
    found out yet)."""
    return state.state != "free" or state.waiters > 0


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
    return [state for state in await _scan_states(client, prefix, pattern, kinds) if _in_use(state)]


def _what(kinds: Sequence[Kind]) -> str:
    """ "locks, semaphores or rwlocks", "locks", ... for messages."""
    return _and([f"{kind.label}s" for kind in kinds], "or")


def _locks_table(states: Sequence[LockState], *, title: str | None = None) -> Table:
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        title_justify="left",
        pad_edge=False,
        collapse_padding=True,
    )
    names = [_shown(state.name, _CELL_LIMIT) for state in states]
    longest = max(map(len, names), default=4)
    table.add_column("NAME", no_wrap=True, min_width=min(longest, 60), overflow="fold")
    table.add_column("KIND", no_wrap=True)
    table.add_column("HELD", justify="right", no_wrap=True)
    # In a narrow terminal the holder and the task give way first (cut short, one line).
    table.add_column("HOLDER", overflow="ellipsis")
    table.add_column("TASK", overflow="ellipsis")
    for column in ("AGE", "TTL LEFT", "FENCING TOKEN"):
        table.add_column(column, no_wrap=True)
    table.add_column("WAITERS", justify="right", no_wrap=True)
    for state, name in zip(states, names, strict=True):
        holder, task, *rest = _holder_cells(state)
        table.add_row(
            name, state.kind, _held_cell(state), _one_line(holder), _one_line(task),
            *rest,
            _waiters_cell(state),
        )  # fmt: skip
    return table


def _waiters_cell(state: LockState) -> str:
    """The tasks waiting; a read-write lock's writers and readers apart ("1w 2r")."""
    if _sides(state):
        return f"{state.writers_waiting}w {state.readers_waiting}r"
    return str(state.waiters)


def _held_cell(state: LockState) -> str:
    """ "held/limit": "1/1" for a held lock, "3/5" for a semaphore; a read-write lock's
    "writer", "3 readers" or "free"."""
    if _sides(state):
        if state.holder is not None:
            return "writer"
        return _readers(len(state.readers)) if state.readers else "free"
    limit = _limit(state)
    return f"{_held_count(state)}/{'?' if limit is None else limit}"


def _readers(count: int) -> str:
    return f"{count} reader{'' if count == 1 else 's'}"


def _one_line(cell: str | Text) -> Text:
    text = Text(cell) if isinstance(cell, str) else cell.copy()
    text.no_wrap, text.overflow = True, "ellipsis"
    return text


def _holder_cells(state: LockState) -> tuple[str | Text, ...]:
    """HOLDER, TASK, AGE, TTL LEFT and FENCING TOKEN of one `ls` row."""
    if state.reservation is not None:  # a lock handed over, not claimed yet
        return (
            Text("(handed over)", style="italic"),
            f"queue {_shown(state.reservation.queue_id)}",
            "-",
            _duration(state.reservation.expires_in),
            "-",
        )
    live = _live(state)
    processes = sorted({(info.host, info.pid) for info in live})
    if state.leader is not None:  # an election's: its leader's identity
        holder: str | Text = _shown(state.leader.identity)
    elif len(processes) == 1:
        holder = f"{_shown(processes[0][0])}:{processes[0][1]}"
    elif processes:
        holder = f"{len(processes)} processes"
    elif state.holders:  # every permit held is on its way to a queued process
        holder = Text("(handed over)", style="italic")
    else:
        holder = Text("(none)", style="italic")
    one = live[0] if len(live) == 1 else None
    soonest = _soonest(state)
    return (
        holder,
        _shown(one.task) if one else ("-" if not live else f"{len(live)} tasks"),
        _duration(state.age),
        f"{_duration(soonest.expires_in)} of {_duration(soonest.ttl)}" if soonest else "-",
        str(one.fencing_token) if one else "-",
    )


# --------------------------------------------------------------------------- ls
async def _ls(args: argparse.Namespace, url: str | None) -> int:
    kinds = _kinds(args)
    client = await _open(url)
    try:
        states = await _held(client, args.prefix, args.pattern, kinds)
    finally:
        await client.aclose()
    if args.json:
        _print_json([_row(state) for state in states])
        return EXIT_OK
    console = _console()
    if not states:
        console.print(
            f"no {_what(kinds)} in use (prefix {_quoted(args.prefix)}, pattern "
            f"{_quoted(args.pattern)})"
        )
        return EXIT_OK
    console.print(_locks_table(states))
    return EXIT_OK


# --------------------------------------------------------------------------- show
async def _show(args: argparse.Namespace, url: str | None) -> int:
    kinds = _kinds(args)
    client = await _open(url)
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
                _show_dict(state, args.prefix, kind) if state is not None and state.known else None
            )
        _print_json(shown)
        return EXIT_OK if known else EXIT_FAILED
    console = _console()
    if not known:
        console.print(
            f"nothing known about {_and([k.label for k in kinds], 'or')} {_quoted(args.name)} "
            f"(prefix {_quoted(args.prefix)})"
        )
        return EXIT_FAILED
    if len(known) == 1:
        console.print(_show_renderable(known[0], args.prefix))
        return EXIT_OK
    console.print(
        f"{_quoted(args.name)} is {'both ' if len(known) == 2 else ''}"
        f"{_and([f'{_a(state.kind)} {state.kind}' for state in known])} (separate keys, "
        "unrelated); --kind shows one"
    )
    for state in known:
        console.print(Rule(_label(state), align="left"))
        console.print(_show_renderable(state, args.prefix))
    return EXIT_OK


def _a(label: str) -> str:
    """The article before a kind's label: "a lock", "an rwlock"."""
    return "an" if label[0] in "aeiour" else "a"


def _show_dict(state: LockState, prefix: str, kind: Kind) -> dict[str, Any]:
    """One kind's object in `show --json` (the keys are documented in the module docstring)."""
    return {
        "name": state.name,
        "kind": state.kind,
        "key": LockKeys.build(prefix, state.name, kind.infix).lock,
        "state": state.state,
        "limit": _limit(state),
        "held": _held_count(state),
        "free": state.free if kind.shared else None,
        "holder": _info_dict(state.holder),
        "holders": [_holder_dict(state, info) for info in state.holders],
        "age": state.age,
        "reservation": dataclasses.asdict(state.reservation) if state.reservation else None,
        "last_fencing_token": state.last_fencing_token,
        "typical_hold": state.typical_hold,
        "waiters": state.waiters,
        **_sides_waiting(state),
        "queue": _queue_list(state.queue),
        "reader_queue": _queue_list(state.reader_queue) if kind.sides else None,
        "recent_holds_ms": list(state.holds_ms),
        "hold_stats": _stats_dict(state.hold_stats()),
        "leader": dataclasses.asdict(state.leader) if state.leader else None,
        "server_time": state.server_time,
    }


def _queue_list(queue: Sequence[QueueEntry]) -> list[dict[str, Any]]:
    return [{**dataclasses.asdict(entry), "expired": entry.expired} for entry in queue]


def _show_renderable(state: LockState, prefix: str) -> Group:
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    key = LockKeys.build(prefix, state.name, kind_named(state.kind).infix).lock
    facts.add_row(state.kind, f"{_quoted(state.name)} (key {_shown(key)})")
    facts.add_row("state", state.state)
    parts: list[Any] = [facts]
    if _sides(state):
        _rw_facts(facts, state)
    elif kind_named(state.kind).shared:
        _permit_facts(facts, state)
    elif state.kind == "election":
        _election_facts(facts, state)
    else:
        _holder_facts(facts, state)
    last = state.last_fencing_token
    facts.add_row("fence counter", "-" if last is None else f"{last} (last token issued)")
    facts.add_row(
        "typical hold",
        "-"
        if state.typical_hold is None
        else f"{_duration(state.typical_hold)} (moving average over contended holds)",
    )
    if kind_named(state.kind).shared and state.holders:
        parts.append(_permits_table(state))
    if _sides(state):
        parts.append(_queue_renderable(state.queue, "writers' queue"))
        parts.append(_queue_renderable(state.reader_queue, "readers' queue"))
    elif state.kind == "election":
        parts.append(_queue_renderable(state.queue, "candidates"))
    else:
        parts.append(_queue_renderable(state.queue, "queue"))
    parts.append(Text(f"recent holds: {_stats_line(state.hold_stats())}"))
    return Group(*parts)


def _holder_facts(facts: Table, state: LockState, label: str = "holder") -> None:
    holder = state.holder
    if holder is not None:
        age = _holder_dict(state, holder)["age"]
        facts.add_row(
            label,
            f"host {_shown(holder.host)}, pid {holder.pid}, task {_quoted(holder.task)}",
        )
        facts.add_row("fencing token", str(holder.fencing_token))
        facts.add_row("acquired", f"{_utc(holder.acquired_at)} ({_duration(age)} ago)")
        facts.add_row(
            "ttl",
            f"{_duration(holder.ttl)}, expires in {_duration(holder.expires_in)} unless renewed",
        )
    if state.reservation is not None:
        facts.add_row(
            "reserved for",
            f"queue {_shown(state.reservation.queue_id)}, for "
            f"{_duration(state.reservation.expires_in)} more (a release handed it over)",
        )


def _election_facts(facts: Table, state: LockState) -> None:
    leader = state.leader
    if leader is None:
        facts.add_row(
            "leader",
            "nobody" if state.holder is None else "nobody yet (a term won, not announced)",
        )
    else:
        facts.add_row("leader", _quoted(leader.identity))
        facts.add_row("term", f"{leader.term} (its fencing token)")
        age = max(state.server_time - leader.since, 0.0)
        facts.add_row("since", f"{_utc(leader.since)} ({_duration(age)} ago)")
        facts.add_row("value", "-" if leader.value is None else _quoted(leader.value))
    _holder_facts(facts, state, "term held by")
    facts.add_row("candidates", f"{state.waiters} waiting")


def _rw_facts(facts: Table, state: LockState) -> None:
    if state.holder is not None:
        facts.add_row("held by", "the writer")
    else:
        facts.add_row("held by", _readers(len(state.readers)) if state.readers else "nobody")
    _holder_facts(facts, state, "writer")
    if state.readers:
        oldest = max(_holder_dict(state, info)["age"] or 0 for info in state.readers)
        facts.add_row("oldest reader", f"acquired {_duration(oldest)} ago")
    facts.add_row(
        "waiting",
        f"{state.writers_waiting} writer(s), {state.readers_waiting} reader(s)",
    )


def _permit_facts(facts: Table, state: LockState) -> None:
    if state.limit is None:
        facts.add_row("limit", "- (none stored: the semaphore is not in use)")
    else:
        facts.add_row("limit", f"{state.limit} (in force, stored in Redis)")
    held = len(state.holders)
    permits = f"{held} held"
    if state.free is not None:
        permits += f", {state.free} free"
        if state.limit is not None and held > state.limit:
            permits += f" ({held - state.limit} over a lowered limit)"
    if state.reserved_slots:
        permits += f"; {len(state.reserved_slots)} of them handed over to a queued process"
    facts.add_row("permits", permits)
    if state.age is not None:
        facts.add_row("oldest permit", f"acquired {_duration(state.age)} ago")


def _permits_table(state: LockState) -> Table:
    """A semaphore's permits by slot, a read-write lock's writer or readers."""
    if _sides(state):
        title = "leases: the writer" if state.holder else f"leases: {_readers(len(state.readers))}"
        first = "SIDE"
    else:
        limit = "?" if state.limit is None else str(state.limit)
        title, first = f"permits: {len(state.holders)} of {limit} held", "SLOT"
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for column in (first, "HOST", "PID", "TASK", "FENCING TOKEN", "AGE", "TTL", "EXPIRES IN"):
        table.add_column(column, justify="right" if column in {"SLOT", "PID"} else "left")
    for info in state.holders:
        holder = _holder_dict(state, info)
        queue = holder["reserved_for"]
        table.add_row(
            holder["side"] or str(info.slot),
            _shown(info.host),
            str(info.pid),
            Text(f"(handed over to queue {_shown(queue)})", style="italic")
            if queue
            else _shown(info.task),
            str(info.fencing_token),
            _duration(holder["age"]),
            _duration(info.ttl),
            _duration(info.expires_in),
        )
    return table


def _queue_renderable(entries: Sequence[QueueEntry], label: str) -> Table | Text:
    if not entries:
        return Text(f"{label}: empty")
    live = [entry for entry in entries if not entry.expired]
    queue = Table(
        title=f"{label}: {len(live)} process(es), {sum(e.count for e in live)} waiter(s)",
        box=box.SIMPLE_HEAD,
        title_justify="left",
        pad_edge=False,
    )
    for column in ("#", "QUEUE ID", "HOST", "PID", "WAITERS", "EXPIRES IN"):
        queue.add_column(column, justify="right" if column in {"#", "PID", "WAITERS"} else "left")
    for entry in entries:
        queue.add_row(
            str(entry.position),
            _shown(entry.queue_id),
            _shown(entry.host or "?"),
            str(entry.pid),
            str(entry.count),
            "expired" if entry.expired else _duration(entry.expires_in),
            style="dim" if entry.expired else None,
        )
    return queue


def _stats_line(stats: HoldStats) -> str:
    if stats.count == 0:
        return "none recorded"
    line = (
        f"{stats.count}, p50 {_duration(stats.p50)}, p99 {_duration(stats.p99)}, "
        f"max {_duration(stats.max)}; ttl {_duration(stats.ttl) if stats.ttl else 'unknown'}"
    )
    if stats.fixed:
        line += (
            f"; {stats.fixed} not renewed, p99 {_duration(stats.fixed_p99)}, "
            f"recommended ttl {_duration(stats.recommended_ttl)}"
        )
    return f"{line} ({stats.advice})"


def _stats_note(stats: HoldStats) -> Text | str:
    """The NOTE column of `stats`: a warning, or what the ttl of renewed leases is for."""
    if stats.near_ttl:
        return Text("unrenewed holds near the ttl", style="bold yellow")
    if stats.count and not stats.fixed:
        past = f" ({stats.over_ttl} past the ttl)" if stats.over_ttl else ""
        return Text(f"renewed{past}: fine", style="dim")
    return ""


# --------------------------------------------------------------------------- release
async def _release(args: argparse.Namespace, url: str | None) -> int:
    if not args.force:
        raise _UsageError(
            f"release evicts the current holder of {_quoted(args.name)}: confirm with --force"
        )
    interactive = sys.stdin.isatty()
    if not args.yes and not interactive:
        raise _UsageError(
            "refusing to force-release without confirmation: stdin is not a terminal; "
            "pass --yes to confirm"
        )
    console = _console()

    async def confirm(holder: LockInfo) -> bool:
        if args.yes:
            return True
        try:
            return bool(Confirm.ask(_release_question(holder), console=console, default=False))
        except EOFError:
            return False

    client = await _open(url)
    try:
        result = await force_release(client, args.name, prefix=args.prefix, confirm=confirm)
    finally:
        await client.aclose()
    if args.json:
        _print_json(_release_dict(result, args.name))
    else:
        console.print(_release_message(result, args.name))
    return EXIT_OK if result.outcome == "released" else EXIT_FAILED


def _release_question(holder: LockInfo) -> Text:
    """What `release` asks on a terminal (a `Text`: a prompt given as a string is read as
    markup)."""
    return Text(
        f"release lock {_quoted(holder.name)} held by {_shown(holder.host)}:{holder.pid} "
        f"task {_quoted(holder.task)} (fencing token {holder.fencing_token})?"
    )


def _release_dict(result: ForceRelease, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "outcome": result.outcome,
        "released": result.outcome == "released",
        "holder": _info_dict(result.holder),
        "handed_to": result.handed_to,
    }


def _release_message(result: ForceRelease, name: str) -> str:
    holder = result.holder
    who = (
        f"{_shown(holder.host)}:{holder.pid} task {_quoted(holder.task)} "
        f"(fencing token {holder.fencing_token})"
        if holder is not None
        else ""
    )
    if result.outcome == "not_held":
        return f"lock {_quoted(name)} is not held: nothing released"
    if result.outcome == "declined":
        return "not confirmed: nothing released"
    if result.outcome == "holder_changed":
        return (
            f"lock {_quoted(name)} changed hands (or was released) after it was read: nothing "
            "released; run the command again to see the new holder"
        )
    handed = (
        f"handed over to the waiting process of queue {_shown(result.handed_to)}"
        if result.handed_to
        else "free now (nobody was waiting)"
    )
    return (
        f"released lock {_quoted(name)} held by {who}; {handed}. The evicted holder loses its "
        "lease at its next renewal."
    )


# --------------------------------------------------------------------------- watch
async def _watch(args: argparse.Namespace, url: str | None) -> int:
    kinds = _kinds(args)
    client = await _open(url)
    where = _shown(_redact(url or DEFAULT_URL))
    try:
        if args.json:
            for last in _refreshes(args.count):
                states = await _held(client, args.prefix, args.pattern, kinds)
                _print_json([_row(state) for state in states], indent=None)
                if not last:
                    await asyncio.sleep(args.interval)
            return EXIT_OK
        console = _console()
        with Live(console=console, auto_refresh=False, transient=False) as live:
            for last in _refreshes(args.count):
                states = await _held(client, args.prefix, args.pattern, kinds)
                now = datetime.datetime.now().astimezone().strftime("%H:%M:%S")
                counts = ", ".join(
                    f"{sum(state.kind == kind.label for state in states)} {kind.label}(s)"
                    for kind in kinds
                )
                title = f"{counts} in use at {now} on {where}, every {_duration(args.interval)}" + (
                    "" if args.count else " (Ctrl-C to stop)"
                )
                live.update(_locks_table(states, title=title), refresh=True)
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


# --------------------------------------------------------------------------- stats
async def _stats(args: argparse.Namespace, url: str | None) -> int:
    kinds = _kinds(args)
    client = await _open(url)
    try:
        states = await _scan_states(client, args.prefix, args.pattern, kinds, with_holds=True)
    finally:
        await client.aclose()
    all_stats = [(state.kind, state.hold_stats(ttl=args.ttl)) for state in states]
    if args.json:
        _print_json([{"kind": kind, **_stats_dict(stats)} for kind, stats in all_stats])
        return EXIT_OK
    console = _console()
    if not all_stats:
        console.print(
            f"no {_what(kinds)} with recorded holds (prefix {_quoted(args.prefix)}, pattern "
            f"{_quoted(args.pattern)})"
        )
        return EXIT_OK
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    longest = max(len(_shown(stats.name, _CELL_LIMIT)) for _, stats in all_stats)
    table.add_column("NAME", no_wrap=True, min_width=min(longest, 60), overflow="fold")
    table.add_column("KIND", no_wrap=True)
    for column in ("HOLDS", "P50", "P99", "MAX", "TTL", "UNRENEWED", "RECOMMENDED"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("NOTE", no_wrap=True)
    for kind, stats in all_stats:
        table.add_row(
            _shown(stats.name, _CELL_LIMIT),
            kind,
            str(stats.count),
            _duration(stats.p50),
            _duration(stats.p99),
            _duration(stats.max),
            _duration(stats.ttl) if stats.ttl is not None else "unknown",
            str(stats.fixed),
            _duration(stats.recommended_ttl),
            _stats_note(stats),
        )
    console.print(table)
    return EXIT_OK


# --------------------------------------------------------------------------- doctor
_SEVERITY_STYLE: Final = {
    "ok": ("✓", "bold green"),
    "info": ("i", "cyan"),
    "warning": ("!", "bold yellow"),
    "problem": ("✗", "bold red"),
}


async def _doctor(args: argparse.Namespace, url: str | None) -> int:
    client = _connect(url)
    try:
        diagnosis = await diagnose(client, prefix=args.prefix, acl_user=args.acl_user)
    finally:
        await client.aclose()
    code = EXIT_FAILED if diagnosis.problems else EXIT_OK
    if args.json:
        _print_json(
            {
                "url": _redact(url or DEFAULT_URL),
                "server": dict(diagnosis.server),
                "problems": diagnosis.problems,
                "warnings": diagnosis.warnings,
                "findings": [dataclasses.asdict(finding) for finding in diagnosis.findings],
            }
        )
        return code
    _console().print(_doctor_renderable(diagnosis, _redact(url or DEFAULT_URL)))
    return code


def _doctor_renderable(diagnosis: Diagnosis, where: str) -> Group:
    server = diagnosis.server
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_header=False, expand=False)
    table.add_column(no_wrap=True)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for finding in diagnosis.findings:
        mark, style = _SEVERITY_STYLE[finding.severity]
        text = Text(_shown(finding.message))
        if finding.fix:
            text.append("\nchange: ", style="bold")
            text.append(_shown(finding.fix))
        table.add_row(Text(mark, style=style), finding.check, text)
    if diagnosis.problems:
        summary = Text(
            f"{diagnosis.problems} problem(s) that can break locks, "
            f"{diagnosis.warnings} warning(s)",
            style="bold red",
        )
    else:
        summary = Text(
            f"no problem found, {diagnosis.warnings} warning(s)",
            style="bold yellow" if diagnosis.warnings else "bold green",
        )
    header = Text(
        _shown(f"{server['product']} {server['version']} at {where}, role {server['role']}")
    )
    return Group(header, table, summary)


# --------------------------------------------------------------------------- demo
async def _demo(args: argparse.Namespace, url: str | None) -> int:
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
        client = _connect(url)
        try:
            with translate_errors("ping", None, _CONNECT_TIMEOUT):
                async with asyncio.timeout(_CONNECT_TIMEOUT):
                    await client.ping()
        finally:
            await client.aclose()
    console = _console()
    async with demo_server(
        None if args.fakeredis else url,
        fakeredis_only=args.fakeredis,
        label=_redact(url) if url else None,
    ) as server:
        if args.json:
            summary = await run_demo(server, config)
            _print_json(summary.as_dict())
            return EXIT_OK if summary.ok else EXIT_FAILED
        how = f"{config.processes} processes" if server.url is not None else "tasks of this process"
        console.print(
            f"flash sale: {config.stock} units, {config.workers} workers in {how}, one lock "
            f"with ttl {_duration(config.ttl)}\n{config.slow_holds} slow hold(s) of "
            f"{_duration(config.slow_hold)} outlive the ttl on purpose, kept by the watchdog\n"
            f"server: {_shown(server.description)}"
        )
        summary = await _demo_with_progress(
            console, config, lambda cb: run_demo(server, config, on_progress=cb)
        )
    console.print(_demo_table(summary))
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


def _demo_table(summary: DemoSummary) -> Table:
    table = Table(title="flash sale", box=box.SIMPLE_HEAD, title_justify="left", show_header=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column()
    handoff = summary.handoff_ms

    def check(good: bool) -> Text:
        return Text("✓", style="bold green") if good else Text("✗", style="bold red")

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f} ms"

    workers = (
        f"{summary.workers} in {summary.processes} processes"
        if summary.mode == "processes"
        else f"{summary.workers} tasks (fakeredis fallback)"
    )
    table.add_row("server", "", _shown(summary.backend))
    table.add_row("workers", "", workers)
    table.add_row(
        "sold", check(summary.sold == summary.stock), f"{summary.sold} of {summary.stock}"
    )
    table.add_row("stock left", check(summary.stock_left == 0), str(summary.stock_left))
    table.add_row("oversold", check(summary.oversold == 0), str(summary.oversold))
    table.add_row("fenced off", "", f"{summary.rejected_writes} stale reads/writes rejected")
    table.add_row(
        "holds",
        "",
        f"{summary.holds}, {summary.holds_over_ttl} longer than the {_duration(summary.ttl)} "
        "ttl (kept by the watchdog)",
    )
    table.add_row("renewals", "", f"{summary.renewals} ({summary.renewal_failures} failed)")
    table.add_row("losses", "", str(summary.losses))
    if summary.unanswered_acquires:
        table.add_row(
            "unanswered", "", f"{summary.unanswered_acquires} acquires (no reply within the ttl)"
        )
    table.add_row(
        "hand-off",
        "",
        f"p50 {ms(handoff['p50'])}, p90 {ms(handoff['p90'])}, p99 {ms(handoff['p99'])}, "
        f"max {ms(handoff['max'])} (release to next acquire)",
    )
    table.add_row("hold times", "", _stats_line(summary.hold_stats))
    table.add_row("elapsed", "", _duration(summary.elapsed))
    table.add_row(
        "result",
        check(summary.ok),
        "invariant holds: sold exactly the stock, nothing oversold"
        if summary.ok
        else "INVARIANT VIOLATED",
    )
    return table


_COMMANDS: Final[
    dict[str, Callable[[argparse.Namespace, str | None], Coroutine[Any, Any, int]]]
] = {
    "ls": _ls,
    "show": _show,
    "release": _release,
    "watch": _watch,
    "stats": _stats,
    "doctor": _doctor,
    "demo": _demo,
}
