"""Letting the event loop read what has already arrived before a timeout is acted on.

When the event loop was blocked (a CPU-bound call, a paused process), timers that fell due
meanwhile run as soon as it resumes, before the coroutines waiting for replies that arrived
meanwhile: a reply already sitting in a socket, a renewal Redis already confirmed, would be
counted as missing. Before a deadline or a call's timeout is acted on, the loop is given
`ROUNDS` more iterations, each of which polls the sockets without waiting, so that replies
already there are read first. Nothing later than that is waited for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

__all__ = ("ROUNDS", "after_arrivals", "arrivals")

ROUNDS: Final = 3
"""Event-loop iterations allowed for a reply that has arrived to be read and acted on: one
to poll the socket (uvloop runs timers before polling), one for the reading task's step,
and one to spare."""


def after_arrivals(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """Call `callback` once the loop has read whatever had arrived by now."""

    def step(left: int) -> None:
        if left <= 0:
            callback()
        else:
            loop.call_soon(step, left - 1)

    step(ROUNDS)


async def arrivals() -> None:
    """Return once the loop has read whatever had arrived by now (no other wait)."""
    for _ in range(ROUNDS):
        await asyncio.sleep(0)
