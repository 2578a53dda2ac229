"""The pytest plugin, as a user meets it: a tiny test file of theirs, run by pytester in a
pytest process of its own (the plugin is registered by aiolock's `pytest11` entry point)."""

from __future__ import annotations

import pytest

from aiolock.testing import find_binaries

from ..conftest import in_ci

USER_TESTS = """
import asyncio

import pytest

from aiolock import (
    AcquireTimeoutError, LeaseLostError, Lock, LossReason, MultiLock, Redlock, fenced_set,
)
from aiolock.testing import RedisServer, expire_now, hold_elsewhere


async def reserve(client, order):
    async with Lock(client, f"orders:{order}", ttl=5, timeout=0.2):
        return "reserved"


@pytest.mark.asyncio
async def test_busy_on_a_real_server(aiolock_client, aiolock_server):
    assert isinstance(aiolock_server, RedisServer)
    assert await aiolock_client.dbsize() == 0  # emptied for each test
    async with hold_elsewhere(aiolock_client, "orders:1") as lease:
        assert lease.held
        with pytest.raises(AcquireTimeoutError):
            await reserve(aiolock_client, 1)
    assert await reserve(aiolock_client, 1) == "reserved"
    await aiolock_client.set("left-behind", 1)


@pytest.mark.asyncio
async def test_the_next_test_starts_empty(aiolock_client):
    assert await aiolock_client.get("left-behind") is None


@pytest.mark.asyncio
async def test_busy_on_fakeredis(aiolock_fakeredis):
    async with hold_elsewhere(aiolock_fakeredis, "orders:2"):
        with pytest.raises(AcquireTimeoutError):
            await reserve(aiolock_fakeredis, 2)
    assert await reserve(aiolock_fakeredis, 2) == "reserved"


async def lose(client):
    lock = Lock(client, "orders:3", ttl=0.3)
    with pytest.raises(LeaseLostError) as lost:
        async with lock:
            assert await expire_now(client, lock)
            await asyncio.sleep(5)  # cancelled at the next renewal, within 0.1 s
    assert lost.value.reason is LossReason.NOT_OWNER
    assert not await expire_now(client, "orders:3")


@pytest.mark.asyncio
async def test_lost_on_a_real_server(aiolock_client):
    await lose(aiolock_client)


@pytest.mark.asyncio
async def test_lost_on_fakeredis(aiolock_fakeredis):
    await lose(aiolock_fakeredis)


@pytest.mark.asyncio
async def test_a_superseded_write_refused_on_fakeredis(aiolock_fakeredis):
    first = await Lock(aiolock_fakeredis, "orders:4").acquire()
    await first.release()
    async with Lock(aiolock_fakeredis, "orders:4") as second:
        assert await fenced_set(aiolock_fakeredis, "orders:4:total", 10, second.fencing_token)
    assert not await fenced_set(aiolock_fakeredis, "orders:4:total", 99, first.fencing_token)


@pytest.mark.asyncio
async def test_a_redlock_on_three_servers(aiolock_clients, aiolock_servers):
    assert len(aiolock_clients) == len(aiolock_servers) == 3
    assert [await c.dbsize() for c in aiolock_clients] == [0, 0, 0]
    billing = Redlock(aiolock_clients, "billing", ttl=5, timeout=0.2)
    async with hold_elsewhere(aiolock_clients, billing, nodes=[0]):
        async with billing:  # held on one node of three: the quorum is still free
            pass
    async with hold_elsewhere(aiolock_clients, billing, nodes=[0, 1]):
        with pytest.raises(AcquireTimeoutError):
            await billing.acquire()
    short = Redlock(aiolock_clients, "billing", ttl=0.6)
    with pytest.raises(LeaseLostError) as lost:
        async with short:
            assert await expire_now(aiolock_clients, short)
            await asyncio.sleep(5)  # cancelled at the next renewal, within 0.2 s
    assert lost.value.reason is LossReason.NOT_OWNER


@pytest.mark.asyncio
async def test_a_cluster(aiolock_cluster, aiolock_cluster_client):
    assert len(aiolock_cluster.servers) == 3
    assert await aiolock_cluster_client.dbsize() == 0
    accounts = MultiLock(aiolock_cluster_client, [f"account:{i}" for i in range(6)], ttl=5)
    async with accounts as held:  # names on different nodes
        assert len(held.fencing_tokens) == 6
        assert await Lock(aiolock_cluster_client, "account:3").try_acquire() is None
    await aiolock_cluster_client.set("left-behind", 1)


@pytest.mark.asyncio
async def test_the_next_cluster_test_starts_empty(aiolock_cluster_client):
    assert await aiolock_cluster_client.get("left-behind") is None
"""

INI = """
[pytest]
asyncio_mode = {mode}
asyncio_default_fixture_loop_scope = function
asyncio_default_test_loop_scope = function
filterwarnings = error
timeout = 60
"""


@pytest.fixture
def user_tests(pytester: pytest.Pytester) -> pytest.Pytester:
    if not find_binaries():
        if in_ci():
            pytest.fail("no server binary")
        pytest.skip("no server binary")
    pytester.makepyfile(test_user=USER_TESTS)
    return pytester


# (Each runs pytest in a new interpreter, bounded below: that may take more than the
# suite's minute on a loaded machine.)
@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["strict", "auto"])
def test_the_plugins_fixtures_in_a_users_tests(user_tests: pytest.Pytester, mode: str) -> None:
    user_tests.makeini(INI.format(mode=mode))
    # Without Hypothesis's plugin, which imports Hypothesis at the end of the session (its
    # modules' asserts rewritten, each module parsed by `ast`): CPython 3.11.7's parser
    # once failed there with "AST constructor recursion depth mismatch", a fault of its
    # own accounting (the user's tests had all passed).
    result = user_tests.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:hypothesispytest", timeout=120
    )  # fmt: skip
    result.assert_outcomes(passed=9)


@pytest.mark.timeout(300)
def test_the_plugin_without_auto_loading(
    user_tests: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With entry points not loaded, `-p aiolock.testing.plugin` brings the fixtures (and
    `-p asyncio` pytest-asyncio, `-p timeout` its time limit)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    user_tests.makeini(INI.format(mode="strict"))
    result = user_tests.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "asyncio", "-p", "pytest_timeout",
        "-p", "aiolock.testing.plugin", timeout=120,
    )  # fmt: skip
    result.assert_outcomes(passed=9)
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    result = user_tests.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:aiolock", timeout=120
    )
    result.stdout.fnmatch_lines(["*fixture 'aiolock_client' not found*"])
