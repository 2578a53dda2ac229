"""aiolock.aiohttp: a lock per request, through aiohttp's test client, on a real server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from aiolock import ConfigError, Lease, LeaseLostError, Lock
from aiolock.aiohttp import locked_handler

from ..support.servers import RedisServer
from ..support.waits import handler_entered

pytestmark = pytest.mark.real_only

REDIS = web.AppKey("redis", redis.asyncio.Redis)


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async with TestClient(TestServer(app)) as http:
        yield http


async def test_the_handler_runs_under_the_lock_and_it_is_released_before_the_response(
    client: redis.asyncio.Redis, name: str
) -> None:
    seen: list[tuple[str, bool]] = []
    held_at_response: list[bool] = []

    @locked_handler(name + ":{order_id}", client=REDIS, ttl=5)
    async def place(request: web.Request, lease: Lease) -> web.Response:
        seen.append((lease.name, await Lock(client, lease.name).locked()))
        return web.json_response({"fence": lease.fencing_token})

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        held_at_response.append(await Lock(client, f"{name}:42").locked())

    app = web.Application()
    app[REDIS] = client
    app.router.add_post("/orders/{order_id}", place)
    app.on_response_prepare.append(on_prepare)
    async with serve(app) as http:
        response = await http.post("/orders/42")
        assert response.status == 200, await response.text()
        assert (await response.json())["fence"] > 0
    assert seen == [(f"{name}:42", True)]
    assert held_at_response == [False]


async def test_a_busy_lock_fails_fast_with_the_chosen_status_and_retry_after(
    client: redis.asyncio.Redis, name: str
) -> None:
    ran: list[str] = []

    @locked_handler(name + ":{item}", client=client)
    async def conflict(request: web.Request) -> web.Response:
        ran.append("a")
        return web.Response(text="a")

    @locked_handler(name + ":{item}", client=lambda: client, busy_status=429)
    async def too_many(request: web.Request) -> web.Response:
        ran.append("b")
        return web.Response(text="b")

    app = web.Application()
    app.router.add_post("/a/{item}", conflict)
    app.router.add_post("/b/{item}", too_many)
    async with serve(app) as http:
        async with Lock(client, f"{name}:x", ttl=30):
            first = await http.post("/a/x")
            second = await http.post("/b/x")
        assert (first.status, second.status) == (409, 429)
        # No typical hold known yet: the holder's key expires in 30 s at the latest.
        assert first.headers["Retry-After"] == second.headers["Retry-After"] == "30"
        assert ran == []
        assert (await http.post("/a/x")).status == 200


async def test_a_loss_stops_the_handler_and_answers_503(
    client: redis.asyncio.Redis, name: str
) -> None:
    in_handler = asyncio.Event()
    proceed = asyncio.Event()
    log = f"{name}:writes"

    @locked_handler(name + ":{order_id}", client=client, ttl=1.5)
    async def pay(request: web.Request) -> web.Response:
        await client.rpush(log, "before")
        in_handler.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proceed.wait(), 5)  # without the loss: gives up after 5 s
        await client.rpush(log, "after the loss")
        return web.Response(text="paid")

    app = web.Application()
    app.router.add_post("/pay/{order_id}", pay)
    async with serve(app) as http, asyncio.timeout(20):
        request = asyncio.create_task(http.post("/pay/7"))
        await handler_entered(in_handler, request)
        await client.delete(f"aiolock:{{{name}:7}}")  # the lock is taken from the handler
        response = await request
        assert response.status == 503, await response.text()
    assert await client.lrange(log, 0, -1) == [b"before"]


async def test_the_name_may_come_from_the_query(client: redis.asyncio.Redis, name: str) -> None:
    @locked_handler(name + ":{cart}", client=client)
    async def cart(request: web.Request, lease: Lease) -> web.Response:
        return web.Response(text=lease.name)

    app = web.Application()
    app.router.add_get("/carts", cart)
    async with serve(app) as http:
        assert await (await http.get("/carts", params={"cart": "c9"})).text() == f"{name}:c9"
        missing = await http.get("/carts")
        assert missing.status == 400
        assert "cart" in await missing.text()


async def test_a_client_under_an_app_key_of_a_parent_app(
    client: redis.asyncio.Redis, name: str
) -> None:
    @locked_handler(name, client=REDIS)
    async def job(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    parent = web.Application()
    parent[REDIS] = client
    child = web.Application()
    child.router.add_post("/job", job)
    parent.add_subapp("/sub", child)
    async with serve(parent) as http:
        assert (await http.post("/sub/job")).status == 200

    bare = web.Application()
    bare.router.add_post("/job", job)
    async with serve(bare) as http:
        assert (await http.post("/job")).status == 500  # RuntimeError: no client under the key


def test_bad_declarations_fail_at_decoration(client: redis.asyncio.Redis) -> None:
    with pytest.raises(ConfigError) as info:
        locked_handler("x", client=client, busy_status=500)  # type: ignore[call-overload]
    assert info.value.argument == "busy_status"
    with pytest.raises(ConfigError) as info:
        locked_handler("x:{}", client=client)
    assert info.value.argument == "name"
    with pytest.raises(ConfigError) as info:
        locked_handler("x", client=client, replicas=101)
    assert info.value.argument == "replicas"

    def not_async(request: web.Request) -> web.Response:
        return web.Response()

    with pytest.raises(TypeError, match="async"):
        locked_handler("x", client=client)(not_async)  # type: ignore[arg-type]

    async def three(request: web.Request, lease: Lease, extra: int) -> web.Response:
        return web.Response()

    with pytest.raises(TypeError, match="request"):
        locked_handler("x", client=client)(three)  # type: ignore[arg-type]


async def test_another_locks_loss_raised_by_the_handler_is_not_this_requests_loss(
    client: redis.asyncio.Redis, name: str
) -> None:
    """The handler used a second lock, lost it, and lets that `LeaseLostError` go: it
    propagates as the handler's own error (500), not as the 503 of a request whose lock
    was lost. The request's own lock was held throughout and is released."""
    audit = f"{name}:audit"
    raised: list[BaseException] = []

    @locked_handler(name + ":{order_id}", client=client, ttl=5)
    async def place(request: web.Request) -> web.Response:
        other = await Lock(client, audit, ttl=5).acquire()
        await client.delete(f"aiolock:{{{audit}}}")  # taken from the handler
        await other.release()  # raises that lock's LeaseLostError
        return web.Response(text="placed")

    @web.middleware
    async def record(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except Exception as exc:
            raised.append(exc)
            raise

    app = web.Application(middlewares=[record])
    app.router.add_post("/orders/{order_id}", place)
    async with serve(app) as http:
        response = await http.post("/orders/7")
        assert response.status == 500, await response.text()
    assert [type(exc) for exc in raised] == [LeaseLostError], raised
    assert isinstance(raised[0], LeaseLostError) and raised[0].name == audit
    assert not await Lock(client, f"{name}:7").locked()


async def test_redis_unreachable_answers_503_with_retry_after(
    server: RedisServer, name: str
) -> None:
    """A `BackendError` of the request's lock (Redis down) is 503 Service Unavailable with
    `Retry-After`, not a 500; the handler does not run."""
    down = redis.asyncio.Redis.from_url(server.url)
    server.stop()  # nothing listens there now: the connection is refused
    ran: list[str] = []

    @locked_handler(down, name + ":{order_id}")
    async def place(request: web.Request) -> web.Response:
        ran.append("placed")
        return web.Response()

    app = web.Application()
    app.router.add_post("/orders/{order_id}", place)
    try:
        async with serve(app) as http:
            response = await http.post("/orders/1")
            assert response.status == 503, await response.text()
            assert response.headers["Retry-After"] == "1"
            assert "Redis" in await response.text()
    finally:
        await down.aclose()
    assert ran == []
