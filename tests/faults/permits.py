"""Waiters for a semaphore's permits in a process of their own, driven line by line.

Run as `python -m tests.faults.permits --url URL --name NAME --limit 2` from the repository
root. Reads commands on stdin, one per line:

- `wait K`: start waiter K (a task): `async with Semaphore(...)`, then hold the permit;
- `release K`: waiter K leaves its block (it releases its permit);
- `exit`: wait for every waiter to finish, then exit.

Prints one JSON object per line on stdout, each with `event`:

- `ready` once started;
- `joined` (`waiter`, `local`): waiter K is queued in this process (`local` waiters are);
- `acquired` (`waiter`, `fencing_token`, `slot`): waiter K holds a permit;
- `released` (`waiter`): its block ended without an error;
- `error` (`waiter`, `type`, `message`): it raised;
- `exit`: the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import redis.asyncio

from aiolock import Semaphore
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys

from ..support import programs
from ..support.programs import emit


async def main(args: argparse.Namespace) -> None:
    client = redis.asyncio.Redis.from_url(args.url)
    channel = LockKeys.build("aiolock", args.name, "sem:").channel
    notifier = runtime_for(client).notifier
    leave: dict[str, asyncio.Event] = {}
    tasks: list[asyncio.Task[None]] = []

    async def waiter(label: str) -> None:
        try:
            async with Semaphore(client, args.name, limit=args.limit, ttl=args.ttl) as permit:
                emit("acquired", waiter=label, fencing_token=permit.fencing_token, slot=permit.slot)
                await leave[label].wait()
            emit("released", waiter=label)
        except Exception as error:  # noqa: BLE001 - reported to the test, which fails on it
            emit("error", waiter=label, type=type(error).__name__, message=str(error))

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    emit("ready")
    try:
        while line := (await reader.readline()).decode().strip():
            command, _, label = line.partition(" ")
            if command == "wait":
                before = notifier.queue_length(channel)
                leave[label] = asyncio.Event()
                tasks.append(asyncio.create_task(waiter(label)))
                deadline = loop.time() + 10  # it joins after one try (or acquires)
                while loop.time() < deadline:
                    if notifier.queue_length(channel) > before or tasks[-1].done():
                        break
                    await asyncio.sleep(0.001)
                emit("joined", waiter=label, local=notifier.queue_length(channel))
            elif command == "release":
                leave[label].set()
            elif command == "exit":
                break
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    finally:
        await client.aclose()
        emit("exit")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = programs.parser("Semaphore waiters driven from stdin.")
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--ttl", type=float, default=10.0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
