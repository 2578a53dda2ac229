"""Fenced writes over HTTP: a service that refuses a write older than the newest it took.

    pip install "aiolock-redis[aiohttp]"
    python examples/fenced_http.py

The lock holders write documents through an HTTP API. Each `PUT /documents/{id}` carries
the holder's fencing token in a `Fencing-Token` header, as an `If-Match` carries an ETag;
the service answers 409 Conflict to a token below the highest it accepted for that
document, 428 Precondition Required to a write without one (400 to one that is not an
integer). It keeps the documents in
Redis with `fenced_set`, so any number of its instances refuse alike; `GET` returns the
document with the token it was written with.

Holder A takes the lock and stalls past its ttl; B takes the lock and writes; then A
wakes up and writes as if it still held the lock: 409.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import aiohttp
import redis.asyncio
from _server import check, redis_url
from aiohttp import web

from aiolock import Lock, fenced_get, fenced_set

FENCING_TOKEN = "Fencing-Token"
STORE = web.AppKey("store", redis.asyncio.Redis)


# The service.
async def put_document(request: web.Request) -> web.Response:
    header = request.headers.get(FENCING_TOKEN)
    if header is None:
        return web.Response(status=428, text=f"a {FENCING_TOKEN} header is required")
    if not (header.isascii() and header.isdigit() and int(header) < 2**63):
        return web.Response(status=400, text=f"{FENCING_TOKEN}: an integer, 0 to 2**63 - 1")
    key = f"documents:{request.match_info['id']}"
    if not await fenced_set(request.app[STORE], key, await request.read(), int(header)):
        return web.Response(status=409, text="a write with a newer fencing token came first")
    return web.Response(status=204)


async def get_document(request: web.Request) -> web.Response:
    stored = await fenced_get(request.app[STORE], f"documents:{request.match_info['id']}")
    if stored.value is None:
        return web.Response(status=404)
    return web.Response(body=stored.value, headers={FENCING_TOKEN: str(stored.fencing_token)})


def create_app(url: str) -> web.Application:
    app = web.Application()
    app.router.add_put("/documents/{id}", put_document)
    app.router.add_get("/documents/{id}", get_document)

    async def store(app: web.Application) -> AsyncIterator[None]:
        app[STORE] = redis.asyncio.Redis.from_url(url)
        yield
        await app[STORE].aclose()

    app.cleanup_ctx.append(store)
    return app


# A lock holder's side.
async def put_fenced(session: aiohttp.ClientSession, url: str, body: bytes, token: int) -> bool:
    """PUT `body` with the holder's fencing token; False if a newer holder wrote first."""
    async with session.put(url, data=body, headers={FENCING_TOKEN: str(token)}) as response:
        if response.status == 409:
            return False
        response.raise_for_status()
        return True


async def main() -> None:
    async with redis_url() as url:
        runner = web.AppRunner(create_app(url))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        name = f"documents:{secrets.token_hex(4)}"
        document = f"http://127.0.0.1:{runner.addresses[0][1]}/{name.replace(':', '/')}"
        client = redis.asyncio.Redis.from_url(url)
        try:
            async with aiohttp.ClientSession() as session:
                # A holds the lock without renewal here, to stand for a holder whose
                # process stops running: its lease runs out while it is not looking.
                a = await Lock(client, name, ttl=0.3, renew=False).acquire()
                await a.wait_lost()  # A is "paused"; it will not notice this
                async with Lock(client, name, ttl=10) as b:
                    print(f"A holds fencing token {a.fencing_token}, B holds {b.fencing_token}")
                    b_wrote = await put_fenced(session, document, b"B's draft", b.fencing_token)
                # A wakes up, believes it still holds the lock, and writes.
                a_wrote = await put_fenced(session, document, b"A's draft", a.fencing_token)
                async with session.get(document) as response:
                    body, token = await response.read(), response.headers[FENCING_TOKEN]
                async with session.put(document, data=b"no token") as response:
                    unfenced = response.status
        finally:
            await client.aclose()
            await runner.cleanup()
    print(f"B's PUT accepted: {b_wrote}; A's: {a_wrote}; a PUT without a token: {unfenced}")
    print(f"GET: {body!r}, {FENCING_TOKEN}: {token}")
    check(b_wrote, "the current holder's write was accepted")
    check(not a_wrote, "the superseded holder's write was refused with 409")
    check(body == b"B's draft" and int(token) == b.fencing_token, "the document is B's")
    check(unfenced == 428, "a write without a fencing token was refused with 428")


if __name__ == "__main__":
    asyncio.run(main())
