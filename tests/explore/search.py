"""The breadth-first search over the explored system's states, to a depth, with a visited
set of state keys (`model.Step.key`): every state reachable in at most `depth` moves is
reached once, by a shortest path, so a counterexample found is a shortest one.
"""

from __future__ import annotations

import dataclasses
import random
import time

from tests.simulation.server import virtual_time

from .kinds import Kind
from .model import Bounds, Explorer, State, Step
from .nodes import Nodes

__all__ = ("Outcome", "explore", "walk")


@dataclasses.dataclass(slots=True)
class Outcome:
    """What a search found."""

    kind: str
    depth: int
    bounds: Bounds
    expanded: int = 0
    """States whose moves were taken."""
    distinct: int = 1
    """Distinct states reached (the initial one included)."""
    reached: int = 0
    """The depth of the deepest state reached."""
    scripts: int = 0
    seconds: float = 0.0
    trace: list[Step] | None = None
    """The counterexample, its last step's `violation` saying what is wrong."""
    names: int = 1
    """The names the clients pick from."""
    walks: int = 0
    """Random walks taken beyond the depth (`walk`), and how deep each went at most."""
    walk_depth: int = 0

    @property
    def held(self) -> bool:
        return self.trace is None

    def report(self) -> str:
        b = self.bounds
        lines = [
            (
                f"{self.kind}{f' on {self.names} names' if self.names > 1 else ''}: "
                f"depth {self.depth}, {b.clients} clients ({b.queued} queued), "
                f"{b.cycles} acquisitions each, restarts <= {b.restarts}, lost replies <= "
                f"{b.losses}, pauses <= {b.pauses}, "
                f"{'clock-drift bound' if b.drift_bound else 'no clock-drift bound'}"
                f"{'' if b.agreement else ', mutual exclusion alone'}"
            ),
            (
                f"{self.expanded} states explored, {self.distinct} distinct, depth reached "
                f"{self.reached}, {self.scripts} scripts run, {self.seconds:.1f} s"
            ),
        ]
        if self.walks:
            lines.append(
                f"{self.walks} random walks of up to {self.walk_depth} moves from the start"
            )
        if self.trace is None:
            lines.append("held: no invariant broken within the bounds")
        else:
            lines.append(f"COUNTEREXAMPLE in {len(self.trace)} steps:")
            lines += [f"  {n:2d}. {step.text}" for n, step in enumerate(self.trace, 1)]
            lines.append(f"  violated: {self.trace[-1].violation}")
        return "\n".join(lines)


def _trace(parents: dict[bytes, tuple[bytes, Step] | None], key: bytes) -> list[Step]:
    steps = []
    entry = parents[key]
    while entry is not None:
        parent, step = entry
        steps.append(step)
        entry = parents[parent]
    return steps[::-1]


def explore(kind: Kind, bounds: Bounds, depth: int) -> Outcome:
    """Search every state within `depth` moves; stop at the first state (or script run)
    that breaks an invariant."""
    nodes = Nodes(kind.nodes)
    outcome = Outcome(kind.name, depth, bounds, names=kind.names)
    started = time.monotonic()
    with virtual_time(nodes):  # type: ignore[arg-type]  # a clock with .time(), as a loop
        explorer = Explorer(kind, bounds, nodes)
        first = explorer.initial()
        root = Step("start", first).key()
        parents: dict[bytes, tuple[bytes, Step] | None] = {root: None}
        frontier: list[tuple[bytes, State]] = [(root, first)]
        for level in range(1, depth + 1):
            following: list[tuple[bytes, State]] = []
            for key, state in frontier:
                outcome.expanded += 1
                for step in explorer.moves(state):
                    new = step.key()
                    if new in parents:
                        continue
                    parents[new] = (key, step)
                    outcome.reached = level
                    if step.violation is not None:
                        outcome.trace = _trace(parents, new)
                        break
                    following.append((new, step.state))
                if outcome.trace is not None:
                    break
            if outcome.trace is not None or not following:
                break
            frontier = following
    outcome.distinct = len(parents)
    outcome.scripts = nodes.runs
    outcome.seconds = time.monotonic() - started
    return outcome


def walk(
    kind: Kind, bounds: Bounds, outcome: Outcome, *, walks: int, depth: int, seed: int
) -> None:
    """Beyond the exhaustive depth: `walks` random walks from the start, each of up to
    `depth` moves chosen by a generator seeded with `seed` (the same walks each time),
    stopping at the first that breaks an invariant (its steps: `outcome.trace`)."""
    nodes = Nodes(kind.nodes)
    rng = random.Random(seed)
    started = time.monotonic()
    with virtual_time(nodes):  # type: ignore[arg-type]  # a clock with .time(), as a loop
        explorer = Explorer(kind, bounds, nodes)
        for _ in range(walks):
            outcome.walks += 1
            state, steps = explorer.initial(), []
            for _ in range(depth):
                moves = list(explorer.moves(state))
                if not moves:
                    break
                step = rng.choice(moves)
                steps.append(step)
                outcome.walk_depth = max(outcome.walk_depth, len(steps))
                if step.violation is not None:
                    outcome.trace = steps
                    break
                state = step.state
            if outcome.trace is not None:
                break
    outcome.scripts = nodes.runs
    outcome.seconds += time.monotonic() - started
