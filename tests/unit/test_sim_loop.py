"""The simulated loop (`tests.simulation.loop`): one seed, one run, byte for byte; another
seed, another interleaving; virtual time; paused and killed processes."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from tests.simulation.loop import PROCESS, SimLoop, Stuck


def _race(seed: int) -> tuple[list[str], list[str]]:
    """Four tasks sleeping the same times: their order comes from the seed."""
    loop = SimLoop(seed)
    loop.tracing = True
    order: list[str] = []

    async def worker(index: int) -> None:
        for step in range(3):
            await asyncio.sleep(0.5)
            order.append(f"{index}.{step}@{loop.time():.6f}")

    async def main() -> None:
        await asyncio.gather(*(worker(i) for i in range(4)))

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return order, loop.trace


def test_one_seed_gives_one_run_byte_for_byte() -> None:
    assert _race(7) == _race(7)


def test_another_seed_gives_another_interleaving() -> None:
    orders = {tuple(_race(seed)[0]) for seed in range(6)}
    assert len(orders) > 1


def test_time_is_virtual_and_jumps_to_the_next_timer() -> None:
    loop = SimLoop(1, cost=0.0)
    try:
        start = loop.time()
        loop.run_until_complete(asyncio.sleep(3600))
        assert loop.time() == pytest.approx(start + 3600)
    finally:
        loop.close()


def test_ready_callbacks_keep_asyncio_order() -> None:
    """`call_soon` callbacks run in the order they were registered, as asyncio promises."""
    for seed in range(5):
        loop = SimLoop(seed)
        seen: list[int] = []
        for i in range(20):
            loop.call_soon(seen.append, i)
        loop.call_soon(loop.stop)
        loop.run_forever()
        loop.close()
        assert seen == list(range(20))


def test_a_paused_process_runs_nothing_until_resumed_and_a_killed_one_never() -> None:
    loop = SimLoop(3, cost=0.0)
    ticks: dict[str, list[float]] = {"a": [], "b": []}

    async def ticker(name: str) -> None:
        while True:
            await asyncio.sleep(1)
            ticks[name].append(loop.time())

    def spawn(name: str) -> asyncio.Task[None]:
        context = contextvars.copy_context()
        context.run(PROCESS.set, name)
        return loop.create_task(ticker(name), context=context)

    async def main() -> None:
        tasks = [spawn("a"), spawn("b")]
        await asyncio.sleep(2.5)
        loop.pause("a")
        await asyncio.sleep(5)
        assert len(ticks["a"]) == 2
        loop.resume("a")
        await asyncio.sleep(0.1)
        loop.kill("b")
        count = len(ticks["b"])
        await asyncio.sleep(3)
        assert len(ticks["b"]) == count
        tasks[0].cancel()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    # the timers that fell due during the pause ran at once on resume
    assert len([t for t in ticks["a"] if t < 1007.6]) >= 3


def test_a_loop_with_nothing_left_to_do_says_so() -> None:
    loop = SimLoop(0)
    try:
        with pytest.raises(Stuck):
            loop.run_until_complete(loop.create_future())
    finally:
        loop.close()
