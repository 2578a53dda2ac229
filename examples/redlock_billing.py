"""A billing job on a Redlock over three servers, and its tests, with aiolock's pytest plugin.

    pip install "aiolock-redis[pytest]"
    python examples/redlock_billing.py      # runs the tests below with pytest

`bill` charges a customer under a `Redlock` over three independent servers: it charges
once a majority of them granted the lock, and is busy otherwise. Its tests need no
hand-written fixture: `aiolock_clients` gives a client on each of three throwaway servers
(`aiolock_servers`, emptied before each test), `hold_elsewhere(clients, redlock,
nodes=[...])` makes the lock taken "by another process" on some of the nodes, and
`expire_now(clients, redlock)` makes the job's lease lost, which stops the charge.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import redis.asyncio
from _server import check

from aiolock import AcquireTimeoutError, LeaseLostError, Redlock
from aiolock.testing import expire_now, hold_elsewhere

Charge = Callable[[int, int], Awaitable[None]]
"""Charges a customer: (customer id, fencing token)."""


def billing_lock(
    clients: list[redis.asyncio.Redis], customer_id: int, *, ttl: float = 10.0
) -> Redlock:
    """The customer's billing lock: one run at a time, busy after 0.2 s."""
    return Redlock(clients, f"billing:{customer_id}", ttl=ttl, timeout=0.2)


async def bill(redlock: Redlock, customer_id: int, charge: Charge) -> str:
    """Charge the customer under the lock: "billed", or "busy" if another run holds it."""
    try:
        async with redlock as lease:
            await charge(customer_id, lease.fencing_token)
    except AcquireTimeoutError:
        return "busy"
    return "billed"


# ---------------------------------------------------------------------------------- tests
async def test_a_lock_on_one_node_of_three_does_not_stop_billing(
    aiolock_clients: list[redis.asyncio.Redis],
) -> None:
    charged: list[int] = []

    async def charge(customer_id: int, fence: int) -> None:
        charged.append(customer_id)

    redlock = billing_lock(aiolock_clients, 42)
    async with hold_elsewhere(aiolock_clients, redlock, nodes=[0]):  # a minority
        assert await bill(redlock, 42, charge) == "billed"
    assert charged == [42]


async def test_a_lock_on_two_nodes_of_three_makes_it_busy(
    aiolock_clients: list[redis.asyncio.Redis],
) -> None:
    async def charge(customer_id: int, fence: int) -> None:
        raise AssertionError("charged without the lock")

    redlock = billing_lock(aiolock_clients, 42)
    async with hold_elsewhere(aiolock_clients, redlock, nodes=[0, 2]):  # a majority
        assert await bill(redlock, 42, charge) == "busy"


async def test_a_lost_lease_stops_the_charge(aiolock_clients: list[redis.asyncio.Redis]) -> None:
    started, finished = asyncio.Event(), []
    redlock = billing_lock(aiolock_clients, 7, ttl=0.6)

    async def charge(customer_id: int, fence: int) -> None:
        started.set()
        await asyncio.Event().wait()  # a slow payment provider
        finished.append(customer_id)

    job = asyncio.create_task(bill(redlock, 7, charge))
    async with asyncio.timeout(10):
        await started.wait()
    assert await expire_now(aiolock_clients, redlock)  # on every node
    with pytest.raises(LeaseLostError):
        async with asyncio.timeout(10):
            await job  # cancelled at its next renewal
    assert finished == []


def main() -> None:
    """Run this file's tests with pytest, in a process of its own (as `pytest` would)."""
    here = Path(__file__).resolve()
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", str(here), "-q", "-p", "no:cacheprovider",
            "-c", os.devnull, "--rootdir", str(here.parent), "-o", "asyncio_mode=auto",
            "-o", "asyncio_default_fixture_loop_scope=function", "-W", "error",
        ],
        check=False, timeout=300,
    )  # fmt: skip
    print("(started a throwaway server for each of the 3 nodes: the aiolock_servers fixture)")
    check(done.returncode == 0, "the billing job's three tests passed")


if __name__ == "__main__":
    main()
