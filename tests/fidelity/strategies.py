"""Hypothesis strategies of fidelity sequences: a family of calls (a lock's, a semaphore's of
limit 2, a read-write lock's, a Redlock node's, an election's, fenced storage's), then 1 to
`MAX_STEPS` of its calls, from small pools of tokens and wait queues so that they collide,
with late copies (`Again`) and "time passes" steps (`Expire`) among them.
"""

from __future__ import annotations

from hypothesis import strategies as st

from .ops import (
    FENCES,
    WIDS,
    Acquire,
    Again,
    Announce,
    Expire,
    ExpireLeases,
    FencedDelete,
    FencedGet,
    FencedSet,
    Inspect,
    Op,
    Proclaim,
    Queue,
    Read,
    Release,
    Renew,
    Resume,
    RlAcquire,
    RlFence,
    SetLimit,
    Several,
    Successor,
)

__all__ = ("MAX_STEPS", "sequences")

MAX_STEPS = 14

tokens = st.sampled_from([0, 0, 0, 1, 1, 2, 3])
"""Indexes into TOKENS, the first ones more often: a release or a renewal then often names
the holder."""
wids = st.integers(0, len(WIDS) - 1)
claims = st.lists(tokens, max_size=2, unique=True).map(tuple)
queues = st.builds(Queue, wid=wids, behind=st.integers(0, 2), seq=st.integers(1, 3), reg=tokens)
retains = st.sampled_from([None, None, 5_000, 120_000])
helds = st.sampled_from([None, None, 0, 250, 40_000])
modes = ("", "", "", "abort", "force", "look")


def _acquire(prim: str, token: st.SearchStrategy[int] = tokens) -> st.SearchStrategy[Op]:
    return st.builds(
        Acquire, prim=st.just(prim), token=token, queue=st.none() | queues, claims=claims
    )


def _release(prim: str, modes: tuple[str, ...] = modes) -> st.SearchStrategy[Op]:
    plain = st.builds(
        Release,
        prim=st.just(prim),
        token=tokens,
        mode=st.sampled_from(modes),
        retain_ms=retains,
        held_ms=helds,
        renewed=st.booleans(),
    )
    withdraw = st.builds(Release, prim=st.just(prim), token=st.none(), withdraw=wids, claims=claims)
    join = st.builds(
        Release,
        prim=st.just(prim),
        token=tokens,
        retain_ms=retains,
        held_ms=helds,
        join=st.tuples(queues, st.integers(0, 2)),
    )
    return st.one_of(plain, plain, plain, withdraw, join)


def _leased(prim: str, permits: int = 1) -> list[st.SearchStrategy[Op]]:
    """The calls every leased primitive makes."""
    return [
        _acquire(prim),
        _acquire(prim),
        _release(prim),
        st.builds(
            Renew,
            prim=st.just(prim),
            token=tokens,
            ttl_ms=st.sampled_from([30_000, 60_000]),
            permits=st.integers(1, permits),
        ),
        st.builds(Resume, prim=st.just(prim), token=tokens),
    ]


def _common(family: str) -> list[st.SearchStrategy[Op]]:
    return [
        st.builds(Expire, family=st.just(family), key=st.integers(0, 5)),
        st.builds(Again, back=st.integers(1, 3)),
    ]


values = st.sampled_from(["", "=v1", "=v2"])
term = st.sampled_from([0, 0, 0, 0, 0, 1, 2])
"""An election's tokens: mostly one, so that a term is won, announced, proclaimed under and
handed on in one sequence."""
announce = st.builds(Announce, seat=st.sampled_from([0, 0, 1]), token=term, value=values)

FAMILY_CALLS: dict[str, list[st.SearchStrategy[Op]]] = {
    "lock": [*_leased("lock"), st.just(Inspect())],
    "sem": [
        *_leased("sem", permits=2),
        st.builds(Several, token=tokens, permits=st.sampled_from([2, 2, 3]), barrier=st.booleans()),
        st.builds(SetLimit, limit=st.integers(1, 3)),
        st.builds(ExpireLeases, family=st.just("sem"), which=st.sampled_from(["", "0", "1"])),
    ],
    "rw": [
        *_leased("read"),
        *_leased("write"),
        st.builds(ExpireLeases, family=st.just("rw"), which=st.sampled_from(["0", "1"])),
    ],
    "redlock": [
        st.builds(RlAcquire, token=tokens),
        st.builds(RlAcquire, token=tokens),
        st.builds(RlFence, token=tokens, ahead=st.sampled_from([0, 0, 5])),
        _release("redlock", modes=("", "", "abort", "force")),
        st.builds(Renew, prim=st.just("redlock"), token=tokens, fenced=st.booleans()),
        st.builds(Resume, prim=st.just("redlock"), token=tokens),
    ],
    "election": [
        *_leased("seat0"),
        _acquire("seat0", term),
        _acquire("seat1"),
        _release("seat1"),
        announce,
        announce,
        announce,
        st.builds(Proclaim, token=term, value=values, number=st.integers(1, 3)),
        st.builds(Proclaim, token=term, value=values, number=st.integers(1, 3)),
        st.builds(Read, first=st.sampled_from(["", "0-1"])),
        st.builds(Successor, token=term, identity=st.integers(0, 1)),
    ],
    "fenced": [
        st.builds(
            FencedSet,
            fence=st.sampled_from(FENCES),
            value=st.sampled_from(["a", "b"]),
            ttl_ms=st.sampled_from(["", 60_000]),
        ),
        st.builds(
            FencedDelete, fence=st.sampled_from(FENCES), keep_ms=st.sampled_from(["", 60_000])
        ),
        st.just(FencedGet()),
        st.builds(Acquire, prim=st.just("lock"), token=tokens),
        st.builds(Release, prim=st.just("lock"), token=tokens),
    ],
}


def sequences(families: tuple[str, ...] = tuple(FAMILY_CALLS)) -> st.SearchStrategy[list[Op]]:
    """A sequence: one family's calls, 1 to MAX_STEPS of them."""

    def of(family: str) -> st.SearchStrategy[list[Op]]:
        calls = st.one_of(*FAMILY_CALLS[family], *_common(family))
        return st.lists(calls, min_size=1, max_size=MAX_STEPS)

    return st.sampled_from(families).flatmap(of)
