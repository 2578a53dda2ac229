"""The event loop the async tests run on is the one asked for (`--loop`)."""

from __future__ import annotations

import asyncio

import pytest


async def test_the_tests_run_on_the_requested_event_loop(request: pytest.FixtureRequest) -> None:
    loop = asyncio.get_running_loop()
    if request.config.getoption("--loop") == "uvloop":
        assert type(loop).__module__.startswith("uvloop"), type(loop)
    else:
        assert isinstance(loop, asyncio.BaseEventLoop) and not type(loop).__module__.startswith(
            "uvloop"
        ), type(loop)
