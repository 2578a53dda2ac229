"""The protocol explored: an exhaustive, bounded search over the interleavings of a few
clients and a server whose transitions are the project's own Lua scripts (`python -m
tests.explore`, `docs/exploration.md`).

- `nodes`: fakeredis servers on a clock the model sets, snapshotted and restored per state;
- `clients`: the clients' state machines, building their calls with the primitives' own
  helpers and reading the replies with the engine's parsers;
- `model`: a state, its moves and the invariants checked in it, per kind of primitive;
- `search`: the breadth-first search and its counterexample trace.
"""
