"""`@locked`: names from arguments, checked at decoration; the lease; busy; loss; typing."""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import assert_type

import pytest
import redis.asyncio

from aiolock import AcquireTimeoutError, ConfigError, Lease, LeaseLostError, Lock, locked

from ..conftest import CommandLog
from ..support.load import scaled


async def test_the_name_comes_from_the_arguments_with_defaults(
    client: redis.asyncio.Redis, name: str
) -> None:
    seen: list[tuple[str, bool]] = []

    @locked(name + ":{order_id}:{region}", client=client, ttl=5)
    async def ship(order_id: int, region: str = "eu", *, lease: Lease | None = None) -> int:
        assert lease is not None
        seen.append((lease.name, await Lock(client, lease.name).locked()))
        return order_id * 2

    assert await ship(21) == 42
    assert await ship(order_id=7, region="us") == 14
    assert seen == [(f"{name}:21:eu", True), (f"{name}:7:us", True)]
    assert not await Lock(client, f"{name}:21:eu").locked()  # released after the call


async def test_fields_reach_into_arguments(client: redis.asyncio.Redis, name: str) -> None:
    @dataclass
    class Order:
        id: int

    names: list[str] = []

    @locked(name + ":{order.id}:{items[0]}", client=client, ttl=5)
    async def handle(order: Order, items: list[str], *, lease: Lease | None = None) -> None:
        assert lease is not None
        names.append(lease.name)

    await handle(Order(5), ["book"])
    assert names == [f"{name}:5:book"]


def test_a_field_naming_no_parameter_fails_at_decoration(client: redis.asyncio.Redis) -> None:
    decorator = locked("orders:{order_id}", client=client)

    async def ship(order: int) -> None: ...

    with pytest.raises(ConfigError, match=r"'order_id'.*ship\(\).*parameters: order") as info:
        decorator(ship)
    assert info.value.argument == "name"


@pytest.mark.parametrize("template", ["orders:{}", "orders:{0}", "orders:{x:{y}}", "orders:{"])
def test_templates_that_cannot_name_a_lock(client: redis.asyncio.Redis, template: str) -> None:
    with pytest.raises(ConfigError) as info:
        locked(template, client=client)
    assert info.value.argument == "name"


def test_the_lease_field_is_not_a_name_field(client: redis.asyncio.Redis) -> None:
    async def job(*, lease: Lease | None = None) -> None: ...

    with pytest.raises(ConfigError, match="'lease'"):
        locked("jobs:{lease}", client=client)(job)


def test_bad_decorations_fail_before_any_call(client: redis.asyncio.Redis) -> None:
    def not_async(order_id: int) -> None: ...

    with pytest.raises(TypeError, match="async def"):
        locked("orders:{order_id}", client=client)(not_async)  # type: ignore[arg-type]

    async def positional_lease(lease: Lease, /) -> None: ...

    with pytest.raises(TypeError, match="keyword"):
        locked("jobs", client=client)(positional_lease)
    with pytest.raises(TypeError, match="name must be a str"):
        locked(b"jobs", client=client)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"redis\.asyncio\.Redis"):
        locked("jobs", client="redis://localhost")  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as info:
        locked("jobs", client=client, ttl=0)
    assert info.value.argument == "ttl"
    with pytest.raises(ConfigError) as info:
        locked("jobs", client=client, replicas=-1)
    assert info.value.argument == "replicas"


def test_on_busy_must_be_chosen_when_a_call_can_be_busy(client: redis.asyncio.Redis) -> None:
    with pytest.raises(ConfigError, match="on_busy is required") as info:
        locked("jobs", client=client, timeout=0)
    assert info.value.argument == "on_busy"
    with pytest.raises(ConfigError, match="'raise' or 'skip'"):
        locked("jobs", client=client, timeout=0, on_busy="ignore")  # type: ignore[call-overload]
    locked("jobs", client=client)  # timeout=None: never busy, nothing to choose


async def test_busy_raises_or_skips_as_chosen(client: redis.asyncio.Redis, name: str) -> None:
    calls: list[str] = []

    @locked(name, client=client, ttl=5, timeout=0, on_busy="raise")
    async def strict() -> str:
        calls.append("strict")
        return "ran"

    @locked(name, client=client, ttl=5, timeout=0, on_busy="skip")
    async def lenient() -> str:
        calls.append("lenient")
        return "ran"

    async with Lock(client, name, ttl=5):
        with pytest.raises(AcquireTimeoutError) as info:
            await strict()
        assert info.value.name == name
        assert await lenient() is None
    assert calls == []
    assert await strict() == "ran"
    assert await lenient() == "ran"
    assert calls == ["strict", "lenient"]


async def test_a_caller_cannot_pass_the_lease(client: redis.asyncio.Redis, name: str) -> None:
    @locked(name, client=client, ttl=5)
    async def job(*, lease: Lease | None = None) -> None: ...

    async with Lock(client, name + ":other", ttl=5) as other:
        with pytest.raises(TypeError, match="passes the lease itself"):
            await job(lease=other)


async def test_a_loss_cancels_the_call(client: redis.asyncio.Redis, name: str) -> None:
    after_loss: list[str] = []

    @locked(name, client=client, ttl=scaled(0.3))
    async def job(*, lease: Lease | None = None) -> None:
        assert lease is not None
        await client.delete(f"aiolock:{{{name}}}")  # someone evicts the holder
        await asyncio.sleep(10)  # cancelled at the next renewal, within ttl/3
        after_loss.append("write")

    with pytest.raises(LeaseLostError) as info:
        await asyncio.wait_for(job(), timeout=5)
    assert info.value.name == name
    assert after_loss == []


async def test_the_client_may_come_from_a_factory_called_at_each_call(
    client: redis.asyncio.Redis, name: str
) -> None:
    clients: list[redis.asyncio.Redis] = []

    @locked(name, client=lambda: clients[-1], ttl=5)
    async def job() -> str:
        return "ok"

    clients.append(client)  # created after the decoration, as at application startup
    assert await job() == "ok"

    @locked(name, client=lambda: "not a client", ttl=5)  # type: ignore[arg-type, return-value]
    async def broken() -> None: ...

    with pytest.raises(TypeError, match=r"client\(\) must return"):
        await broken()


@pytest.mark.real_only
async def test_a_name_that_cannot_be_built_fails_before_anything_is_sent(
    client: redis.asyncio.Redis, commands: CommandLog
) -> None:
    @locked("{prefix}", client=client, ttl=5)
    async def job(prefix: str) -> None: ...

    mark = commands.mark()
    with pytest.raises(ConfigError, match="invalid lock name") as info:
        await job("")
    assert info.value.argument == "name"
    with pytest.raises(TypeError):
        await job()  # type: ignore[call-arg]  # a missing argument, as in a plain call
    assert commands.since(mark).total() == 0


async def test_methods_can_be_decorated(client: redis.asyncio.Redis, name: str) -> None:
    class Shop:
        @locked(name + ":{sku}", client=lambda: client, ttl=5)
        async def sell(self, sku: str, *, lease: Lease | None = None) -> str:
            assert lease is not None
            return lease.name

    assert await Shop().sell("x1") == f"{name}:x1"


async def test_the_wrapped_signature_is_kept_for_type_checkers(
    client: redis.asyncio.Redis, name: str
) -> None:
    @locked(name + ":{n}", client=client, ttl=5)
    async def double(n: int, *, lease: Lease | None = None) -> int:
        return 2 * n

    @locked(name + ":{n}", client=client, ttl=5, timeout=0, on_busy="skip")
    async def maybe(n: int) -> int:
        return n

    assert_type(await double(2), int)
    assert_type(await maybe(3), int | None)
    assert double.__name__ == "double"
    assert await double(2) == 4
    assert await maybe(3) == 3


async def test_a_lease_parameter_needs_no_default(client: redis.asyncio.Redis, name: str) -> None:
    """`lease: Lease` without a default, anywhere among the parameters: @locked supplies it,
    and the wrapper's signature leaves it out."""
    seen: list[tuple[str, int]] = []

    @locked(name + ":{order_id}", client=client, ttl=5)
    async def ship(order_id: int, lease: Lease, region: str = "eu") -> str:
        seen.append((lease.name, order_id))
        return region

    @locked(name + ":kw:{order_id}", client=client, ttl=5)
    async def pack(order_id: int, *, lease: Lease) -> int:
        return lease.fencing_token

    @locked(name + ":first:{order_id}", client=client, ttl=5)
    async def bill(lease: Lease, order_id: int) -> str:
        return lease.name

    # ParamSpec cannot drop a parameter after the first: type checkers still ask for it.
    assert await ship(7, region="us") == "us"  # type: ignore[call-arg]
    assert await ship(8) == "eu"  # type: ignore[call-arg]
    assert await pack(order_id=9) > 0  # type: ignore[call-arg]
    assert await bill(10) == f"{name}:first:10"  # typed without the lease, as a first parameter
    assert await bill(order_id=11) == f"{name}:first:11"
    assert seen == [(f"{name}:7", 7), (f"{name}:8", 8)]
    assert str(inspect.signature(ship)) == "(order_id: 'int', region: 'str' = 'eu') -> 'str'"
    assert str(inspect.signature(pack)) == "(order_id: 'int') -> 'int'"
    assert str(inspect.signature(bill)) == "(order_id: 'int') -> 'str'"
    assert "lease" not in inspect.signature(ship).parameters
    assert ship.__wrapped__.__name__ == "ship"  # type: ignore[attr-defined]


async def test_a_caller_passing_a_lease_without_a_default_is_told_why(
    client: redis.asyncio.Redis, name: str
) -> None:
    @locked(name + ":{order_id}", client=client, ttl=5)
    async def ship(order_id: int, lease: Lease) -> None: ...

    @locked(name + ":first:{order_id}", client=client, ttl=5)
    async def bill(lease: Lease, order_id: int) -> None: ...

    async with Lock(client, name + ":other", ttl=5) as other:
        with pytest.raises(TypeError, match=r"ship\(\) got a lease argument: @locked passes"):
            await ship(1, lease=other)
        with pytest.raises(TypeError, match=r"ship\(\): too many positional arguments.*@locked"):
            await ship(1, other)
        with pytest.raises(TypeError, match=r"bill\(\): too many positional arguments.*@locked"):
            await bill(other, 1)  # type: ignore[arg-type, call-arg]
        with pytest.raises(TypeError, match=r"bill\(\) got a lease argument"):
            await bill(lease=other, order_id=1)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match=r"ship\(\): missing a required argument: 'order_id'"):
            await ship()  # type: ignore[call-arg]
    assert not await Lock(client, name + ":1").locked()


def test_a_lease_parameter_that_cannot_take_one_lease_is_refused(
    client: redis.asyncio.Redis,
) -> None:
    async def star(*lease: Lease) -> None: ...

    async def stars(**lease: Lease) -> None: ...

    for fn in (star, stars):
        with pytest.raises(TypeError, match="'lease' parameter must"):
            locked("jobs", client=client)(fn)
