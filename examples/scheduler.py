"""Run the scheduler on exactly one of three processes: kill the leader, watch another take
over; stop the next one, watch the last take over at once.

    python examples/scheduler.py

Three processes campaign in the election "scheduler" (ttl 2 s). The leader runs the
scheduler: every 50 ms it writes a tick to a fenced log, a Redis script that refuses a
fencing token lower than the highest it has accepted (each term's fencing token is larger
than every earlier term's). This process observes the election
(`Election.observe()`), and:

1. once the first leader has ticked for a while, kills it (SIGKILL): nobody resigns, so
   the next candidate takes over when the dead leader's term expires, within the ttl;
2. then stops the second leader the way a deployment does (SIGTERM): it resigns on its way
   out (`release_on_signals`), and the third takes over at once;
3. stops the third the same way.

Checked: three leaders one after the other, each term's fencing token larger than the
last's; the ticks in the fenced log all accepted, in fencing token order; the takeover after the kill within the ttl (and
a little), the takeover after the SIGTERM well under a second.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import secrets
import signal
import time

import redis.asyncio
from _server import check, redis_url

from aiolock import Election, Leader, LeaseLostError, release_on_signals

TTL = 2.0
CANDIDATES = 3

FENCED_TICK = """
-- KEYS[1] highest fencing token accepted, KEYS[2] the ticks (list); ARGV[1] fencing token,
-- ARGV[2] who. Returns 1 if the tick is accepted (token >= the highest), else 0.
if tonumber(ARGV[1]) < tonumber(redis.call('GET', KEYS[1]) or '0') then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2])
return 1
"""


async def candidate(url: str, run: str) -> None:
    db = redis.asyncio.Redis.from_url(url)
    uninstall = release_on_signals()  # SIGTERM: cancel the leader's work, resign, exit
    election = Election(db, f"{run}:scheduler", ttl=TTL, identity=f"worker:{os.getpid()}")
    tick = db.register_script(FENCED_TICK)
    try:
        async for term in election.campaign():
            try:
                async with term:  # the scheduler runs here, as long as the term lasts
                    while True:
                        await tick(
                            keys=[f"{run}:highest", f"{run}:ticks"],
                            args=[term.fencing_token, term.identity],
                        )
                        await asyncio.sleep(0.05)
            except LeaseLostError:
                continue  # the term was lost (a pause, Redis unreachable): campaign again
    finally:  # on SIGTERM: the work was cancelled and the term resigned; the process ends
        uninstall()
        await db.aclose()


def start_candidate(url: str, run: str) -> None:
    asyncio.run(candidate(url, run))


async def ticked(db: redis.asyncio.Redis, run: str, fencing_token: int, count: int) -> None:
    """Wait until the leader whose term has `fencing_token` has ticked `count` times
    (checked every 50 ms, 30 s at most)."""
    for _ in range(600):
        ticks = await db.lrange(f"{run}:ticks", 0, -1)
        if sum(tick.split()[0] == str(fencing_token) for tick in ticks) >= count:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(
        f"the leader of fencing token {fencing_token} did not tick {count} times in 30 s"
    )


def pid_of(leader: Leader) -> int:
    return int(leader.identity.rpartition(":")[2])


async def main() -> None:
    run = f"scheduler-{secrets.token_hex(4)}"
    async with redis_url() as url:
        context = multiprocessing.get_context("spawn")
        processes = [
            context.Process(target=start_candidate, args=(url, run)) for _ in range(CANDIDATES)
        ]
        for process in processes:
            process.start()
        db = redis.asyncio.Redis.from_url(url, decode_responses=True)
        leaders: list[Leader] = []
        takeovers: list[float] = []
        try:
            changes = Election(db, f"{run}:scheduler").observe()
            stopped_at = 0.0
            for action in ("kill", "terminate", "terminate"):
                leader = None
                while leader is None:  # the next leader
                    leader = await asyncio.wait_for(anext(changes), 30)
                if stopped_at:
                    takeovers.append(time.monotonic() - stopped_at)
                leaders.append(leader)
                print(f"leader: {leader.identity}, fencing token {leader.fencing_token}")
                await ticked(db, run, leader.fencing_token, 5)  # it runs the scheduler for a while
                stopped_at = time.monotonic()
                if action == "kill":
                    print(f"  killing {leader.identity} (SIGKILL): nobody resigns")
                    os.kill(pid_of(leader), signal.SIGKILL)
                else:
                    print(f"  stopping {leader.identity} (SIGTERM): it resigns on its way out")
                    os.kill(pid_of(leader), signal.SIGTERM)
            await changes.aclose()
            ticks = [line.split() for line in await db.lrange(f"{run}:ticks", 0, -1)]
        finally:
            for process in processes:
                process.join(10)
                if process.is_alive():
                    process.kill()
                    process.join()
            await db.aclose()
    tokens = [leader.fencing_token for leader in leaders]
    tick_tokens = [int(token) for token, _ in ticks]
    print(
        f"takeover after the kill: {takeovers[0]:.2f}s (ttl {TTL:g}s); after the SIGTERM: "
        f"{takeovers[1] * 1000:.0f} ms; {len(ticks)} ticks from {len(set(tick_tokens))} terms"
    )
    check(len({pid_of(leader) for leader in leaders}) == 3, "three leaders, one after the other")
    check(
        tokens == sorted(tokens) and len(set(tokens)) == 3,
        "each term's fencing token larger than the last's",
    )
    check(
        tick_tokens == sorted(tick_tokens) and set(tick_tokens) == set(tokens),
        "every leader ticked, and the fenced log saw their fencing tokens in order",
    )
    check(takeovers[0] <= TTL + 1.0, "a killed leader was replaced within the ttl")
    check(takeovers[1] < 1.0, "a leader that stopped was replaced at once")


if __name__ == "__main__":
    asyncio.run(main())
