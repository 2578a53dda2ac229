"""aiolock.sync under a frozen server: a busy synchronous body learns of the loss at the
lease's deadline, not later, and the block's exit says the body ran on."""

from __future__ import annotations

import time

import pytest
import redis

import aiolock.sync
from aiolock import LeaseLostError, LossReason

from ..support.load import scaled
from ..support.servers import RedisServer

pytestmark = pytest.mark.real_only


def test_an_unreachable_server_is_seen_by_a_busy_body_at_the_deadline(
    server: RedisServer, name: str
) -> None:
    ttl = scaled(1.0)
    client = redis.Redis.from_url(server.url)
    try:
        lock = aiolock.sync.Lock(client, name, ttl=ttl)
        with pytest.raises(LeaseLostError) as at_exit, lock as lease:
            server.pause()
            try:
                end = time.monotonic() + 3 * ttl
                while True:  # a busy pure-Python body, checking
                    try:
                        lease.check()
                    except LeaseLostError as error:
                        seen, lost = time.monotonic(), error
                        break
                    assert time.monotonic() < end, "no loss within 3 ttl"
                deadline = lease.deadline  # final once lost
            finally:
                server.resume()
        assert lost.reason is LossReason.DEADLINE
        assert deadline <= seen <= deadline + scaled(0.1), seen - deadline
        assert at_exit.value.body_completed is True
    finally:
        aiolock.sync.shutdown()
        client.close()
