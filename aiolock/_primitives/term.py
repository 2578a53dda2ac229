"""An election's `Term`: one leadership won, a lease on the election's seat, which its
leader resigns, hands to a named successor (EL_SUCCESSOR, then the seat's release) or
proclaims a value under (EL_PROCLAIM). `Election` (`_primitives.election`) makes them."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import TracebackType
from typing import final

from .._engine.lease import Lease
from .._engine.runtime import runtime_for
from .._lua.election import EL_PROCLAIM, EL_SUCCESSOR, stored_value
from .._model import events
from .._model.config import check_identity, check_value
from .._transport.call_options import CallOptions
from .._transport.clients import AsyncClient
from ..errors import ConfigError, LeaseLostError, LossReason

__all__ = ("Office", "Term")


@dataclass(frozen=True, slots=True)
class Office:
    """What a `Term` needs of its `Election`: its client, name and identity, and the KEYS of
    EL_PROCLAIM (`record_keys`) and EL_SUCCESSOR (`successor_keys`)."""

    client: AsyncClient
    name: str
    identity: str
    record_keys: tuple[str, str]
    successor_keys: tuple[str, ...]


def _term_ended(name: str, lease: Lease) -> None:
    """A term's lease ended: TERM_LOST or TERM_RESIGNED."""
    if not events.enabled():
        return
    lost = lease.lost
    events.emit(
        events.LockEvent(
            kind=events.EventKind.TERM_LOST if lost else events.EventKind.TERM_RESIGNED,
            name=name,
            fencing_token=lease.fencing_token,
            hold=lease.held_for(),
            reason=lease.loss_reason if lost else None,
        )
    )


@final
class Term:
    """One leadership won by `Election.campaign()`: a lease on the election, its number a
    fencing token.

    ```python
    async for term in election.campaign():
        async with term:
            await run_scheduler(fence=term.fencing_token)
    ```

    Use it as an async context manager, as a lock's lease: the body runs as the leader; if
    the term is lost (its renewal refused, Redis unreachable until its deadline, this
    process paused past its ttl) the body is cancelled and `LeaseLostError` is raised, and
    when the block ends the leader resigns (the next candidate takes over at once). Pass
    `fencing_token` to storage that can refuse the writes of a leader whose term ended: it
    is larger than every earlier term's. `transfer(identity)` hands the term to a named
    candidate instead of the next in line; `Election.resume(term.lease.token)` takes it
    back in another process.

    Attributes:
        name: the election's name.
        fencing_token: the term's number (its lease's fencing token).
        identity: the leader's identity (its `Election`'s; for a resumed term, the one it
            was announced with).
        since: when the term was announced, Unix seconds on the server's clock.
        lease: the term's `Lease` (renewed by the watchdog like any lease).

    Added in 0.1.
    """

    __slots__ = ("_office", "_proclaims", "fencing_token", "identity", "lease", "name", "since")

    def __init__(
        self, office: Office, lease: Lease, *, since: float, identity: str | None = None
    ) -> None:
        self._office = office
        self.name = office.name
        self.lease = lease
        self.fencing_token = lease.fencing_token
        self.identity = office.identity if identity is None else identity
        self.since = since
        self._proclaims = 0
        lease._when_ended(functools.partial(_term_ended, office.name))

    @property
    def held(self) -> bool:
        """True while the term is neither resigned nor lost, and its deadline has not passed
        (see `Lease.held`)."""
        return self.lease.held

    @property
    def lost(self) -> bool:
        """True once the term was lost (see `Lease.lost`)."""
        return self.lease.lost

    @property
    def loss_reason(self) -> LossReason | None:
        return self.lease.loss_reason

    def remaining(self) -> float:
        """Seconds the term can still be counted on (see `Lease.remaining`)."""
        return self.lease.remaining()

    async def wait_lost(self) -> LeaseLostError | None:
        """Wait until the term ends: the loss as an error, or None if resigned.

        Cancellation:
            Safe to cancel; nothing is changed.
        """
        return await self.lease.wait_lost()

    def __repr__(self) -> str:
        state = "held" if self.lease.held else "lost" if self.lease.lost else "ended"
        return (
            f"<Term {self.name!r} fencing_token={self.fencing_token} "
            f"identity={self.identity!r} {state}>"
        )

    async def resign(self) -> None:
        """Give the term up: the next candidate in line takes over at once (one
        notification), and observers see the end of this term. Doing it again does
        nothing. Code after it in the `async with` block runs as a leader no longer.

        Raises:
            LeaseLostError: the term had been lost (its work since was not protected).
            BackendError: Redis could not be reached; the term ends by itself within the ttl.

        Cancellation:
            Finished under a shield (as `Lease.release()`), then the cancellation goes on.
        """
        await self.lease.release()

    async def transfer(self, identity: str) -> None:
        """Hand the term to a named successor: the first candidate in line (campaigning now,
        in any process) whose `Election` has `identity`, instead of the first in line. It
        leads on the release's notification, with no wait for an expiry, and nobody else
        can take the term in between: it goes straight from this leader to it, as a
        resignation goes to the next in line. E.g. before a planned restart of this
        leader's node. Two round trips: the successor is put at the head of the line (the
        others keep their order), then the term is resigned (`resign()`), which grants it
        to the head of the line; code after it runs as a leader no longer.

        Identities need not be unique (the default is "<host>:<pid>"): the first candidate
        in line with that identity is named. Within one process, candidates on one client
        share a place in line, which carries the identity of the one that last wrote it:
        name a candidate of another process, or give each its own client.

        Args:
            identity: the successor's identity (1 to 1000 characters).

        Raises:
            ConfigError: no candidate with that identity is in line (not campaigning, or
                only as a process of a release before 0.4): the term is kept, unchanged.
            TypeError: `identity` is not a `str` (nothing is sent).
            LeaseLostError: the term is over (lost, or Redis no longer holds it).
            RuntimeError: the term was resigned.
            BackendError: Redis could not be reached or refused a command; the term is kept
                if the first round trip failed, else it ends by itself within the ttl.

        Cancellation:
            Cancelled during the first round trip, the term is kept (the successor may
            head the line already); once it is being resigned, as `resign()`.

        Added in 0.1.
        """
        identity = check_identity(identity)
        lease = self.lease
        if lease.released:
            raise RuntimeError(f"cannot transfer: the term of election {self.name!r} was resigned")
        if lease.lost or not lease.held:  # (reading `lost` declares a passed deadline)
            raise lease.loss_error()
        office = self._office
        reply = await runtime_for(office.client).backend.run(
            EL_SUCCESSOR,
            office.successor_keys,
            [lease.token, identity],
            CallOptions(
                timeout=max(lease.remaining(), 0.001), operation="transfer", name=self.name
            ),
        )
        status = int(reply[0])
        if status == 0:
            lease._not_owner()
            raise lease.loss_error()
        if status != 1:
            raise ConfigError(
                f"identity must be that of a candidate in line in election {self.name!r}: "
                f"none with identity {identity!r} is campaigning; the term is kept",
                argument="identity",
                value=identity,
            )
        await lease.release()

    async def proclaim(self, value: str | None) -> None:
        """Publish `value` as the leader's (None: none), for `Election.leader()` and the
        observers; one round trip.

        Raises:
            ConfigError: `value` longer than 65,536 characters (nothing is sent).
            TypeError: `value` is not a `str` or None.
            LeaseLostError: the term is over (lost, or Redis no longer holds it).
            RuntimeError: the term was resigned.
            BackendError: Redis could not be reached or refused the command.

        Cancellation:
            Safe to cancel: the value is published or not; the term is unchanged.
        """
        stored = stored_value(check_value(value))
        lease = self.lease
        if lease.released:
            raise RuntimeError(f"cannot proclaim: the term of election {self.name!r} was resigned")
        if lease.lost or not lease.held:  # (reading `lost` declares a passed deadline)
            raise lease.loss_error()
        self._proclaims += 1
        office = self._office
        reply = await runtime_for(office.client).backend.run(
            EL_PROCLAIM,
            office.record_keys,
            [lease.token, stored, self._proclaims],
            CallOptions(
                timeout=max(lease.remaining(), 0.001), operation="proclaim", name=self.name
            ),
        )
        if int(reply[0]) != 1:
            lease._not_owner()
            raise lease.loss_error()

    # ----------------------------------------------------------------- async with
    def __enter__(self) -> None:
        raise TypeError("use 'async with' with a Term, not 'with'")

    def __exit__(self, *exc_info: object) -> None:  # pragma: no cover - __enter__ raises
        raise TypeError("use 'async with' with a Term, not 'with'")

    async def __aenter__(self) -> Term:
        """Guard the body: it is cancelled if the term is lost while it runs.

        Raises:
            LeaseLostError: the term was lost already.
        """
        await self.lease.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Resign, and say whether the body ran as the leader throughout: as
        `Lease.__aexit__` (`LeaseLostError` if the term was lost while it ran).

        Cancellation:
            Only the cancellation caused by the loss is turned into `LeaseLostError`; any
            other propagates, after the resignation.
        """
        await self.lease.__aexit__(exc_type, exc, tb)
