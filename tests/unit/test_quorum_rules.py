"""The rules of a quorum's votes (`aiolock._model.quorum_rules`): pure functions of the
replies, by node index, and the quorum's size (3 of 5 here)."""

from __future__ import annotations

from aiolock._lua.redlock import RL_FENCE, RL_RELEASE
from aiolock._model.quorum_rules import (
    ACQUIRE_VOTES,
    REDLOCK_VOTES,
    RELEASE_VOTES,
    RENEW_VOTES,
    RESUME_VOTES,
    GiveBack,
    Verdict,
)

Q = 3  # of 5 nodes


def held(pttl: int, fence: str) -> list[object]:
    """A node's refusal of an acquire: held by the holder of fencing token `fence` (who it
    is, as nodes name it) for `pttl` ms more."""
    return [0, pttl, fence, "h 1 t", "1000", "30000", ""]


def test_an_acquire_granted_by_a_quorum_with_one_token_is_agreed_at_once() -> None:
    replies = {0: [1, 7], 1: [1, 7], 3: [1, 7]}
    assert ACQUIRE_VOTES.decided(replies, 2, Q, 2)
    assert ACQUIRE_VOTES.verdict(replies, Q, 2) == Verdict(
        reply=[1, 7], granted=frozenset({0, 1, 3})
    )


def test_an_acquire_granted_with_different_tokens_writes_the_highest_back() -> None:
    replies = {0: [1, 7], 1: [1, 9], 2: [1, 7]}
    verdict = ACQUIRE_VOTES.verdict(replies, Q, 2)
    assert (verdict.reply, verdict.fence, verdict.granted) == ([1, 9], 9, frozenset({0, 1, 2}))
    phase = ACQUIRE_VOTES.fence_call(["tok", 30_000, "h 1 t", 60_000, 5], 9)
    assert (phase.script, phase.args) == (RL_FENCE, ["tok", 9])
    assert phase.votes.decided({0: 1, 1: 1}, 3, Q, 2) is False
    assert phase.votes.decided({0: 1, 1: 1, 2: 0}, 1, Q, 2) is False
    assert phase.votes.decided({0: 1, 1: 0, 2: 0}, 1, Q, 2) is True  # out of reach
    assert phase.votes.verdict({0: 1, 1: 1, 2: 1}, Q, 2).failure is None
    refused = phase.votes.verdict({0: 1, 1: 0, 2: 0}, Q, 2)
    assert refused.failure == "the fencing token was not acknowledged by a quorum"
    assert [phase.votes.said(reply) for reply in (1, 0)] == ["acknowledged", "not held"]


def test_a_split_vote_is_given_back_and_names_the_holder_most_nodes_named() -> None:
    """Two nodes grant, three refuse (two name one holder, one another): refused, the
    grants given back, the answer the most named holder's soonest expiry."""
    replies = {0: [1, 7], 1: [1, 7], 2: held(900, "7"), 3: held(400, "7"), 4: held(100, "8")}
    assert not ACQUIRE_VOTES.decided({0: [1, 7], 1: [1, 7], 2: held(9, "a")}, 2, Q, 2)
    assert ACQUIRE_VOTES.decided({0: [1, 7], 2: held(9, "a"), 3: held(9, "a")}, 1, Q, 2)
    verdict = ACQUIRE_VOTES.verdict(replies, Q, 2)
    assert verdict == Verdict(reply=held(400, "7"), granted=frozenset({0, 1}), give_back=True)


def test_an_acquire_a_quorum_refused_as_already_used_says_so() -> None:
    replies = {0: [-1, 0], 1: [-1, 0], 2: [-1, 0], 3: [1, 7]}
    verdict = ACQUIRE_VOTES.verdict(replies, Q, 2)
    assert (verdict.reply, verdict.give_back, verdict.granted) == ([-1, 0], True, frozenset({3}))


def test_an_acquire_no_quorum_answered_is_a_failure_given_back() -> None:
    assert ACQUIRE_VOTES.decided({0: [1, 7], 1: held(5, "a")}, 0, Q, 2)  # none left
    verdict = ACQUIRE_VOTES.verdict({0: [1, 7], 1: held(5, "a")}, Q, 2)
    assert verdict == Verdict(failure="no quorum answered", granted=frozenset({0}), give_back=True)
    assert [ACQUIRE_VOTES.said(r) for r in ([1, 7], held(5, "a"), [-1, 0])] == [
        "ok",
        "refused",
        "token already used",
    ]


def test_a_refused_acquire_is_undone_by_an_abort_kept_for_its_retention() -> None:
    undo = ACQUIRE_VOTES.give_back(["tok", 30_000, "h 1 t", 60_000, 5])
    assert undo == GiveBack(RL_RELEASE, ["tok", "abort", 60_000], 30.0)
    plain = ACQUIRE_VOTES.give_back(["tok", 30_000, "h 1 t", ""])
    assert plain == GiveBack(RL_RELEASE, ["tok", ""], 30.0)
    assert ACQUIRE_VOTES.granted_token([1, 9]) == 9
    assert ACQUIRE_VOTES.granted_token(held(5, "a")) is None


def test_a_resume_gives_nothing_back_and_a_refusal_is_zero() -> None:
    replies = {0: [0], 1: [0], 2: [0], 3: [1, 7]}
    verdict = RESUME_VOTES.verdict(replies, Q, 1)
    assert (verdict.reply, verdict.failure) == ([0], None)
    assert RESUME_VOTES.give_back(["tok", 30_000, ""]) is None
    assert RESUME_VOTES.verdict({0: [1, 7], 1: [1, 7], 2: [1, 7]}, Q, 1).reply == [1, 7]


def test_a_renewal_batch_is_decided_lease_by_lease() -> None:
    """Two leases: the first renewed by three nodes, the second refused by three."""
    replies = {0: [1, 0], 1: [1, 0], 2: [1, 0]}
    assert RENEW_VOTES.decided(replies, 2, Q, 2)
    assert RENEW_VOTES.verdict(replies, Q, 2) == Verdict(reply=[1, 0])
    split = {0: [1, 1], 1: [1, 0], 2: [0, 1]}
    assert not RENEW_VOTES.decided(split, 2, Q, 2)  # the second lease: 2 for, 1 against
    assert RENEW_VOTES.decided(split, 0, Q, 2)  # nobody left to answer
    failed = RENEW_VOTES.verdict(split, Q, 2)
    assert failed.failure == "no quorum renewed or refused every lease"
    assert not RENEW_VOTES.decided({}, 5, Q, 1)  # nothing answered yet
    assert RENEW_VOTES.verdict({}, Q, 1).failure is not None


def test_a_release_counts_when_a_quorum_released_it() -> None:
    assert RELEASE_VOTES.verdict({0: [1], 1: [2], 2: [2]}, Q, 2).reply == [1, "", "", "", 0]
    assert RELEASE_VOTES.verdict({0: [2], 1: [2], 2: [2]}, Q, 2).reply == [2, "", "", "", 0]
    assert RELEASE_VOTES.verdict({0: [0], 1: [0], 2: [0]}, Q, 2).reply == [0, "", "", "", 0]
    assert RELEASE_VOTES.verdict({0: [1], 1: [0]}, Q, 2).failure == "no quorum answered"
    assert not RELEASE_VOTES.decided({0: [1], 1: [0]}, 3, Q, 2)
    assert RELEASE_VOTES.decided({0: [1], 1: [0], 2: [0], 3: [1]}, 0, Q, 2)


def test_a_redlock_names_a_rule_for_each_of_its_calls() -> None:
    assert (REDLOCK_VOTES.acquire, REDLOCK_VOTES.resume) == (ACQUIRE_VOTES, RESUME_VOTES)
    assert (REDLOCK_VOTES.renew, REDLOCK_VOTES.release) == (RENEW_VOTES, RELEASE_VOTES)
