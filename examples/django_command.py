"""A Django management command that three servers' cron run at once: one does the work.

    python examples/django_command.py

`manage.py reindex` rebuilds a search index. Cron starts it on three servers at the same
minute; the command takes the lock `reindex:<index>` with `try_acquire()` and the two that
find it held say so and exit. The one that runs checks its lease between batches
(`lease.check()`: a synchronous command cannot be cancelled) and stamps each batch with its
fencing token. In a project, the class below lives in
`yourapp/management/commands/reindex.py`; here Django is configured in this file and the
command run through `call_command`, as `manage.py` would run it.
"""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import django
from _server import check, redis_url_sync
from django.conf import settings
from django.core.management import BaseCommand, call_command

import aiolock.sync

batches: list[tuple[str, int]] = []


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no types
    help = "Rebuild the search index (one server at a time)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--index", default="products")

    def handle(self, *args: Any, **options: Any) -> None:
        index = options["index"]
        lock = aiolock.sync.Lock(settings.AIOLOCK_REDIS_URL, f"reindex:{index}", ttl=10)
        lease = lock.try_acquire()
        if lease is None:
            self.stdout.write(f"skipped: another server is rebuilding {index}")
            return
        with lease:  # released at the end; a loss meanwhile is raised here
            for batch in range(5):
                lease.check()  # stop before a batch that would not be protected
                time.sleep(0.05)  # index the batch
                batches.append((index, lease.fencing_token))
                del batch
        self.stdout.write(f"rebuilt {index} (fencing token {lease.fencing_token})")


def run_on_three_servers(index: str) -> list[str]:
    outputs = [io.StringIO() for _ in range(3)]
    start = threading.Barrier(3, timeout=30)

    def server(out: io.StringIO) -> None:
        start.wait()  # the same minute on every server
        call_command(Command(), index=index, stdout=out)

    threads = [threading.Thread(target=server, args=(out,)) for out in outputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return sorted(out.getvalue().split(" ")[0] for out in outputs)


def main() -> None:
    with redis_url_sync() as url:
        settings.configure(AIOLOCK_REDIS_URL=url, INSTALLED_APPS=[], USE_TZ=True)
        django.setup()
        try:
            first = run_on_three_servers("products")
            second = run_on_three_servers("products")
        finally:
            aiolock.sync.shutdown()
    print(f"first minute: {first}; next minute: {second}")
    print(f"batches: {len(batches)} under fencing tokens {sorted({t for _, t in batches})}")
    check(first == ["rebuilt", "skipped:", "skipped:"], "one of three servers rebuilt the index")
    check(second.count("rebuilt") == 1, "the next run found the lock free again")
    check(len(batches) == 10, "each run indexed every batch under one lease")


if __name__ == "__main__":
    main()
