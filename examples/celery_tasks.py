"""Celery tasks with aiolock.sync: a job run once per day, and charges one at a time per order.

    python examples/celery_tasks.py

A real Celery worker (its threads pool, four at once) consumes from an in-memory broker in
this process, as `celery -A ... worker -P threads` would from Redis or RabbitMQ. Eight
workers are asked to send tonight's report at once: `aiolock.sync.run_once` lets one send
it. Eight charges of one order arrive together: `@aiolock.sync.locked` runs them one at a
time, each writing with its fencing token to a store that refuses an older one.

In a prefork worker (the default pool), call `aiolock.sync.release_on_signals()` in each
pool process, from Celery's `worker_process_init` signal: a task terminated by SIGTERM
(`revoke(terminate=True)`) then gives its lock back before it dies. The threads pool used
here shares the main process, whose warm shutdown lets running tasks finish and release.
"""

from __future__ import annotations

import secrets
import threading
import time

import redis
from _server import check, redis_url_sync
from celery import Celery
from celery.contrib.testing.worker import start_worker

import aiolock.sync

app = Celery("shop", broker="memory://localhost/", backend="cache+memory://")
app.conf.update(task_acks_late=True, worker_hijack_root_logger=False)

state: dict[str, object] = {}
"""What the tasks need (the client, the run's tag) and what they record, for the checks."""
reports_sent: list[str] = []
store: dict[str, int] = {"fence": 0, "charges": 0}
store_lock = threading.Lock()
inside: list[int] = []
most_inside = [0]


def client() -> redis.Redis:
    made = state["client"]
    assert isinstance(made, redis.Redis)
    return made


def send_report(lease: aiolock.sync.Lease) -> str:
    time.sleep(0.2)  # build and mail the report
    lease.check()  # still ours before the last step
    reports_sent.append(f"fencing token {lease.fencing_token}")
    return "sent"


@app.task  # type: ignore[untyped-decorator]  # Celery ships no types
def nightly_report(day: str) -> str:
    result = aiolock.sync.run_once(
        client(), f"report:{state['tag']}:{day}", send_report, retention=2 * 86400, ttl=30
    )
    return result.status.value


@aiolock.sync.locked(client, "orders:{order_id}", ttl=10, timeout=30, on_busy="raise")
def charge_once(lease: aiolock.sync.Lease, order_id: str) -> None:
    with store_lock:
        inside.append(1)
        most_inside[0] = max(most_inside[0], len(inside))
    time.sleep(0.02)  # call the payment provider
    with store_lock:  # a store that refuses a writer older than the last one
        assert lease.fencing_token > store["fence"], "a stale writer"
        store["fence"] = lease.fencing_token
        store["charges"] += 1
        inside.pop()


@app.task  # type: ignore[untyped-decorator]  # Celery ships no types
def charge(order_id: str) -> None:
    charge_once(order_id)


def main() -> None:
    with redis_url_sync() as url:
        state["client"] = redis.Redis.from_url(url)
        state["tag"] = secrets.token_hex(4)
        try:
            with start_worker(
                app, pool="threads", concurrency=4, perform_ping_check=False, loglevel="WARNING"
            ):
                reports = [nightly_report.delay("2026-11-23") for _ in range(8)]
                statuses = sorted(r.get(timeout=60) for r in reports)
                charges = [charge.delay(f"{state['tag']}-42") for _ in range(8)]
                for result in charges:
                    result.get(timeout=60)
        finally:
            aiolock.sync.shutdown()
            client().close()
    print(f"report tasks: {statuses}")
    print(f"reports sent: {reports_sent}")
    print(f"charges: {store['charges']}, most at once: {most_inside[0]}")
    check(len(reports_sent) == 1, "tonight's report was sent once by eight tasks")
    check(statuses.count("ran") == 1, "one task ran it, the others found it done or running")
    check(
        store["charges"] == 8 and most_inside[0] == 1, "the charges of one order ran one at a time"
    )


if __name__ == "__main__":
    main()
