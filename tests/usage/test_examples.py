"""Every example runs, prints what it shows, and exits 0 only if its invariant holds.

Each runs as a subprocess without REDIS_URL, so it also starts its own throwaway server as
a user's first run would. The web examples' apps are also driven here directly: FastAPI
through httpx's ASGI transport, aiohttp through its test client.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer

pytestmark = pytest.mark.real_only

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BOUND = 120.0
"""Seconds an example may take (they take one to six)."""


def example_names() -> list[str]:
    return sorted(p.stem for p in EXAMPLES.glob("*.py") if not p.stem.startswith("_"))


def test_every_example_is_listed_here() -> None:
    assert example_names() == [
        "aiohttp_app", "api_pool", "catalog", "celery_tasks", "cron_once",
        "django_command", "fastapi_orders", "fenced_files", "fenced_http", "fenced_sql",
        "fenced_storage", "flash_sale",
        "idempotent_order", "long_job", "quickstart", "redlock_billing", "scheduler",
        "web_shutdown",
        "worker_pool",
    ]  # fmt: skip


@pytest.mark.timeout(BOUND + 60)  # its own bound, not the suite's minute, ends a slow run
@pytest.mark.parametrize("example", example_names())
def test_the_example_runs_and_its_invariant_holds(example: str, binaries: list[object]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    try:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / f"{example}.py")],
            capture_output=True, text=True, timeout=BOUND, env=env, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{example} did not finish within {BOUND:g}s:\n{exc.stdout!r}")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "started a throwaway" in done.stdout
    assert "FAILED" not in done.stdout


def load(example: str) -> ModuleType:
    sys.path.insert(0, str(EXAMPLES))  # for the examples' `_server` helper
    try:
        spec = importlib.util.spec_from_file_location(
            f"example_{example}", EXAMPLES / f"{example}.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(EXAMPLES))


async def test_fastapi_orders_app_through_the_asgi_transport(server_url: str) -> None:
    example = load("fastapi_orders")
    app = example.create_app(server_url, prefix=f"shop-test-{os.getpid()}-{id(example)}")
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://shop") as web:
            clicks = await asyncio.gather(*(web.post("/carts/c1/place") for _ in range(2)))
            later = await web.post("/carts/c1/place")
    assert sorted(c.status_code for c in clicks) == [200, 409]
    assert later.status_code == 409 and later.json()["detail"] == "this cart is already ordered"


async def test_aiohttp_app_through_the_test_client(server_url: str) -> None:
    example = load("aiohttp_app")
    async with TestClient(TestServer(example.create_app(server_url))) as web:
        name = f"test-{os.getpid()}-{id(example)}"
        statuses = await asyncio.gather(
            *(web.post(f"/counters/{name}/increment") for _ in range(20))
        )
        assert {response.status for response in statuses} == {200}
        final = await web.post(f"/counters/{name}/increment")
        assert (await final.json())["value"] == 21
