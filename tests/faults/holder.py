"""A lock holder in a process of its own, for the process-fault tests.

Run as `python -m tests.faults.holder --url URL --name NAME --ttl 1 --mode hold` from the
repository root (with `--limit N`, it holds a permit of a `Semaphore` of that limit instead
of the lock, with `--permits K` as well K of them as one lease; with `--rw read|write`, that side of a `ReadWriteLock`) (the tests use `sys.executable`). It talks to the test's own server and
prints one JSON object per line on stdout, each with `event` and `t` (`time.monotonic()`,
comparable with the test's clock: same machine):

- `acquired` (`fencing_token`, `pid`): the lease is held and the body runs;
- `completed`: the body ran to its end and `async with` exited without an error;
- `lost` (`reason`, `fencing_token`): `async with` raised `LeaseLostError`;
- `resumed`, `write` (`label`, `fencing_token`, `accepted`): mode "block" only, see below;
- `error` (`type`, `message`): anything else raised;
- `exit`: the last line.

Modes:

- `hold`: hold the lock for `--hold` seconds (the test stops or kills the process meanwhile).
- `block`: write to a fenced store (`--fence-key`), then block the event loop with a
  synchronous call (a `readline()` on stdin, like a `time.sleep` that the test ends by
  writing a line), then, on resume, write to the store again from a task of its own: the
  zombie write. Its outcome is reported after `async with` has exited.

The fenced store is two keys: `FENCE_KEY:max`, the highest fencing token written so far,
and `FENCE_KEY:log`, a list of `accepted:LABEL:TOKEN` / `rejected:LABEL:TOKEN`. A write
is accepted only if its token is not lower than the highest one (`FENCED_WRITE`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

import redis.asyncio

from aiolock import LeaseLostError, Lock, ReadLock, ReadWriteLock, Semaphore, WriteLock

from ..support import programs

__all__ = ("FENCED_WRITE", "fenced_write")

FENCED_WRITE = """
-- KEYS[1] highest token written so far, KEYS[2] log (list)
-- ARGV[1] fencing token of the writer, ARGV[2] writer's label
-- Returns 1: accepted (the token is the highest so far); 0: rejected (a higher one wrote).
local token = tonumber(ARGV[1])
local highest = tonumber(redis.call('GET', KEYS[1]) or '0')
if token < highest then
  redis.call('RPUSH', KEYS[2], 'rejected:' .. ARGV[2] .. ':' .. ARGV[1])
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], 'accepted:' .. ARGV[2] .. ':' .. ARGV[1])
return 1
"""


async def fenced_write(client: redis.asyncio.Redis, fence_key: str, token: int, label: str) -> bool:
    """One write to the fenced store; True if accepted."""
    reply = await client.eval(
        FENCED_WRITE, 2, f"{fence_key}:max", f"{fence_key}:log", str(token), label
    )
    return int(reply) == 1


def emit(event: str, **fields: Any) -> None:
    """A line for the test, with the time it was written (`t`, monotonic)."""
    programs.emit(event, t=time.monotonic(), **fields)


def primitive(
    client: redis.asyncio.Redis, args: argparse.Namespace
) -> Lock | Semaphore | ReadLock | WriteLock:
    if args.limit:
        return Semaphore(client, args.name, limit=args.limit, ttl=args.ttl)
    if args.rw:
        rw = ReadWriteLock(client, args.name, ttl=args.ttl)
        return rw.read() if args.rw == "read" else rw.write()
    return Lock(client, args.name, ttl=args.ttl)


async def hold(client: redis.asyncio.Redis, args: argparse.Namespace) -> None:
    made: Any = primitive(client, args)
    if args.permits > 1:  # a lease of several permits (`--limit` too)
        made = await made.acquire(permits=args.permits)
    async with made as lease:
        emit("acquired", fencing_token=lease.fencing_token, pid=os.getpid(), slot=lease.slot)
        await asyncio.sleep(args.hold)


async def block(client: redis.asyncio.Redis, args: argparse.Namespace) -> None:
    zombie: asyncio.Task[bool] | None = None
    token = 0
    try:
        async with primitive(client, args) as lease:
            token = lease.fencing_token
            accepted = await fenced_write(client, args.fence_key, token, "holder")
            emit("write", label="holder", fencing_token=token, accepted=accepted)
            emit("acquired", fencing_token=token, pid=os.getpid())
            sys.stdin.readline()  # a blocking call: the whole event loop stops here
            emit("resumed")
            # The zombie write: started by the body, carried out by a task of its own.
            zombie = asyncio.create_task(fenced_write(client, args.fence_key, token, "zombie"))
            await asyncio.shield(zombie)
            await asyncio.sleep(args.hold)
    finally:
        if zombie is not None:
            accepted = await zombie
            emit("write", label="zombie", fencing_token=token, accepted=accepted)


async def main(args: argparse.Namespace) -> None:
    client = redis.asyncio.Redis.from_url(args.url)
    try:
        await (hold if args.mode == "hold" else block)(client, args)
        emit("completed")
    except LeaseLostError as error:
        emit("lost", reason=error.reason.value, fencing_token=error.fencing_token)
    except Exception as error:  # noqa: BLE001 - reported to the test, which fails on it
        emit("error", type=type(error).__name__, message=str(error))
    finally:
        await client.aclose()
        emit("exit")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = programs.parser("A lock holder in a process of its own.")
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--hold", type=float, default=60.0)
    parser.add_argument("--mode", choices=("hold", "block"), default="hold")
    parser.add_argument("--fence-key", default="")
    parser.add_argument("--limit", type=int, default=0, help="a semaphore's (0: the lock)")
    parser.add_argument("--permits", type=int, default=1, help="with --limit: held at once")
    parser.add_argument("--rw", choices=("read", "write"), help="a read-write lock's side")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
