"""The suite's own hygiene checks (`tests/support/hygiene.py`), on small test files run by pytester in
a pytest process of their own: a test that leaves a process or a socket behind fails, naming
it; a hung async test is stopped with its stack before pytest-timeout's limit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux"),
        reason="the process and descriptor checks read /proc",
    ),
    # Each runs pytest in a new interpreter (bounded below), which may take more than the
    # suite's minute to start and run on a loaded machine.
    pytest.mark.timeout(180),
]

LEAKY = """
import asyncio, socket, subprocess

import pytest

KEPT = []


def test_leaves_a_process():
    KEPT.append(subprocess.Popen(["sleep", "60"]))


def test_leaves_a_socket():
    KEPT.append(socket.socket())


async def test_leaves_an_asyncio_child():
    KEPT.append(await asyncio.create_subprocess_exec("sleep", "60"))


def test_ends_what_it_starts():
    with subprocess.Popen(["sleep", "60"]) as process, socket.socket():
        process.kill()


@pytest.fixture(scope="module")
def module_server():
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def test_a_wider_fixtures_process_is_its_own(module_server):
    assert module_server.poll() is None
"""

HANGS = """
import asyncio


async def wait_for_ever():
    await asyncio.Event().wait()


async def test_hangs():
    await wait_for_ever()
"""


GARBAGE = """
import warnings


class Unclosed:
    def __init__(self):
        self.cycle = self  # collected only by the garbage collector

    def __del__(self):
        warnings.warn("an Unclosed was never closed", ResourceWarning)


def test_fails_leaving_garbage():
    unclosed = Unclosed()
    assert unclosed is None


def test_after_it():
    pass
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.syspathinsert(ROOT)
    return pytester.runpytest_subprocess(
        "-p", "tests.support.hygiene", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
        "-o", "asyncio_default_fixture_loop_scope=function",
        "-W", "error", *args, timeout=120,
    )  # fmt: skip


def test_what_a_test_leaves_behind_fails_it_by_name(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_leaky=LEAKY)
    result = run(pytester)
    result.assert_outcomes(passed=5, errors=3)
    out = result.stdout.str()
    for test in ("test_leaves_a_process", "test_leaves_an_asyncio_child"):
        assert f"test_leaky.py::{test} left behind what it started" in out, out
        assert "(sleep 60) is still running" in out, out
    assert "test_leaky.py::test_leaves_a_socket left behind what it started" in out, out
    assert "(socket:[" in out, out
    # Listed again at the end, and nothing is left running: each was killed when found.
    assert "processes and descriptors left behind" in out, out
    assert "at the end of the session" not in out, out
    for name in ("test_ends_what_it_starts", "test_a_wider_fixtures_process_is_its_own"):
        assert f"ERROR test_leaky.py::{name}" not in out, out


def test_a_hung_async_test_is_stopped_with_its_stack_within_its_limit(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_hangs=HANGS)
    result = run(pytester, "-o", "timeout=8")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "AsyncTestTimeout: stopped after" in out, out
    # The stack of the test's task, down to the await that never returned.
    assert "test_hangs.py:9 in test_hangs" in out, out
    assert "test_hangs.py:5 in wait_for_ever" in out, out
    assert "Timeout (>8.0s) from pytest-timeout" not in out, out  # not the outer bound


def test_what_a_failed_test_left_to_collect_is_reported_on_it(pytester: pytest.Pytester) -> None:
    """Objects of a failed test that warn when collected (a lease never released) are
    collected at its teardown, so the warning is reported on it, not on the next test."""
    pytester.makepyfile(test_garbage=GARBAGE)
    result = run(pytester)
    result.assert_outcomes(failed=1, passed=1, errors=1)
    out = result.stdout.str()
    assert "ERROR test_garbage.py::test_fails_leaving_garbage" in out, out
    assert "an Unclosed was never closed" in out, out
