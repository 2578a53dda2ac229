"""What `@locked` and the web integrations share.

- `NameTemplate`: a lock name like `"orders:{order_id}"`, parsed and checked when it is
  declared, formatted from a call's arguments or a request's parameters when used.
- `client_source`: a client given as a client (redis-py's or valkey-py's) or as a zero-argument factory
  (so an application can create its client at startup, after the decorators ran), or the
  clients of a Redlock's independent servers, as a list or tuple;
- `lock_for`: a `Lock` on one client, or a `Redlock` over several.
- `retry_after_header`: the `Retry-After` value for a busy lock; `UNAVAILABLE` and
  `UNAVAILABLE_RETRY_AFTER`: what a web helper answers when Redis could not be reached.

Nothing here sends anything to Redis.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Final, Unpack, final

from .._model.config import check_name
from .._model.options import LockOptions
from .._primitives.lock import Lock
from .._primitives.redlock import Redlock, check_clients
from .._transport.clients import AsyncClient, Client, check_client, library_of
from ..errors import AcquireTimeoutError, ConfigError

__all__ = (
    "NOTHING",
    "UNAVAILABLE",
    "UNAVAILABLE_RETRY_AFTER",
    "ClientSource",
    "NameTemplate",
    "check_for",
    "client_source",
    "client_then_name",
    "lock_for",
    "retry_after_header",
)

ClientSource = AsyncClient | Sequence[AsyncClient] | Callable[[], AsyncClient]
"""A client, or a function of no arguments returning one (called at each use), or the
clients of a Redlock's independent servers (a list or tuple)."""
Clients = Client | tuple[AsyncClient, ...]
"""One client (a `Lock`'s), or a Redlock's clients."""

_BASE_NAME: Final = re.compile(r"[^.\[]+")

UNAVAILABLE: Final = 503
"""The status of a request whose lock Redis could not take (`BackendError`): Service
Unavailable, as for a lost lease."""
UNAVAILABLE_RETRY_AFTER: Final = "1"
"""Its `Retry-After`: one second, the least whole number (Redis gave no hint)."""


@final
class NameTemplate:
    """A lock name with `{field}` placeholders, `str.format` syntax.

    Fields are names (`{order_id}`), optionally followed by attribute or index access
    (`{order.id}`, `{items[0]}`), a conversion and a format spec (`{day:%Y-%m-%d}`).
    Positional fields (`{}`, `{0}`) are refused: a name must say where its parts come from.
    """

    __slots__ = ("fields", "template")

    def __init__(self, template: object, *, argument: str = "name") -> None:
        if not isinstance(template, str):
            raise TypeError(f"{argument} must be a str, got {type(template).__name__}")
        if not template:
            raise ConfigError(f"{argument} must not be empty", argument=argument, value=template)
        fields: list[str] = []
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise ConfigError(
                f"{argument} {template!r} is not a valid template: {exc}",
                argument=argument,
                value=template,
            ) from None
        for _, field, spec, _ in parsed:
            if field is None:
                continue
            match = _BASE_NAME.match(field)
            if not field or field.isdigit() or match is None or match.group().isdigit():
                raise ConfigError(
                    f"{argument} {template!r}: positional fields like '{{{field}}}' are not "
                    "accepted; name the parameter, as in 'orders:{order_id}'",
                    argument=argument,
                    value=template,
                )
            if spec and "{" in spec:
                raise ConfigError(
                    f"{argument} {template!r}: nested fields in a format spec are not accepted",
                    argument=argument,
                    value=template,
                )
            if match.group() not in fields:
                fields.append(match.group())
        self.template = template
        self.fields: tuple[str, ...] = tuple(fields)
        """The parameter names the template uses, in order of first use."""

    def __repr__(self) -> str:
        return f"NameTemplate({self.template!r})"

    def check_fields(self, available: Collection[str], *, argument: str, where: str) -> None:
        """Raise `ConfigError` if a field is not in `available`, naming it and `where`."""
        for field in self.fields:
            if field not in available:
                known = ", ".join(sorted(available)) or "none"
                raise ConfigError(
                    f"{argument} {self.template!r} names {field!r}, which is not a "
                    f"parameter of {where} (parameters: {known})",
                    argument=argument,
                    value=self.template,
                )

    def format(self, values: Mapping[str, object], *, argument: str = "name") -> str:
        """The lock name for `values`; `ConfigError` if it cannot be built or is invalid."""
        try:
            name = self.template.format_map(values)
        except (KeyError, AttributeError, IndexError, ValueError, TypeError) as exc:
            raise ConfigError(
                f"{argument} {self.template!r} could not be formatted: {type(exc).__name__}: {exc}",
                argument=argument,
                value=self.template,
            ) from None
        try:
            return check_name(name)
        except ConfigError as exc:
            raise ConfigError(
                f"{argument} {self.template!r} gave an invalid lock name {name!r}: {exc}",
                argument=argument,
                value=name,
            ) from None


def client_source(client: object, *, argument: str = "client") -> Callable[[], Clients]:
    """A function returning the client (a `redis.asyncio.Redis` or `RedisCluster`, or
    valkey-py's `valkey.asyncio.Valkey` or `ValkeyCluster`), checked: `TypeError` for
    anything else; or, given a list or tuple of clients, those clients (a Redlock's).

    A client is checked now; a factory's result is checked each time it is called.
    """
    if isinstance(client, (list, tuple)):
        clients = check_clients(client)
        return lambda: clients
    if library_of(client) is not None:
        checked = check_client(client)
        return lambda: checked
    if not callable(client):
        check_client(client)  # raises TypeError with the specific advice
    factory: Callable[[], object] = client  # type: ignore[assignment]

    def resolve() -> Client:
        made = factory()
        if library_of(made) is None:
            raise TypeError(
                f"{argument}() must return a redis.asyncio.Redis or RedisCluster (or a "
                f"valkey.asyncio.Valkey or ValkeyCluster), got {type(made).__name__}"
            )
        return check_client(made)

    return resolve


def lock_for(clients: Clients, name: str, **options: Unpack[LockOptions]) -> Lock | Redlock:
    """A `Lock` on one client, or a `Redlock` over a Redlock's clients."""
    if isinstance(clients, tuple):
        return Redlock(clients, name, **options)
    return Lock(clients, name, **options)


def check_for(client: object, options: LockOptions) -> None:
    """Refuse now the settings a Redlock does not take, when `client` is a Redlock's
    clients (nothing is sent)."""
    if isinstance(client, (list, tuple)):
        lock_for(check_clients(client), "-", **options)


def retry_after_header(error: AcquireTimeoutError) -> str:
    """Seconds for a `Retry-After` header: the error's `retry_after` rounded up to whole
    seconds (at least 1), or 1 when Redis gave no hint.

    `retry_after` is what is left of the lock's typical hold once Redis knows it (holds
    that refused a request are measured when released, so an endpoint that tries once
    learns it from its first busy answer on), else the holder key's ttl left: a lock held
    about 20 ms at a time answers 1; one held about 3 s answers what is left of those 3 s.
    """
    hint = error.retry_after
    if hint is None or not math.isfinite(hint):
        return "1"
    return str(max(1, math.ceil(hint)))


@final
class _Nothing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<not given>"


NOTHING: Final = _Nothing()
"""No argument given (None may be a value); shown as `<not given>` in a signature."""


def client_then_name(
    where: str, first: Any, second: Any, name: Any, client: Any
) -> tuple[Any, Any]:
    """The (client, name) of a decorator called as a `Lock` is, `where(client, name, ...)`,
    or by keyword, `where(name, client=...)` (each `NOTHING` when not given); `TypeError`
    as Python raises it for an argument given twice or missing."""
    if second is not NOTHING:  # where(client, name, ...)
        for keyword, value in (("client", client), ("name", name)):
            if value is not NOTHING:
                raise TypeError(f"{where} got multiple values for argument {keyword!r}")
        return first, second
    if first is not NOTHING:  # where(name, client=...)
        if name is not NOTHING:
            raise TypeError(f"{where} got multiple values for argument 'name'")
        name = first
    if name is NOTHING:
        raise TypeError(f"{where} missing required argument: 'name'")
    if client is NOTHING:
        raise TypeError(f"{where} missing required argument: 'client'")
    return client, name
