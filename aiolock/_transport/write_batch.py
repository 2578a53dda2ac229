"""Commands written in one pass of the event loop, sent together at its end.

A Redis server that has nothing to do sleeps; a command that reaches it asleep costs the
writer the server's wake-up (on a virtual machine, an interrupt to another CPU, most of
the system time a lock cycle costs the client) and the server a pass of its own loop for
one command. Many tasks that resume in one pass of the event loop (their replies read in
one poll) and each write a command at once wake the server once per command; held until
the pass has run, the same commands reach it in a burst it reads in one pass.

So a command is written at once only when nothing else is ready to run in this pass of
the loop (a lone task: no other writer can join it, and holding it would only add a pass);
otherwise it is held, and every command held in the pass is written in the order it came,
by one callback scheduled behind the callbacks ready now. A loop that does not show its
ready callbacks (uvloop) is judged by aiolock's own calls instead: a command is held while
another call waits for its reply (whose reading writes again, in this pass or a later
one), and written at once by a lone call.

Only commands whose caller waits for their reply are held (`_transport.base.write`): one
whose caller goes on once it is written (a body that starts once its hand-over's renewal
is written) is written at once. A caller cancelled before the end of the pass closes its
connection (redis-py does, on any error while reading), and its held command is then
dropped unwritten.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

__all__ = ("WriteBatch", "batch_for")

Held = list[tuple[weakref.ref[asyncio.StreamWriter], bytes]]
"""Commands held for writers, in the order they came."""


class WriteBatch:
    """The commands held in the current pass of one event loop (see the module)."""

    __slots__ = ("_held", "_ready", "awaiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # (the loop itself is not kept: it is the key this batch is found by, held weakly)
        self._held: Held = []
        ready = getattr(loop, "_ready", None)
        self._ready: Any = ready if hasattr(ready, "__len__") else None
        self.awaiting = 0
        """aiolock's calls on this loop written (or about to be) and not yet answered."""

    def hold(self, writer: asyncio.StreamWriter, packed: bytes) -> bool:
        """Hold `packed` for `writer` until the end of this pass of the running loop (this
        batch's), if other callbacks are ready to run in it or commands already wait: True
        if held, False if the caller is to write it now."""
        held = self._held
        if not held:
            if not self._others_ready():
                return False
            asyncio.get_running_loop().call_soon(self._flush)
        # (held weakly: a connection dropped meanwhile is collected, and its transport
        # closed, when it would have been without the batch)
        held.append((weakref.ref(writer), packed))
        return True

    def _others_ready(self) -> bool:
        """Whether a callback is ready to run in this pass (the loop skips cancelled ones);
        on a loop that does not show them, whether another call awaits its reply."""
        ready = self._ready
        if ready is None:
            return self.awaiting > 1
        if ready:
            for handle in ready:
                if not handle.cancelled():
                    return True
        return False

    def _flush(self) -> None:
        """Write every held command, in the order they came: a writer's in one write."""
        held, self._held = self._held, []
        if len(held) > 1:
            held = _joined(held)
        for writer_ref, packed in held:
            writer = writer_ref()
            if writer is None:
                continue
            transport = writer.transport
            if transport.is_closing():  # its caller was cancelled or failed, and closed it
                continue
            try:
                writer.write(packed)
            except (OSError, RuntimeError, AttributeError, TypeError):
                # (what an event loop raises for a write on a transport it closed): the
                # transport is aborted, and its reader told
                transport.abort()


def _joined(held: Held) -> Held:
    """`held` with each writer's commands joined, in their order (a shared connection's),
    the writers in the order of their first (a writer's weak reference is the same object
    for all its commands, and stays hashable by identity once the writer is gone)."""
    joined: dict[int, tuple[weakref.ref[asyncio.StreamWriter], list[bytes]]] = {}
    for writer_ref, packed in held:
        entry = joined.get(id(writer_ref))
        if entry is None:
            joined[id(writer_ref)] = (writer_ref, [packed])
        else:
            entry[1].append(packed)
    if len(joined) == len(held):
        return held
    return [(ref, b"".join(parts)) for ref, parts in joined.values()]


_BATCHES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WriteBatch] = (
    weakref.WeakKeyDictionary()
)


def batch_for(loop: asyncio.AbstractEventLoop) -> WriteBatch:
    """The batch of `loop` (made at its first use)."""
    batch = _BATCHES.get(loop)
    if batch is None:
        batch = _BATCHES[loop] = WriteBatch(loop)
    return batch
