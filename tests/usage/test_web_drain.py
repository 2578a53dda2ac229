"""`release_on_signals(drain=...)` under real servers in child processes: uvicorn, gunicorn
(with uvicorn's worker) and aiohttp's runner. On SIGTERM the server drains as it would
without aiolock (a request that ends meanwhile is answered 200), and a request still
holding its lock just before the grace period ends gets 503 with Retry-After, never 500,
its lock released; the server then exits."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys

import httpx
import pytest
import redis.asyncio

from aiolock import Lock

from ..support.children import ROOT, child
from ..support.servers import RedisServer, ServerBinary

pytestmark = [pytest.mark.real_only, pytest.mark.skipif(sys.platform == "win32", reason="Unix")]

EXAMPLES = ROOT.parent / "examples"
GRACE = "3"

SERVERS = {
    "uvicorn": (
        "python", "-m", "uvicorn", "--factory", "web_shutdown:create_app",
        "--app-dir", str(EXAMPLES), "--host", "127.0.0.1", "--port", "0",
        "--timeout-graceful-shutdown", GRACE,
    ),
    "gunicorn": (
        "python", "-m", "gunicorn", "--worker-class", "uvicorn.workers.UvicornWorker",
        "--workers", "1", "--chdir", str(EXAMPLES), "--bind", "127.0.0.1:0",
        "--graceful-timeout", GRACE, "web_shutdown:create_app()",
    ),
    "aiohttp": ("python", "-m", "tests.usage.drain_aiohttp_app"),
}  # fmt: skip
LISTENING = r"(?:running on|Listening at:) http://127\.0\.0\.1:(\d+)"
DRAINING = r"the server drains"


class Log:
    """What a child writes on stderr, read as it comes; `find` waits for a line."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.lines: list[str] = []
        self.grew = asyncio.Event()
        self.reader = asyncio.create_task(self._read(stream))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.lines.append(line.decode(errors="replace"))
            self.grew.set()

    async def find(self, pattern: str) -> re.Match[str]:
        try:
            async with asyncio.timeout(30):
                while True:
                    for line in self.lines:
                        if found := re.search(pattern, line):
                            return found
                    self.grew.clear()
                    await self.grew.wait()
        except TimeoutError:
            raise AssertionError(f"no {pattern!r} in:\n{''.join(self.lines)}") from None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", sorted(SERVERS))
async def test_the_server_drains_and_the_rest_gets_503(
    server: str, binaries: list[ServerBinary]
) -> None:
    with RedisServer(binaries[0]) as redis_server:  # the apps' names are fixed: a server of its own
        # No socket timeout: BLPOP below waits up to 30 s for the app's handlers (a worker
        # still booting on a loaded machine); redis-py's default read bound, 5 s, would end
        # it first (seen in CI, with both lanes' servers booting at once).
        client = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=None)
        try:
            await drained(server, redis_server.url, client)
        finally:
            await client.aclose()


async def drained(server: str, url: str, client: redis.asyncio.Redis) -> None:
    env = {**os.environ, "REDIS_URL": url, "PYTHONPATH": str(ROOT.parent)}
    async with child(*SERVERS[server], env=env) as process:
        assert process.stderr is not None
        log = Log(process.stderr)
        try:
            port = (await log.find(LISTENING)).group(1)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as web:
                paid = asyncio.create_task(web.post("/orders/1/place"))
                unpaid = asyncio.create_task(web.post("/orders/2/place"))
                for _ in range(2):
                    assert await client.blpop(["placing"], timeout=30) is not None
                process.send_signal(signal.SIGTERM)
                await log.find(DRAINING)
                await client.rpush("payment:1", "ok")  # confirmed during the drain
                first, second = await paid, await unpaid
            async with asyncio.timeout(30):
                await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
            async with asyncio.timeout(30):
                await log.reader
    said = "".join(log.lines)
    assert first.status_code == 200, said
    assert first.json()["order"] == 1
    assert second.status_code == 503, said
    assert second.headers["Retry-After"] == "1"
    assert not await Lock(client, "orders:2").locked()
    assert "Traceback" not in said, said
