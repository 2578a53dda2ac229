"""A lock holder whose process stops running, writing to a fenced store before and after.

`python -m tests.usage.fenced_holder --url URL --name NAME --ttl 1 --store KIND --target T`
(from the repository root) takes the lock NAME, writes 1 to the store (see
`fenced_stores.Writer`), prints `acquired`, and blocks its event loop on a read of stdin
(as a long GC pause or a stopped process would: nothing renews its lease). Once a line
arrives it writes 2 from a task of its own, as a write already under way when the loss is
noticed: the late write. One JSON object per line on stdout:

- `write` (`label`: "first" or "late", `fencing_token`, `accepted`);
- `acquired` (`fencing_token`): its event loop is blocked from here on;
- `resumed`; `lost` (`reason`) or `completed`; `error` (`type`, `message`); `exit`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import redis.asyncio

from aiolock import LeaseLostError, Lock

from ..support import programs
from ..support.programs import emit
from .fenced_stores import Writer


async def hold(client: redis.asyncio.Redis, writer: Writer, args: argparse.Namespace) -> None:
    late: asyncio.Task[bool] | None = None
    token = 0
    try:
        async with Lock(client, args.name, ttl=args.ttl) as lease:
            token = lease.fencing_token
            emit("write", label="first", fencing_token=token, accepted=await writer.write(1, token))
            emit("acquired", fencing_token=token)
            sys.stdin.readline()  # a blocking call: the whole event loop stops here
            emit("resumed")
            late = asyncio.create_task(writer.write(2, token))
            await asyncio.shield(late)
            await asyncio.sleep(60)  # the loss cancels this
        emit("completed")
    except LeaseLostError as error:
        emit("lost", reason=error.reason.value)
    finally:
        if late is not None:
            emit("write", label="late", fencing_token=token, accepted=await late)


async def main(args: argparse.Namespace) -> None:
    client = redis.asyncio.Redis.from_url(args.url)
    writer = Writer(args.store, args.target, client=client)
    try:
        writer.prepare()
        await hold(client, writer, args)
    except Exception as error:  # noqa: BLE001 - reported to the test, which fails on it
        emit("error", type=type(error).__name__, message=str(error))
    finally:
        await writer.close()
        await client.aclose()
        emit("exit")


def parse() -> argparse.Namespace:
    parser = programs.parser(__doc__)
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--store", required=True)
    parser.add_argument("--target", required=True)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
