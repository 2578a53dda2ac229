"""A wait queue's registrations and grants: which grant may be taken without asking Redis.

Pure bookkeeping, no server: each test plays one order in which Redis may have applied the
commands, and checks that the queue never takes a grant that a later command may have
claimed, and never forgets one it may still hold.
"""

from __future__ import annotations

import asyncio
import functools

import pytest

from aiolock._engine.primitive_base import check_within_ms
from aiolock._engine.wait_queue import Grant, Registration, Waiter, WaitQueue
from aiolock._lua.layout import RESERVATION_MS


def queue_with_waiter() -> tuple[WaitQueue, Waiter]:
    queue = WaitQueue("aiolock:{name}:released")
    waiter = Waiter(queue, 0)
    queue.waiters.append(waiter)
    return queue, waiter


def granted(queue: WaitQueue, registration: Registration, fence: int, sent_at: float = 0) -> None:
    """The lock was granted to `registration`, as the channel or a local release says."""
    queue.released(
        f"released-{fence}",
        queue.wid,
        granted=str(fence),
        seq=str(registration.seq),
        sent_at=sent_at,
    )


async def test_a_grant_to_the_newest_registration_is_taken() -> None:
    queue, waiter = queue_with_waiter()
    registration = queue.register(1000, sent_at=10.0)
    queue.settle(registration, in_redis=True)
    granted(queue, registration, 7)
    assert waiter.take_wakeup(), "the head is woken to take it"
    grant = queue.pop_grant()
    # Heard of on the channel: the expiry is the registration's, at most RESERVATION_MS.
    assert grant == Grant(registration, 7, 10.0, 1000)
    assert grant.valid_until(1.0, margin=0.02) == pytest.approx(10.98)
    queue.took(grant)
    assert queue.claim_tokens() == []
    assert not queue.registered, "the grant took the queue's entry out of Redis"


async def test_a_local_release_gives_a_later_lower_bound_than_the_registration() -> None:
    queue, _ = queue_with_waiter()
    registration = queue.register(1000, sent_at=10.0)
    granted(queue, registration, 7, sent_at=12.5)  # the release was sent after registering
    grant = queue.pop_grant()
    assert grant is not None and grant.sent_at == 12.5


async def test_a_grant_to_an_older_registration_must_be_claimed() -> None:
    """A later attempt, whose answer was lost, may have claimed it already."""
    queue, _ = queue_with_waiter()
    older = queue.register(1000, sent_at=1.0)
    newer = queue.register(1000, sent_at=2.0)  # its attempt was cancelled: fate unknown
    granted(queue, older, 7)
    assert queue.pop_grant() is None
    # The head's next acquire claims whichever of the two the lock may be held under.
    assert queue.claim_tokens() == [older.token, newer.token]


async def test_an_answered_attempt_settles_older_registrations_and_grants() -> None:
    queue, _ = queue_with_waiter()
    older = queue.register(1000, sent_at=1.0)
    granted(queue, older, 7)  # heard of while the next attempt was in flight
    newer = queue.register(1000, sent_at=2.0)
    queue.settle(newer, in_redis=True)
    assert queue.pop_grant() is None, "the attempt claimed any grant to the older one"
    assert queue.claim_tokens() == [newer.token]


async def test_a_grant_heard_of_before_its_attempts_answer_is_kept() -> None:
    """The release ran right after the attempt: its message may beat the attempt's reply."""
    queue, _ = queue_with_waiter()
    registration = queue.register(1000, sent_at=1.0)
    granted(queue, registration, 7)
    queue.settle(registration, in_redis=True)
    grant = queue.pop_grant()
    assert grant is not None and grant.fencing_token == 7


async def test_an_answer_that_left_no_entry_in_redis_drops_every_grant() -> None:
    queue, _ = queue_with_waiter()
    registration = queue.register(1000, sent_at=1.0)
    granted(queue, registration, 7)
    queue.settle(registration, in_redis=False)
    assert queue.pop_grant() is None
    assert queue.claim_tokens() == []


async def test_a_grant_to_an_unknown_registration_wakes_the_head_to_try() -> None:
    queue, waiter = queue_with_waiter()
    stranger = Registration(seq=99, token="ab" * 16, sent_at=0.0, grant_ms=1000)
    granted(queue, stranger, 7)
    assert queue.pop_grant() is None
    assert waiter.take_wakeup()


async def test_each_release_counts_once() -> None:
    """The local release's reply and its echo on the channel are one release."""
    queue, waiter = queue_with_waiter()
    registration = queue.register(1000, sent_at=1.0)
    granted(queue, registration, 7)
    assert queue.pop_grant() is not None
    assert waiter.take_wakeup()
    granted(queue, registration, 7)
    assert queue.pop_grant() is None
    assert not waiter.take_wakeup()


async def test_the_announcement_that_makes_a_majority_heard_wakes_the_head() -> None:
    """A Redlock's release is announced by each node it lands on, all with one fencing
    token, in any order and however late. The head is woken once, by the announcement that
    makes a majority of nodes heard (3 of 5): before it, a try would be refused by the
    nodes still held; after it, one more try would change nothing. An announcement short
    of a majority tells the head to check within the node timeout instead. A node's
    announcement heard twice, the echoes of a release of this process (told by its reply,
    once a majority released), and the announcements of a release older than a lease this
    process took, count for nothing."""
    queue, waiter = queue_with_waiter()
    announced = functools.partial(queue.announced, needed=3, recheck_ms=250)
    announced("100", 4)
    assert not waiter.take_wakeup(), "one node's announcement of five"
    assert waiter.take_poll_hint() == 250, "checked within the node timeout"
    announced("100", 4)
    assert not waiter.take_wakeup() and waiter.take_poll_hint() is None, "the same node, again"
    announced("100", 1)
    assert not waiter.take_wakeup(), "two nodes' announcements of five"
    waiter.take_poll_hint()
    announced("100", 0)
    assert waiter.take_wakeup(), "the third node's: a majority released"
    for node in (2, 3):
        announced("100", node)
        assert not waiter.take_wakeup(), f"node {node}'s announcement, past the majority"
        assert waiter.take_poll_hint() is None
    queue.released("200", "")  # this process's own release, from its reply
    assert waiter.take_wakeup()
    for node in range(5):
        announced("200", node)
        assert not waiter.take_wakeup(), f"node {node}'s echo of this process's release"
    queue.lease_taken(300)
    for node in range(5):
        announced("250", node)
    assert not waiter.take_wakeup(), "a release older than the lease this process holds"
    for node in (1, 4, 0):
        announced("301", node)
    assert waiter.take_wakeup()


async def test_a_release_to_another_process_makes_the_head_check_later() -> None:
    queue, waiter = queue_with_waiter()
    queue.released("f1", "someone-else", granted="8", seq="1")
    assert queue.grant is None
    assert not waiter.take_wakeup()
    assert waiter.poll_hint_ms is not None


async def test_a_release_to_another_process_leaves_a_head_that_checks_soon_enough_asleep() -> None:
    """A waiter whose timer already ends its sleep by the time the grant would lapse is
    not woken (every waiting process hears every release: the wake-up would change
    nothing)."""
    queue, waiter = queue_with_waiter()
    sleeping = asyncio.ensure_future(waiter.wait(0.05))
    await asyncio.sleep(0)
    queue.released("f1", "someone-else", granted="8", seq="1")
    await asyncio.sleep(0)
    assert not sleeping.done() and waiter.take_poll_hint() is None
    assert await sleeping is True  # its own timer ended the sleep
    # Asleep for longer than the grant's lapse: told to check again by then.
    sleeping = asyncio.ensure_future(waiter.wait(60.0))
    await asyncio.sleep(0)
    queue.released("f2", "someone-else", granted="9", seq="1")
    assert waiter.take_poll_hint() == RESERVATION_MS
    assert await asyncio.wait_for(sleeping, 1.0) is False


def test_a_wait_of_no_time_ends_on_uvloop_too() -> None:
    """uvloop's call_later gives a plain Handle, without when(), for a delay of 0 or less."""
    uvloop = pytest.importorskip("uvloop")

    async def waits() -> None:
        for timeout in (0.0, -1.0, 0.01):
            _, waiter = queue_with_waiter()
            assert await waiter.wait(timeout) is True

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(waits())


async def test_forgotten_registrations_are_not_claimed() -> None:
    queue, _ = queue_with_waiter()
    registration = queue.register(1000, sent_at=1.0)
    queue.forget(registration)
    queue.forget(registration)  # twice is harmless
    assert queue.claim_tokens() == []


async def test_a_queue_remembers_a_bounded_number_of_registrations() -> None:
    queue, _ = queue_with_waiter()
    registrations = [queue.register(1000, sent_at=float(i)) for i in range(10)]
    assert queue.claim_tokens() == [r.token for r in registrations[-4:]]
    assert len({r.seq for r in registrations}) == 10
    assert all(len(r.token) == 32 for r in registrations)


async def test_waiting_with_a_pending_wakeup_can_be_told_to_sleep() -> None:
    """While a local release puts the queue in line, the head waits for its answer."""
    _, waiter = queue_with_waiter()
    waiter.wake()
    assert await waiter.wait(None) is False  # a pending wake-up returns at once
    waiter.wake()
    sleeping = asyncio.ensure_future(waiter.wait(None, pending_ok=True))
    await asyncio.sleep(0)
    assert not sleeping.done()
    waiter.nudge()
    assert await sleeping is False
    assert waiter.take_wakeup(), "the wake-up is still pending"


async def test_a_grant_to_the_entry_an_attempt_left_in_redis_is_kept() -> None:
    """A semaphore's acquire that took a permit may grant the next one to the entry it left
    for the caller's other waiters, and its message may beat its reply."""
    queue, _ = queue_with_waiter()
    registration = queue.register(1000, sent_at=1.0)
    granted(queue, registration, 7)
    queue.settle(registration, in_redis=True)
    grant = queue.pop_grant()
    assert grant is not None and grant.fencing_token == 7


async def test_a_grant_taken_before_its_command_was_answered_is_never_claimed() -> None:
    """A release put the queue in line (a semaphore's), another process granted to that
    registration, and the grant was taken before the release's answer came: the answer
    must not make the registration claimable again (a second waiter would hold the same
    permit)."""
    queue, _ = queue_with_waiter()
    registration = queue.register(1000, sent_at=1.0)
    granted(queue, registration, 7)
    grant = queue.pop_grant()
    assert grant is not None
    queue.took(grant, requeued=True)
    queue.settle(registration, in_redis=True)  # the release's answer, late
    assert queue.claim_tokens() == []


async def test_a_release_that_gives_back_grants_forgets_them_first() -> None:
    queue, _ = queue_with_waiter()
    registration = queue.register(1000, sent_at=1.0)
    granted(queue, registration, 7)
    assert queue.give_back() == [registration.token]
    assert queue.pop_grant() is None and queue.claim_tokens() == []
    granted(queue, registration, 8)  # told again while the release is under way
    assert queue.pop_grant() is None


@pytest.mark.parametrize(
    ("pttl", "check", "expected"),
    [
        pytest.param(30_000, b"", 30_000, id="no grants told to one process: the holder's ttl"),
        pytest.param(30_000, 950, 950, id="grants told to one process: until they lapsed"),
        pytest.param(400, 950, 400, id="the holder's key expires sooner"),
        pytest.param(-1, 950, 950, id="an expiry unknown"),
        pytest.param(-1, b"", -1, id="nothing known"),
    ],
)
def test_a_waiting_head_checks_within_the_sooner_of_the_ttl_and_the_check(
    pttl: int, check: bytes | int, expected: int
) -> None:
    busy = [0, pttl, b"12", b"h 1 t", b"1", b"30000", b"", check]
    assert check_within_ms(busy) == expected
    assert check_within_ms(busy[:7]) == pttl  # the busy answer of a semaphore, say


def test_a_queue_that_listens_on_its_processs_channel_says_so_in_its_id() -> None:
    plain = WaitQueue("aiolock:{name}:released")
    direct = WaitQueue("aiolock:{name}:released", "p0123abcd")
    assert len(plain.wid) == 16 and not plain.wid.startswith("p")
    assert direct.wid.startswith("p0123abcd") and len(direct.wid) == 17
    assert plain.channels == ("aiolock:{name}:released",)
    # The subscription of its own channel, last, confirms both.
    assert direct.channels == ("aiolock:{name}:released", "aiolock:{name}:released:p0123abcd")


async def test_a_lease_handed_while_the_waiter_was_busy_ends_its_next_wait_at_once() -> None:
    # Handed while it was trying (no wait in progress to end): the next wait, even one
    # that lets a pending wake-up be, returns at once instead of sleeping out its timer.
    _, waiter = queue_with_waiter()
    waiter.hand(object(), more=False)
    async with asyncio.timeout(1):
        assert await waiter.wait(30, pending_ok=True) is False
    assert waiter.handed_more is False
