"""Fenced writes to files: each write a version named by its token, the highest one wins.

    python examples/fenced_files.py

A file cannot be compared and replaced in one step by several processes, but a new file
can be put in place in one step (`os.replace`, a rename: atomic on one file system). So
each document is a directory of versions, each named by the fencing token it was written
with; the document is its highest version, whatever order they were written in. A
write looks for a higher version (there is one: refused, nothing written), puts its own
in place, and looks again (a higher one came meanwhile: its own is removed, refused); an
accepted write removes the older versions. An equal token replaces its own version: the
same holder writing again.

The same scheme suits an object store whose listings are consistent with its writes (one
object per version under the document's prefix; the reader lists it and reads the highest).

Holder A takes the lock and stalls past its ttl; B takes the lock and writes; then A
wakes up and writes as if it still held the lock: refused.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from pathlib import Path

import redis.asyncio
from _server import check, redis_url

from aiolock import Lock


class FencedDirectory:
    """Documents under `root`, each a directory of versions named by their fencing token."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @staticmethod
    def _versions(folder: Path) -> list[int]:
        return [int(p.name) for p in folder.iterdir() if p.name.isdigit()]

    def write(self, document: str, data: bytes, token: int) -> bool:
        """Write `data` as `document`; False if a version with a higher token exists."""
        folder = self.root / document
        folder.mkdir(parents=True, exist_ok=True)
        if max(self._versions(folder), default=token) > token:
            return False
        version = folder / f"{token:020d}"
        temporary = folder / f".{version.name}.{secrets.token_hex(8)}"
        with temporary.open("wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, version)  # readers see the whole version, or none of it
        versions = self._versions(folder)
        if max(versions) > token:  # a newer version came meanwhile: this one is not read
            version.unlink(missing_ok=True)
            return False
        for older in versions:
            if older < token:
                (folder / f"{older:020d}").unlink(missing_ok=True)
        return True

    def read(self, document: str) -> tuple[bytes | None, int]:
        """The document's highest version and its token; (None, 0) if it has none."""
        folder = self.root / document
        while True:
            versions = self._versions(folder) if folder.is_dir() else []
            if not versions:
                return None, 0
            token = max(versions)
            try:
                return (folder / f"{token:020d}").read_bytes(), token
            except FileNotFoundError:  # removed by a newer write since the listing: again
                continue


async def main() -> None:
    name = f"reports:{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory() as root:
        store = FencedDirectory(Path(root))
        async with redis_url() as url:
            client = redis.asyncio.Redis.from_url(url)
            try:
                # A holds the lock without renewal here, to stand for a holder whose
                # process stops running: its lease runs out while it is not looking.
                a = await Lock(client, name, ttl=0.3, renew=False).acquire()
                await a.wait_lost()  # A is "paused"; it will not notice this
                async with Lock(client, name, ttl=10) as b:
                    print(f"A holds fencing token {a.fencing_token}, B holds {b.fencing_token}")
                    b_wrote = store.write("report", b"B's report", b.fencing_token)
                # A wakes up, believes it still holds the lock, and writes.
                a_wrote = store.write("report", b"A's report", a.fencing_token)
            finally:
                await client.aclose()
        data, token = store.read("report")
        left = sorted(p.name for p in (Path(root) / "report").iterdir())
    print(f"B's write accepted: {b_wrote}; A's: {a_wrote}")
    print(f"read: {data!r}, written with fencing token {token}; files: {left}")
    check(b_wrote, "the current holder's write was accepted")
    check(not a_wrote, "the superseded holder's write was refused")
    check(data == b"B's report" and token == b.fencing_token, "the document is B's")
    check(left == [f"{b.fencing_token:020d}"], "one version left: B's")


if __name__ == "__main__":
    asyncio.run(main())
