"""The rich views: the console every command prints on, the tables of `ls`, `watch` and
`stats`, what `show` shows, `release`'s question and message, `doctor`'s findings and the
demo's summary. Every value from Redis or the command line goes through `printable` first."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import IO, Any, Final, cast

from rich import box
from rich.console import Console, Group
from rich.prompt import Confirm
from rich.table import Table
from rich.text import Text

from .._lua.layout import LockKeys
from .._model.hold_stats import HoldStats
from .._model.holder import LockInfo
from .._ops.doctor import Diagnosis
from .._ops.inspection import ForceRelease, LockState, QueueEntry, kind_named
from ._flash_sale import DemoSummary
from ._json_views import (
    has_sides,
    held_count,
    holder_dict,
    limit_of,
    live_holders,
    soonest_holder,
)
from ._text import CELL_LIMIT, duration, printable, quoted, utc

_PIPE_WIDTH: Final = 100_000
"""Output width when stdout is not a terminal and COLUMNS is not set: wider than any row
(a cell holds at most `CELL_LIMIT` characters), so that a table is as wide as its widest
row and no cell is cut; a rule is drawn `RULE_WIDTH` wide (see `rule_width`)."""
RULE_WIDTH: Final = 160
"""Widest a rule (a heading line) is drawn."""


def make_console() -> Console:
    # Every string printed is literal text: no markup ("[b]"), no emoji codes (":ok:"),
    # no highlighting. Styles come from `Text` objects and style arguments only, and every
    # value from Redis or the command line goes through `printable` first.
    console = Console(highlight=False, soft_wrap=False, markup=False, emoji=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = _PIPE_WIDTH
        console.file = cast(IO[str], _TrimmedLines(console.file))
    return console


class _TrimmedLines:
    """A text file whose lines are written without their trailing spaces: the padding a
    table gives every cell to its column's width (piped, a table as wide as its widest
    row would otherwise pad every line to that width). A line is written once it ends;
    the rest (a prompt, say) at each flush, as is."""

    __slots__ = ("_file", "_pending")

    def __init__(self, file: IO[str]) -> None:
        self._file = file
        self._pending = ""

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            self._file.write(line.rstrip(" ") + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._file.write(self._pending)
            self._pending = ""
        self._file.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._file, attribute)


def rule_width(console: Console) -> int:
    """The width to draw a rule at: the console's, at most `RULE_WIDTH`."""
    return min(console.width, RULE_WIDTH)


def kind_and_name(state: LockState) -> str:
    """ "lock 'NAME'": a kind and a name, as `show` heads each kind shown."""
    return f"{state.kind} {quoted(state.name)}"


def locks_table(states: Sequence[LockState], *, title: str | None = None) -> Table:
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        title_justify="left",
        pad_edge=False,
        collapse_padding=True,
    )
    names = [printable(state.name, CELL_LIMIT) for state in states]
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
    if has_sides(state):
        return f"{state.writers_waiting}w {state.readers_waiting}r"
    return str(state.waiters)


def _held_cell(state: LockState) -> str:
    """ "held/limit": "1/1" for a held lock, "3/5" for a semaphore; a read-write lock's
    "writer", "3 readers" or "free"."""
    if has_sides(state):
        if state.holder is not None:
            return "writer"
        return _readers(len(state.readers)) if state.readers else "free"
    limit = limit_of(state)
    return f"{held_count(state)}/{'?' if limit is None else limit}"


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
            f"queue {printable(state.reservation.queue_id)}",
            "-",
            duration(state.reservation.expires_in),
            "-",
        )
    live = live_holders(state)
    processes = sorted({(info.host, info.pid) for info in live})
    if state.leader is not None:  # an election's: its leader's identity
        holder: str | Text = printable(state.leader.identity)
    elif len(processes) == 1:
        holder = f"{printable(processes[0][0])}:{processes[0][1]}"
    elif processes:
        holder = f"{len(processes)} processes"
    elif state.holders:  # every permit held is on its way to a queued process
        holder = Text("(handed over)", style="italic")
    else:
        holder = Text("(none)", style="italic")
    one = live[0] if len(live) == 1 else None
    soonest = soonest_holder(state)
    return (
        holder,
        printable(one.task) if one else ("-" if not live else f"{len(live)} tasks"),
        duration(state.age),
        f"{duration(soonest.expires_in)} of {duration(soonest.ttl)}" if soonest else "-",
        str(one.fencing_token) if one else "-",
    )


def stats_table(all_stats: Sequence[tuple[str, HoldStats]]) -> Table:
    """The table of `stats`: one row per name and kind."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    longest = max(len(printable(stats.name, CELL_LIMIT)) for _, stats in all_stats)
    table.add_column("NAME", no_wrap=True, min_width=min(longest, 60), overflow="fold")
    table.add_column("KIND", no_wrap=True)
    for column in ("HOLDS", "P50", "P99", "MAX", "TTL", "UNRENEWED", "RECOMMENDED"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("NOTE", no_wrap=True)
    for kind, stats in all_stats:
        table.add_row(
            printable(stats.name, CELL_LIMIT),
            kind,
            str(stats.count),
            duration(stats.p50),
            duration(stats.p99),
            duration(stats.max),
            duration(stats.ttl) if stats.ttl is not None else "unknown",
            str(stats.fixed),
            duration(stats.recommended_ttl),
            _stats_note(stats),
        )
    return table


def show_renderable(state: LockState, prefix: str) -> Group:
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    key = LockKeys.build(prefix, state.name, kind_named(state.kind).infix).lock
    facts.add_row(state.kind, f"{quoted(state.name)} (key {printable(key)})")
    facts.add_row("state", state.state)
    parts: list[Any] = [facts]
    if has_sides(state):
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
        else f"{duration(state.typical_hold)} (moving average over contended holds)",
    )
    if kind_named(state.kind).shared and state.holders:
        parts.append(_permits_table(state))
    if has_sides(state):
        parts.append(_queue_renderable(state.queue, "writers' queue"))
        parts.append(_queue_renderable(state.reader_queue, "readers' queue"))
    elif state.kind == "election":
        parts.append(_queue_renderable(state.queue, "candidates"))
    else:
        parts.append(_queue_renderable(state.queue, "queue"))
    parts.append(Text(f"recent holds: {stats_line(state.hold_stats())}"))
    return Group(*parts)


def _holder_facts(facts: Table, state: LockState, label: str = "holder") -> None:
    holder = state.holder
    if holder is not None:
        age = holder_dict(state, holder)["age"]
        facts.add_row(
            label,
            f"host {printable(holder.host)}, pid {holder.pid}, task {quoted(holder.task)}",
        )
        facts.add_row("fencing token", str(holder.fencing_token))
        facts.add_row("acquired", f"{utc(holder.acquired_at)} ({duration(age)} ago)")
        facts.add_row(
            "ttl",
            f"{duration(holder.ttl)}, expires in {duration(holder.expires_in)} unless renewed",
        )
    if state.reservation is not None:
        facts.add_row(
            "reserved for",
            f"queue {printable(state.reservation.queue_id)}, for "
            f"{duration(state.reservation.expires_in)} more (a release handed it over)",
        )


def _election_facts(facts: Table, state: LockState) -> None:
    leader = state.leader
    if leader is None:
        facts.add_row(
            "leader",
            "nobody" if state.holder is None else "nobody yet (a term won, not announced)",
        )
    else:
        facts.add_row("leader", quoted(leader.identity))
        facts.add_row("term", f"fencing token {leader.fencing_token}")
        age = max(state.server_time - leader.since, 0.0)
        facts.add_row("since", f"{utc(leader.since)} ({duration(age)} ago)")
        facts.add_row("value", "-" if leader.value is None else quoted(leader.value))
    _holder_facts(facts, state, "term held by")
    facts.add_row("candidates", f"{state.waiters} waiting")


def _rw_facts(facts: Table, state: LockState) -> None:
    if state.holder is not None:
        facts.add_row("held by", "the writer")
    else:
        facts.add_row("held by", _readers(len(state.readers)) if state.readers else "nobody")
    _holder_facts(facts, state, "writer")
    if state.readers:
        oldest = max(holder_dict(state, info)["age"] or 0 for info in state.readers)
        facts.add_row("oldest reader", f"acquired {duration(oldest)} ago")
    facts.add_row(
        "waiting",
        f"{state.writers_waiting} writer(s), {state.readers_waiting} reader(s)",
    )


def _permit_facts(facts: Table, state: LockState) -> None:
    if state.limit is None:
        facts.add_row("limit", "- (none stored: the semaphore is not in use)")
    else:
        facts.add_row("limit", f"{state.limit} (in force, stored in Redis)")
    held = state.permits_held
    permits = f"{held} held"
    if held > len(state.holders):
        permits += f" by {len(state.holders)} holder(s)"
    if state.free is not None:
        permits += f", {state.free} free"
        if state.limit is not None and held > state.limit:
            permits += f" ({held - state.limit} over a lowered limit)"
    if state.reserved_slots:
        permits += f"; {len(state.reserved_slots)} of them handed over to a queued process"
    facts.add_row("permits", permits)
    if state.age is not None:
        facts.add_row("oldest permit", f"acquired {duration(state.age)} ago")


def _permits_table(state: LockState) -> Table:
    """A semaphore's permits by slot, a read-write lock's writer or readers."""
    if has_sides(state):
        title = "leases: the writer" if state.holder else f"leases: {_readers(len(state.readers))}"
        first = "SIDE"
    else:
        limit = "?" if state.limit is None else str(state.limit)
        title, first = f"permits: {state.permits_held} of {limit} held", "SLOT"
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for column in (first, "HOST", "PID", "TASK", "FENCING TOKEN", "AGE", "TTL", "EXPIRES IN"):
        table.add_column(column, justify="right" if column in {"SLOT", "PID"} else "left")
    for info in state.holders:
        holder = holder_dict(state, info)
        queue = holder["reserved_for"]
        table.add_row(
            holder["side"] or ",".join(map(str, info.slots or (info.slot,))),
            printable(info.host),
            str(info.pid),
            Text(f"(handed over to queue {printable(queue)})", style="italic")
            if queue
            else printable(info.task),
            str(info.fencing_token),
            duration(holder["age"]),
            duration(info.ttl),
            duration(info.expires_in),
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
            printable(entry.queue_id),
            printable(entry.host or "?"),
            str(entry.pid),
            str(entry.count),
            "expired" if entry.expired else duration(entry.expires_in),
            style="dim" if entry.expired else None,
        )
    return queue


def stats_line(stats: HoldStats) -> str:
    if stats.count == 0:
        return "none recorded"
    line = (
        f"{stats.count}, p50 {duration(stats.p50)}, p99 {duration(stats.p99)}, "
        f"max {duration(stats.max)}; ttl {duration(stats.ttl) if stats.ttl else 'unknown'}"
    )
    if stats.fixed:
        line += (
            f"; {stats.fixed} not renewed, p99 {duration(stats.fixed_p99)}, "
            f"recommended ttl {duration(stats.recommended_ttl)}"
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


def release_question(holder: LockInfo) -> Text:
    """What `release` asks on a terminal (a `Text`: a prompt given as a string is read as
    markup)."""
    return Text(
        f"release lock {quoted(holder.name)} held by {printable(holder.host)}:{holder.pid} "
        f"task {quoted(holder.task)} (fencing token {holder.fencing_token})?"
    )


def release_confirmed(console: Console, holder: LockInfo) -> bool:
    """Whether the user, asked on the terminal, confirms evicting `holder` (no: end of input)."""
    try:
        return bool(Confirm.ask(release_question(holder), console=console, default=False))
    except EOFError:
        return False


def release_message(result: ForceRelease, name: str) -> str:
    holder = result.holder
    who = (
        f"{printable(holder.host)}:{holder.pid} task {quoted(holder.task)} "
        f"(fencing token {holder.fencing_token})"
        if holder is not None
        else ""
    )
    if result.outcome == "not_held":
        return f"lock {quoted(name)} is not held: nothing released"
    if result.outcome == "declined":
        return "not confirmed: nothing released"
    if result.outcome == "holder_changed":
        return (
            f"lock {quoted(name)} changed hands (or was released) after it was read: nothing "
            "released; run the command again to see the new holder"
        )
    handed = (
        f"handed over to the waiting process of queue {printable(result.handed_to)}"
        if result.handed_to
        else "free now (nobody was waiting)"
    )
    return (
        f"released lock {quoted(name)} held by {who}; {handed}. The evicted holder loses its "
        "lease at its next renewal."
    )


_SEVERITY_STYLE: Final = {
    "ok": ("✓", "bold green"),
    "info": ("i", "cyan"),
    "warning": ("!", "bold yellow"),
    "problem": ("✗", "bold red"),
}


def doctor_renderable(diagnosis: Diagnosis, where: str) -> Group:
    server = diagnosis.server
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_header=False, expand=False)
    table.add_column(no_wrap=True)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for finding in diagnosis.findings:
        mark, style = _SEVERITY_STYLE[finding.severity]
        text = Text(printable(finding.message))
        if finding.fix:
            text.append("\nchange: ", style="bold")
            text.append(printable(finding.fix))
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
        printable(f"{server['product']} {server['version']} at {where}, role {server['role']}")
    )
    return Group(header, table, summary)


def demo_table(summary: DemoSummary) -> Table:
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
    table.add_row("server", "", printable(summary.backend))
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
        f"{summary.holds}, {summary.holds_over_ttl} longer than the {duration(summary.ttl)} "
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
    table.add_row("hold times", "", stats_line(summary.hold_stats))
    table.add_row("elapsed", "", duration(summary.elapsed))
    table.add_row(
        "result",
        check(summary.ok),
        "invariant holds: sold exactly the stock, nothing oversold"
        if summary.ok
        else "INVARIANT VIOLATED",
    )
    return table
