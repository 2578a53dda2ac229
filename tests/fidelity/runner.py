"""Running sequences on the simulated server and on real ones, call by call, and searching
for one on which they differ (Hypothesis generates the sequences, and shrinks a failing one).

A sequence runs on each pair (a `FakeBackend` and a `RealBackend`), both fresh: each call
is built for each (from the same operation) and runs on the real server, its TIME read just
before (in the same round trip), then on the simulated one, its clock set to that TIME;
then the replies and the states (every key) are normalised and compared (`compare`). The first difference ends the sequence: a
`Divergence`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Flaky

from .backends import ErrorReply, FakeBackend, Message, RealBackend, State, describe
from .compare import (
    FIRST_IS_PTTL,
    TOLERANCE_MS,
    differences,
    normal,
    normal_reply,
    normal_state,
)
from .ops import Command, Context, Op, Primitives, Step
from .strategies import sequences

__all__ = ("Divergence", "Pair", "Search", "run_sequence", "search")

Pair = tuple[FakeBackend, RealBackend]


@dataclass(slots=True)
class Divergence:
    """Where a sequence's calls differed between the simulated server and a real one."""

    server: str
    ops: Sequence[Op]
    index: int
    sent: str
    replies: tuple[Any, Any]
    found: list[tuple[str, Any, Any]]

    def report(self) -> str:
        lines = [f"divergence between fakeredis and {self.server}, at call {self.index + 1}:"]
        for i, op in enumerate(self.ops):
            mark = "->" if i == self.index else "  "
            lines.append(f" {mark} {i + 1:2d}. {op!r}")
        lines.append(f"sent: {self.sent}")
        lines.append(f"replies: fakeredis {self.replies[0]!r}")
        lines.append(f"         {self.server} {self.replies[1]!r}")
        for where, fake, real in self.found:
            lines.append(f"differs at {where}: fakeredis {fake!r} / {self.server} {real!r}")
        return "\n".join(lines)


@dataclass(slots=True)
class Counts:
    sequences: int = 0
    calls: int = 0
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)


def run_sequence(
    ops: Sequence[Op], pairs: Sequence[Pair], prims: Primitives, counts: Counts | None = None
) -> Divergence | None:
    """Apply `ops` to each pair, comparing after every call: the first divergence, or None."""
    for number, pair in enumerate(pairs):
        divergence = _run_on(pair, ops, prims, counts if number == 0 else None)
        if divergence is not None:
            return divergence
    return None


def _run_on(
    pair: Pair, ops: Sequence[Op], prims: Primitives, counts: Counts | None
) -> Divergence | None:
    """`ops` on one pair, both fresh (`counts`: the calls made are counted there)."""
    fake, real = pair
    fake.reset()
    real.reset()
    contexts = (Context(prims), Context(prims))
    slowest_ms = 0.0
    for index, op in enumerate(ops):
        real_step, real_reply, real_now = real.call(op, contexts[1])
        fake.set_clock(real_now)
        fake_now = fake.now_us()
        fake_step, fake_reply = fake.call(op, contexts[0])
        if counts is not None:
            counts.calls += 1
            counts.outcomes[outcome(real_step, real_reply)] += 1
        for ctx, step, reply in zip(
            contexts, (fake_step, real_step), (fake_reply, real_reply), strict=True
        ):
            ctx.sent.append(step)
            op.after(ctx, reply)
        real_state, real_messages = real.state(), real.messages()
        slowest_ms = max(slowest_ms, (real.now_us() - real_now) / 1000)
        script = "" if isinstance(real_step, Command) else real_step[0].name
        found = _compare(
            script,
            replies=(fake_reply, real_reply),
            nows=(fake_now, real_now),
            states=(fake.state, real_state),
            messages=(fake.messages, real_messages),
            tol=TOLERANCE_MS + slowest_ms,
        )
        if found:
            replies = (fake_reply, real_reply)
            return Divergence(real.name, list(ops), index, describe(real_step), replies, found)
    return None


def _compare(
    script: str,
    *,
    replies: tuple[Any, Any],
    nows: tuple[int, int],
    states: tuple[Callable[[], State], State],
    messages: tuple[Callable[[], list[Message]], list[Message]],
    tol: float,
) -> list[tuple[str, Any, Any]]:
    """What differs between the simulated server's reply and the real one's, else between
    their states, else between the messages the call published (the simulated server's
    read only if what came before matched); times and durations within `tol` ms."""
    fake_now, real_now = nows
    fake_reply = normal_reply(script, replies[0], fake_now)
    found = list(differences(fake_reply, normal_reply(script, replies[1], real_now), "reply", tol))
    if found:
        return found
    fake_state, real_state = states[0](), states[1]
    fake_keys, real_keys = normal_state(fake_state, fake_now), normal_state(real_state, real_now)
    found = list(differences(fake_keys, real_keys, "key ", tol))
    if found:
        return found
    fake_messages = normal(messages[0](), fake_now)
    return list(differences(fake_messages, normal(messages[1], real_now), "messages", tol))


def outcome(step: Step, reply: Any) -> tuple[str, str]:
    """A call's script (or command) and what its reply was: the status a list starts with
    (its length after a slash), "integer", "text", "nil" or "error"."""
    name = describe(step).split(" ")[0] if isinstance(step, Command) else step[0].name
    if isinstance(reply, ErrorReply):
        return name, "error"
    if isinstance(reply, list):
        head = reply[0] if reply else "-"
        status = head.decode(errors="replace")[:8] if isinstance(head, bytes) else str(head)
        if name in FIRST_IS_PTTL and status != "-2":
            status = "pttl"
        return name, f"{{{status or chr(39) * 2}, ...}}/{len(reply)}"
    if reply is None:
        return name, "nil"
    return name, "integer" if isinstance(reply, int) else "text"


RERUNS = 2
"""How many times a sequence that diverged is run again before the divergence counts."""


class _Found(AssertionError):
    def __init__(self, divergence: Divergence) -> None:
        super().__init__(divergence.report())
        self.divergence = divergence


@dataclass(slots=True)
class Search:
    """What a search did: sequences and calls run (the shrinking's included), seconds, and
    the divergence found (the shrunk one), or None."""

    sequences: int = 0
    calls: int = 0
    seconds: float = 0.0
    divergence: Divergence | None = None
    flaky: str = ""
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    """How many calls of each script (or command) answered what, on the first server."""
    unrepeated: list[Divergence] = field(default_factory=list)
    """Divergences that did not happen again when their sequence was run again (RERUNS
    times): a branch on a tie between two readings of the clock (see `search`)."""


def search(
    pairs: Sequence[Pair],
    count: int,
    *,
    seed: int = 0,
    families: tuple[str, ...] | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> Search:
    """Run `count` generated sequences on every pair; stop at the first divergence, shrunk.
    `progress(sequences, calls, seconds)` is called every 1000 sequences.

    A divergence is run again, up to RERUNS times: one that does not happen again is not
    the simulated server's doing but a branch on a tie between two readings of the clock
    (a script comparing a key's PTTL with a window computed from TIME, equal to the
    millisecond on the simulated server, a millisecond apart either way on a real one): it
    is kept in `unrepeated` (and reported), and the search goes on. A difference of the
    simulated server happens again every time, and is shrunk."""
    prims = Primitives()
    counts = Counts()
    result = Search()
    strategy = sequences() if families is None else sequences(families)

    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
        print_blob=False,
    )
    @hypothesis_seed(seed)
    @given(strategy)
    def check(ops: list[Op]) -> None:
        counts.sequences += 1
        if progress is not None and counts.sequences % 1000 == 0:
            progress(counts.sequences, counts.calls, time.perf_counter() - started)
        divergence = run_sequence(ops, pairs, prims, counts)
        if divergence is None:
            return
        if any(run_sequence(ops, pairs, prims) is None for _ in range(RERUNS)):
            result.unrepeated.append(divergence)
            return
        raise _Found(divergence)

    started = time.perf_counter()
    try:
        check()
    except _Found as found:
        result.divergence = found.divergence
    except Flaky as flaky:
        inner = getattr(flaky, "exceptions", ())
        result.flaky = "\n".join([str(flaky), *(str(e) for e in inner)])
    result.seconds = time.perf_counter() - started
    result.sequences = counts.sequences
    result.calls = counts.calls
    result.outcomes = counts.outcomes
    return result
