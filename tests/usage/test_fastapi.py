"""aiolock.fastapi: a lock per request, through httpx's ASGI transport, on a real server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import fastapi
import httpx
import pytest
import redis.asyncio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aiolock import AcquireTimeoutError, ConfigError, Lease, LeaseLostError, Lock
from aiolock._recipes.name_templates import retry_after_header
from aiolock.fastapi import locked_request

from ..support.servers import RedisServer
from ..support.waits import handler_entered, within

pytestmark = pytest.mark.real_only


@contextlib.asynccontextmanager
async def http(app: ASGIApp) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


class LockStateAtResponse:
    """ASGI middleware: whether the lock was still held when the response started."""

    def __init__(self, app: ASGIApp, lock: Lock) -> None:
        self.app = app
        self.lock = lock
        self.held: list[bool] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.held.append(await self.lock.locked())
            await send(message)

        await self.app(scope, receive, watch)


async def test_the_handler_runs_under_the_lock_and_it_is_released_before_the_response(
    client: redis.asyncio.Redis, name: str
) -> None:
    app = fastapi.FastAPI()
    seen: list[tuple[str, bool]] = []

    @app.post("/orders/{order_id}")
    async def place(
        order_id: int, lease: Lease = locked_request(name + ":{order_id}", client=client, ttl=5)
    ) -> dict[str, Any]:
        seen.append((lease.name, await Lock(client, lease.name).locked()))
        return {"order": order_id, "fence": lease.fencing_token}

    watcher = LockStateAtResponse(app, Lock(client, f"{name}:42"))
    async with http(watcher) as web:
        response = await web.post("/orders/42")
    assert response.status_code == 200, response.text
    assert response.json()["order"] == 42
    assert seen == [(f"{name}:42", True)]
    assert watcher.held == [False]  # released before the response started


async def test_a_busy_lock_fails_fast_with_the_chosen_status_and_retry_after(
    client: redis.asyncio.Redis, name: str
) -> None:
    app = fastapi.FastAPI()
    ran: list[str] = []

    @app.post("/a/{item}")
    async def conflict(_: Lease = locked_request(name + ":{item}", client=client)) -> None:
        ran.append("a")

    @app.post(
        "/b/{item}", dependencies=[locked_request(name + ":{item}", client=client, busy_status=429)]
    )
    async def too_many() -> None:
        ran.append("b")

    async with Lock(client, f"{name}:x", ttl=30), http(app) as web:
        first = await web.post("/a/x")
        second = await web.post("/b/x")
    assert (first.status_code, second.status_code) == (409, 429), first.text
    # No typical hold known yet: the holder's key expires in 30 s at the latest.
    assert first.headers["retry-after"] == second.headers["retry-after"] == "30"
    assert ran == []
    async with http(app) as web:
        assert (await web.post("/a/x")).status_code == 200


def test_retry_after_rounds_up_to_whole_seconds() -> None:
    def error(hint: float | None) -> AcquireTimeoutError:
        return AcquireTimeoutError("busy", name="n", timeout=0, attempts=1, retry_after=hint)

    assert [retry_after_header(error(h)) for h in (None, 0.0, 0.2, 1.0, 1.01, 29.5)] == [
        "1", "1", "1", "1", "2", "30",
    ]  # fmt: skip


async def test_a_loss_stops_the_handler_and_answers_503(
    client: redis.asyncio.Redis, name: str
) -> None:
    app = fastapi.FastAPI()
    in_handler = asyncio.Event()
    proceed = asyncio.Event()
    log = f"{name}:writes"

    @app.post("/pay/{order_id}")
    async def pay(
        order_id: str, lease: Lease = locked_request(name + ":{order_id}", client=client, ttl=1.5)
    ) -> dict[str, str]:
        await client.rpush(log, "before")
        in_handler.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proceed.wait(), 5)  # without the loss: gives up after 5 s
        await client.rpush(log, "after the loss")
        return {"paid": order_id}

    async with http(app) as web, asyncio.timeout(20):
        request = asyncio.create_task(web.post("/pay/7"))
        await handler_entered(in_handler, request)
        await client.delete(f"aiolock:{{{name}:7}}")  # the lock is taken from the handler
        response = await request
    assert response.status_code == 503, response.text
    assert await client.lrange(log, 0, -1) == [b"before"]


async def test_the_name_may_come_from_query_parameters(
    client: redis.asyncio.Redis, name: str
) -> None:
    app = fastapi.FastAPI()

    @app.get("/carts")
    async def cart(lease: Lease = locked_request(name + ":{cart}", client=client)) -> str:
        return lease.name

    async with http(app) as web:
        assert (await web.get("/carts", params={"cart": "c9"})).json() == f"{name}:c9"
        missing = await web.get("/carts")
    assert missing.status_code == 422  # FastAPI's own validation: the parameter is required
    assert "cart" in missing.text


async def test_a_function_gives_canonical_names(client: redis.asyncio.Redis, name: str) -> None:
    app = fastapi.FastAPI()

    def order_lock(order_id: int) -> str:  # "042" and "42" are the same order
        return f"{name}:{order_id}"

    @app.post("/orders/{order_id}")
    async def place(order_id: int, lease: Lease = locked_request(order_lock, client=client)) -> str:
        return lease.name

    async with http(app) as web:
        assert (await web.post("/orders/042")).json() == f"{name}:42"
        async with Lock(client, f"{name}:42", ttl=30):
            assert (await web.post("/orders/042")).status_code == 409


async def test_a_client_made_at_startup(server_url: str, name: str) -> None:
    clients: dict[str, redis.asyncio.Redis] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: fastapi.FastAPI) -> AsyncIterator[None]:
        clients["redis"] = redis.asyncio.Redis.from_url(server_url)
        yield
        await clients["redis"].aclose()

    app = fastapi.FastAPI(lifespan=lifespan)

    @app.post("/jobs/{job}")
    async def run(
        lease: Lease = locked_request(name + ":{job}", client=lambda: clients["redis"]),
    ) -> int:
        return lease.fencing_token

    async with lifespan(app), http(app) as web:
        assert (await web.post("/jobs/j")).status_code == 200


async def test_two_clicks_on_place_order_make_one_order(
    client: redis.asyncio.Redis, name: str
) -> None:
    app = fastapi.FastAPI()
    entered = asyncio.Event()
    finish = asyncio.Event()
    orders: list[str] = []

    @app.post("/carts/{cart}/place")
    async def place(cart: str, _: Lease = locked_request(name + ":{cart}", client=client)) -> str:
        entered.set()
        await finish.wait()
        orders.append(cart)
        return "placed"

    async with http(app) as web, asyncio.timeout(20):
        first = asyncio.create_task(web.post("/carts/c1/place"))
        await entered.wait()
        second = await web.post("/carts/c1/place")  # the double click, while the first runs
        finish.set()
        assert (await first).status_code == 200
    assert second.status_code == 409
    assert orders == ["c1"]


async def test_errors_of_the_handler_pass_through_and_release(
    client: redis.asyncio.Redis, name: str
) -> None:
    app = fastapi.FastAPI()

    @app.get("/items/{item}")
    async def item(item: str, _: Lease = locked_request(name + ":{item}", client=client)) -> None:
        raise fastapi.HTTPException(status_code=404, detail="no such item")

    async with http(app) as web:
        assert (await web.get("/items/i")).status_code == 404
    assert not await Lock(client, f"{name}:i").locked()


def test_bad_declarations_fail_when_the_route_is_declared(client: redis.asyncio.Redis) -> None:
    with pytest.raises(ConfigError) as info:
        locked_request("orders:{id}", client=client, busy_status=500)  # type: ignore[call-overload]
    assert info.value.argument == "busy_status"
    with pytest.raises(ConfigError) as info:
        locked_request("orders:{order-id}", client=client)
    assert info.value.argument == "name"
    with pytest.raises(ConfigError) as info:
        locked_request("orders:{id}", client=client, ttl=0)
    assert info.value.argument == "ttl"
    with pytest.raises(ConfigError) as info:
        locked_request("orders:{id}", client=client, replica_timeout=1)
    assert info.value.argument == "replica_timeout"
    with pytest.raises(TypeError):
        locked_request(42, client=client)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        locked_request("orders:{id}", client="redis://x")  # type: ignore[arg-type]


async def test_another_locks_loss_raised_by_the_handler_is_not_this_requests_loss(
    client: redis.asyncio.Redis, name: str
) -> None:
    """The handler used a second lock, lost it, and lets that `LeaseLostError` go: it is
    the handler's own error (500), not the 503 of a request whose lock was lost. The
    request's own lock was held throughout and is released."""
    app = fastapi.FastAPI()
    audit = f"{name}:audit"

    @app.post("/orders/{order_id}")
    async def place(
        order_id: str, lease: Lease = locked_request(name + ":{order_id}", client=client, ttl=5)
    ) -> None:
        other = await Lock(client, audit, ttl=5).acquire()
        await client.delete(f"aiolock:{{{audit}}}")  # taken from the handler
        await other.release()  # raises that lock's LeaseLostError

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as web:
        response = await web.post("/orders/7")
    assert response.status_code == 500, response.text
    async with http(app) as web:
        with pytest.raises(LeaseLostError) as info:
            await web.post("/orders/7")
    assert info.value.name == audit, info.value
    assert not await Lock(client, f"{name}:7").locked()


async def test_retry_after_of_a_fail_fast_endpoint_follows_its_holds(
    client: redis.asyncio.Redis, name: str
) -> None:
    """An endpoint that tries once (`timeout=0`) and holds the lock for a few ms: once a
    request was turned away during a hold, that hold is measured, and the next busy
    answers say `Retry-After: 1` rather than the ttl (30)."""
    app = fastapi.FastAPI()
    entered = asyncio.Event()
    leave = asyncio.Event()

    @app.post("/orders/{item}")
    async def place(_: Lease = locked_request(name + ":{item}", client=client, ttl=30)) -> None:
        entered.set()
        await leave.wait()

    async def busy_while_held() -> httpx.Response:
        entered.clear()
        leave.clear()
        holding = asyncio.create_task(web.post("/orders/x"))
        await within(entered.wait(), what="the first request holds the lock")
        turned_away = await web.post("/orders/x")
        leave.set()
        assert (await within(holding, what="the holder's response")).status_code == 200
        assert turned_away.status_code == 409, turned_away.text
        return turned_away

    async with http(app) as web:
        first = await busy_while_held()
        assert first.headers["retry-after"] == "30"  # nothing known yet: the key's ttl
        for _ in range(3):
            assert (await busy_while_held()).headers["retry-after"] == "1"


async def test_redis_unreachable_answers_503_with_retry_after(
    server: RedisServer, name: str
) -> None:
    """A `BackendError` of the request's lock (Redis down) is 503 Service Unavailable with
    `Retry-After`, not a 500; the handler does not run."""
    down = redis.asyncio.Redis.from_url(server.url)
    server.stop()  # nothing listens there now: the connection is refused
    app = fastapi.FastAPI()
    ran: list[str] = []

    @app.post("/orders/{order_id}")
    async def place(order_id: int, _: Lease = locked_request(down, name + ":{order_id}")) -> None:
        ran.append("placed")

    try:
        async with http(app) as web:
            response = await web.post("/orders/1")
    finally:
        await down.aclose()
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == "1"
    assert "Redis" in response.json()["detail"]
    assert ran == []
