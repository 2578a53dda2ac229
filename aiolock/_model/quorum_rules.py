"""The rules of a quorum's votes: what a quorum of a `Redlock`'s nodes' replies means.

A quorum's backend (`_transport.quorum`) sends a call to every node and applies the rule
its `CallOptions.votes` names; it knows no script. A rule is pure: from the replies so far
(by node index) and the quorum's size it says whether the call is decided, and then what
it gives back (`Verdict`): the answer in the script's reply format on one node, a failure,
a fencing token to write back first (a second phase), or a refused acquire to give back.
The scripts it names for those phases are the Redlock's (`_lua.redlock`). A primitive of a
quorum brings its `VoteRules` (one rule per call: acquire, resume, renew, release), which
the engine puts in each call's options; a new quorum primitive adds its rules here.

- an acquire (`ACQUIRE`) is granted when a quorum granted it; the fencing token is the
  highest a granting node issued, agreed at once when a quorum issued that one, else
  written back to every node (`RL_FENCE`) and agreed once a quorum acknowledged it. A
  refused acquire (no quorum granted, or the fencing token not acknowledged) is given back
  on every node: an abort (`RL_RELEASE`), which also refuses a late copy of the acquire;
  refused by a quorum, the answer is "token already used" when a quorum said so, else the
  refusal naming the holder most nodes named (its shortest expiry);
- a resume (`RESUME_VOTES`) likewise, without giving anything back, a refusal being `[0]`;
- a renewal batch (`RENEW_VOTES`) renews each lease a quorum renewed, and loses each lease
  a quorum answered "not the owner" of;
- a release (`RELEASE_VOTES`) counts when a quorum released it (or found it released).

When neither side can reach a quorum any more, the verdict is a failure (`Verdict.failure`),
which the backend raises as a `QuorumError` naming each node's reply (`Rule.said`).
"""

from __future__ import annotations

import abc
import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar, Final

from .._lua.lock import Script
from .._lua.redlock import RL_FENCE, RL_RELEASE

__all__ = (
    "ACQUIRE_VOTES",
    "REDLOCK_VOTES",
    "RELEASE_VOTES",
    "RENEW_VOTES",
    "RESUME_VOTES",
    "GiveBack",
    "Phase",
    "Rule",
    "Verdict",
    "VoteRules",
    "Votes",
)

Votes = dict[int, Any]
"""The replies so far, by node index."""

NO_QUORUM: Final = "no quorum answered"
FENCE_NOT_ACKNOWLEDGED: Final = "the fencing token was not acknowledged by a quorum"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What a decided call gives back.

    - `reply`: the answer, in the script's reply format on one node;
    - `failure`: no quorum decided it: what to say in the `QuorumError` (then no `reply`);
    - `fence`: the fencing token to write back to every node first (`Rule.fence_call`);
      `reply` holds once a quorum acknowledged it, else the call fails with
      FENCE_NOT_ACKNOWLEDGED (its acquire given back, if the rule gives back);
    - `granted`: the nodes that granted the call (a give-back waits for them);
    - `give_back`: a refused acquire, to give back on every node before answering.
    """

    reply: Any = None
    failure: str | None = None
    fence: int | None = None
    granted: frozenset[int] = frozenset()
    give_back: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class GiveBack:
    """How a refused acquire is undone on a node: `script` with `args`, and how long a node
    that the acquire reached unanswered is given (`bound`, the lease's ttl: it may apply
    the acquire when it answers again)."""

    script: Script
    args: list[str | int]
    bound: float


@dataclasses.dataclass(frozen=True, slots=True)
class Phase:
    """A second call on the same keys (`script` with `args`), decided by `votes`."""

    script: Script
    args: list[str | int]
    votes: Rule


class Rule(abc.ABC):
    """The votes of one kind of call. The base decides nothing by itself: each rule says
    when it is decided and what the replies mean; fencing and giving back are an
    acquire's."""

    __slots__ = ()

    fences: ClassVar[bool] = False
    """Whether a granting reply carries a fencing token to agree on (`granted_token`)."""

    @abc.abstractmethod
    def decided(self, replies: Votes, pending: int, quorum: int, keys: int) -> bool:
        """Whether the replies decide the call (`pending`: the calls in flight that may
        still be answered in time; `keys`: how many keys the call names)."""

    @abc.abstractmethod
    def verdict(self, replies: Votes, quorum: int, keys: int) -> Verdict:
        """What the replies of a decided call (or of every node that answered) give back."""

    def said(self, reply: Any) -> str:
        """What a node's reply says, in a word (for `QuorumError.nodes`)."""
        first = reply[0] if isinstance(reply, list) and reply else reply
        return {1: "ok", 0: "refused", 2: "ok", -1: "token already used"}.get(int(first), "?")

    def granted_token(self, reply: Any) -> int | None:
        """The fencing token a node's reply grants (None: not a grant). A node whose grant
        is read after the decision, with a token other than the agreed one, is written the
        agreed one (`fence_call`)."""
        return None

    def fence_call(self, args: Sequence[str | int], fence: int) -> Phase:
        """The call writing the agreed fencing token back, on the same keys. Asked only of
        a rule that `fences`; the others have no such phase."""
        raise TypeError(f"{type(self).__name__} has no fencing phase (its `fences` is False)")

    def give_back(self, args: Sequence[str | int]) -> GiveBack | None:
        """How a refused call is undone on every node (None: nothing to undo)."""
        return None


class _Acquire(Rule):
    """An acquire (RL_ACQUIRE): granted by a quorum, its fencing token agreed; refused, it
    is given back."""

    __slots__ = ()
    fences = True

    def decided(self, replies: Votes, pending: int, quorum: int, keys: int) -> bool:
        # Granted; or refused by the answers of a quorum (busy: who holds it is in them);
        # or too few nodes left to answer for either.
        granted, answered = sum(1 for r in replies.values() if int(r[0]) == 1), len(replies)
        out_of_reach = granted + pending < quorum
        return granted >= quorum or (
            out_of_reach and (answered >= quorum or answered + pending < quorum)
        )

    def verdict(self, replies: Votes, quorum: int, keys: int) -> Verdict:
        granted = {i: int(r[1]) for i, r in replies.items() if int(r[0]) == 1}
        nodes = frozenset(granted)
        if len(granted) >= quorum:
            agreed = max(granted.values())
            if sum(1 for token in granted.values() if token == agreed) >= quorum:
                return Verdict(reply=[1, agreed], granted=nodes)
            return Verdict(reply=[1, agreed], fence=agreed, granted=nodes)
        refused = [r for r in replies.values() if int(r[0]) != 1]
        if len(refused) + len(granted) < quorum or not refused:
            return Verdict(failure=NO_QUORUM, granted=nodes, give_back=True)
        return Verdict(reply=self.refusal(refused, quorum), granted=nodes, give_back=True)

    def refusal(self, refused: list[Any], quorum: int) -> list[Any]:
        """The answer of an acquire a quorum refused."""
        if sum(1 for r in refused if int(r[0]) == -1) >= quorum:
            return [-1, 0]
        return _busiest([r for r in refused if int(r[0]) == 0]) or [0, -1]

    def granted_token(self, reply: Any) -> int | None:
        return int(reply[1]) if int(reply[0]) == 1 else None

    def fence_call(self, args: Sequence[str | int], fence: int) -> Phase:
        return Phase(RL_FENCE, [args[0], fence], FENCE_VOTES)

    def give_back(self, args: Sequence[str | int]) -> GiveBack | None:
        # An abort that also refuses a late copy of the acquire (or, for a token the
        # caller chose, a plain release).
        token, retain = args[0], args[3] if len(args) > 3 else ""
        undo: list[str | int] = [token, "abort", retain] if retain != "" else [token, ""]
        return GiveBack(RL_RELEASE, undo, int(args[1]) / 1000)


class _Resume(_Acquire):
    """A resume (RESUME): an acquire's votes, nothing given back; refused is `[0]`."""

    __slots__ = ()

    def refusal(self, refused: list[Any], quorum: int) -> list[Any]:
        return [0]

    def give_back(self, args: Sequence[str | int]) -> GiveBack | None:
        return None


class _Renew(Rule):
    """A renewal batch (RENEW): each lease renewed by a quorum, or lost when a quorum
    answered "not the owner"; decided once every lease is."""

    __slots__ = ()

    def decided(self, replies: Votes, pending: int, quorum: int, keys: int) -> bool:
        yes, no = _tally(replies, keys)
        return all(
            y >= quorum or n >= quorum or (y + pending < quorum and n + pending < quorum)
            for y, n in zip(yes, no, strict=True)
        )

    def verdict(self, replies: Votes, quorum: int, keys: int) -> Verdict:
        yes, no = _tally(replies, keys)
        if any(y < quorum and n < quorum for y, n in zip(yes, no, strict=True)):
            return Verdict(failure="no quorum renewed or refused every lease")
        return Verdict(reply=[1 if y >= quorum else 0 for y in yes])


class _Release(Rule):
    """A release (RL_RELEASE): done when a quorum released it (or found it released)."""

    __slots__ = ()

    def decided(self, replies: Votes, pending: int, quorum: int, keys: int) -> bool:
        done = sum(1 for r in replies.values() if int(r[0]) != 0)
        refused = len(replies) - done
        return (
            done >= quorum
            or refused >= quorum
            or (done + pending < quorum and refused + pending < quorum)
        )

    def verdict(self, replies: Votes, quorum: int, keys: int) -> Verdict:
        done = [r for r in replies.values() if int(r[0]) != 0]
        if len(done) >= quorum:
            return Verdict(reply=[1 if any(int(r[0]) == 1 for r in done) else 2, "", "", "", 0])
        if len(replies) - len(done) >= quorum:
            return Verdict(reply=[0, "", "", "", 0])
        return Verdict(failure=NO_QUORUM)


class _Fence(Rule):
    """The write-back of an agreed fencing token (RL_FENCE): acknowledged by a quorum."""

    __slots__ = ()

    def decided(self, replies: Votes, pending: int, quorum: int, keys: int) -> bool:
        acked = sum(1 for r in replies.values() if int(r) == 1)
        return acked >= quorum or acked + pending < quorum

    def verdict(self, replies: Votes, quorum: int, keys: int) -> Verdict:
        if sum(1 for r in replies.values() if int(r) == 1) >= quorum:
            return Verdict(reply=1)
        return Verdict(failure=FENCE_NOT_ACKNOWLEDGED)

    def said(self, reply: Any) -> str:
        return "acknowledged" if int(reply) == 1 else "not held"


def _tally(replies: Votes, count: int) -> tuple[list[int], list[int]]:
    """Per lease of a renewal batch (`count` leases, one key each), how many nodes renewed
    it and how many did not."""
    yes, no = [0] * count, [0] * count
    for reply in replies.values():
        for index, one in enumerate(reply):
            if int(one) == 1:
                yes[index] += 1
            else:
                no[index] += 1
    return yes, no


def _busiest(refused: list[Any]) -> list[Any] | None:
    """The refusal naming the holder most nodes named (its shortest expiry: the earliest
    time worth trying again), or None."""
    if not refused:
        return None
    holders = Counter(str(r[2]) for r in refused)
    holder = holders.most_common(1)[0][0]
    busiest: list[Any] = min((r for r in refused if str(r[2]) == holder), key=lambda r: int(r[1]))
    return busiest


FENCE_VOTES: Final = _Fence()
ACQUIRE_VOTES: Final = _Acquire()
RESUME_VOTES: Final = _Resume()
RENEW_VOTES: Final = _Renew()
RELEASE_VOTES: Final = _Release()


@dataclasses.dataclass(frozen=True, slots=True)
class VoteRules:
    """A quorum primitive's rules, one per call the engine makes for it."""

    acquire: Rule
    resume: Rule
    renew: Rule
    release: Rule


REDLOCK_VOTES: Final = VoteRules(ACQUIRE_VOTES, RESUME_VOTES, RENEW_VOTES, RELEASE_VOTES)
"""A `Redlock`'s rules."""
