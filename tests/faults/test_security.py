"""Security: least-privilege ACL, TLS, secret tokens kept out of logs and errors, no KEYS.

- `ACL_SETUSER` below is the smallest ACL that aiolock's lock operations need (acquire,
  renewal, waiting, release, extend, info, locked); the test runs them end to end as that
  user on every server binary available and checks the server's ACL LOG, and a second test
  checks the line against the commands the Lua scripts call, so a script change that needs
  a new command fails here with its name.
- TLS: a server started with a self-signed certificate, clients on `rediss://`.
- The lease token (the secret that proves ownership) never appears whole in a log record,
  a repr, an event or an error message, through a cycle with losses and backend errors.
- No `KEYS` command anywhere in the package (it blocks the server): `SCAN` only.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import redis.asyncio
import redis.exceptions

import aiolock
import aiolock._lua.lock
from aiolock import (
    AcquireTimeoutError,
    BackendError,
    Lease,
    LeaseLostError,
    Lock,
    LockEvent,
    LossReason,
    ReadWriteLock,
    Semaphore,
    add_listener,
)
from aiolock._engine.runtime import runtime_for
from aiolock._lua.layout import LockKeys
from aiolock._lua.lock import Script
from aiolock.testing import ServerStartError, TLSFiles

from ..conftest import in_ci, make_client
from ..support.load import scaled
from ..support.servers import RedisServer, ServerBinary, find_binaries
from ..support.waits import eventually, within

pytestmark = pytest.mark.real_only

PACKAGE = Path(aiolock.__file__).resolve().parent

# =========================================================================== (a) ACL
ACL_SETUSER = (
    "ACL SETUSER aiolock-app reset on >PASSWORD ~aiolock:* resetchannels &aiolock:* "
    "+evalsha +eval +subscribe +unsubscribe +ping +multi +exec +lrange "
    "+del +exists +hdel +hexists +hget +hgetall +hincrby +hmget +hset +lpush +ltrim +pexpire "
    "+pttl +publish +time +zadd +zcard +zrange +zrangebyscore +zrem"
)
"""The least privilege for aiolock with the default prefix: its keys and channels only;
EVALSHA/EVAL (scripts), SUBSCRIBE/UNSUBSCRIBE/PING (waiting), MULTI/EXEC/LRANGE (info()), and every
command the scripts call (ACL applies inside scripts too). redis-py's CLIENT SETINFO on
connect is refused by this user and ignored by redis-py; add `+client|setinfo` on servers
that have it (Redis >= 7.2, Valkey) to keep it out of the ACL LOG."""

OUTSIDE_SCRIPTS = {"evalsha", "eval", "subscribe", "unsubscribe", "ping", "multi", "exec", "lrange"}
"""Commands aiolock sends itself (MULTI/EXEC and LRANGE: a Semaphore's or ReadWriteLock's
info()); the others in the line are called by its scripts."""

HANDSHAKE_REFUSALS = {"client", "client|setinfo"}
"""What redis-py sends on connect (CLIENT SETINFO), refused and ignored: the only entries
the ACL LOG may show after a cycle (Redis 6.2 logs the command, later servers the
subcommand)."""


def acl_commands() -> set[str]:
    return {word[1:] for word in ACL_SETUSER.split() if word.startswith("+")}


PRIMITIVE_SCRIPTS = (
    "aiolock._lua.lock",  # Lock (and INSPECT for every primitive)
    "aiolock._lua.lease",  # RENEW, RESUME for every primitive
    "aiolock._lua.hash_leases",  # a Semaphore's or ReadWriteLock's expired leases
    "aiolock._lua.semaphore",
    "aiolock._lua.rwlock",
    "aiolock._lua.redlock",
)
"""The modules of the scripts that Lock, Semaphore, ReadWriteLock and Redlock run (an
Election and run_once need more: see the ACL docstring)."""


def _scripts_in(module: str) -> list[Script]:
    found = []
    for value in vars(importlib.import_module(module)).values():
        values = value if isinstance(value, tuple) else (value,)
        found += [v for v in values if isinstance(v, Script)]
    return found


def script_commands() -> set[str]:
    """Every command called by the Lua scripts of Lock, Semaphore, ReadWriteLock and
    Redlock."""
    scripts = [script for module in PRIMITIVE_SCRIPTS for script in _scripts_in(module)]
    assert len(scripts) >= 12, [s.name for s in scripts]
    calls = re.compile(r"redis\.p?call\(\s*['\"]([A-Za-z|]+)['\"]")
    return {command.lower() for s in scripts for command in calls.findall(s.source)}


def test_the_acl_line_grants_exactly_what_the_scripts_call() -> None:
    needed = script_commands()
    granted = acl_commands()
    assert not needed - granted, f"scripts call commands the ACL line lacks: {needed - granted}"
    assert not granted - needed - OUTSIDE_SCRIPTS, f"not needed: {granted - needed}"


def _binaries_for_acl() -> list[ServerBinary]:
    """One binary per server version: the embedded ones, and redis-server on the system."""
    found = list(find_binaries())
    found += [
        ServerBinary("system", path)
        for path in ("/usr/bin/redis-server", "/usr/local/bin/redis-server")
        if os.access(path, os.X_OK)
    ]
    unique: dict[str, ServerBinary] = {}
    for binary in found:
        unique.setdefault(f"{Path(binary.path).name} {binary.version}", binary)
    return list(unique.values())


@pytest.fixture(params=_binaries_for_acl(), ids=lambda b: f"{b.kind}-{b.version}")
def any_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    if os.environ.get("REDIS_URL"):
        pytest.skip("REDIS_URL is set: this test must own its server")
    server = RedisServer(request.param).start()
    try:
        yield server
    finally:
        server.stop()


def _log_objects(log: Any) -> list[str]:
    objects = []
    for entry in log:
        fields = (
            dict(zip(entry[::2], entry[1::2], strict=True)) if isinstance(entry, list) else entry
        )
        value = fields.get(b"object", fields.get("object", b""))
        objects.append(value.decode() if isinstance(value, bytes) else str(value))
    return objects


async def test_a_least_privilege_acl_user_can_do_everything(
    any_server: RedisServer, name: str
) -> None:
    admin = make_client(any_server.url)
    words = ACL_SETUSER.replace("PASSWORD", "s3cret").split()
    await admin.execute_command(*words)  # type: ignore[no-untyped-call]
    await admin.execute_command("ACL", "LOG", "RESET")  # type: ignore[no-untyped-call]
    user = make_client(any_server.url, username="aiolock-app", password="s3cret")
    other = make_client(any_server.url, username="aiolock-app", password="s3cret")
    loop = asyncio.get_running_loop()
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            await user.set("not-aiolock", "1")  # the user is really limited
        # Renewal past the ttl.
        async with Lock(user, f"{name}:renewed", ttl=scaled(0.5)) as lease:
            first_deadline = lease.deadline
            while loop.time() < first_deadline + 0.1:
                await asyncio.sleep(0.02)
            assert lease.held and not lease.lost
        assert lease.released
        # Waiting, woken by the release notification (the ttl would take 10 s).
        lock = Lock(user, name, ttl=10)
        holder = await lock.acquire()
        waiting = asyncio.create_task(Lock(other, name, ttl=10).acquire(timeout=10))
        channel = LockKeys.build("aiolock", name).channel
        await eventually(
            lambda: runtime_for(other).notifier.is_subscribed(channel),
            what="the waiter subscribed",
            interval=0.01,
        )
        assert await lock.locked()
        info = await lock.info()
        assert info is not None and info.fencing_token == holder.fencing_token
        await holder.extend()
        await holder.release()
        successor = await within(waiting, what="the waiter woken by the release")
        assert successor.fencing_token > holder.fencing_token
        await successor.release()
        assert not await lock.locked()
        assert await lock.info() is None
        # A semaphore: a permit, a waiter for the next one, the release that serves it.
        semaphore = Semaphore(user, f"{name}:sem", limit=1, ttl=10)
        permit = await semaphore.acquire()
        queued = asyncio.create_task(
            Semaphore(other, f"{name}:sem", limit=1, ttl=10).acquire(timeout=10)
        )

        async def one_waiting() -> bool:
            return (await semaphore.info()).waiting == 1

        await eventually(one_waiting, what="the semaphore's waiter queued")
        await permit.extend()
        await permit.release()
        await (await within(queued, what="the semaphore's waiter served")).release()
        # A read-write lock: readers together, then a writer.
        rw = ReadWriteLock(user, f"{name}:rw", ttl=10)
        async with rw.read(), ReadWriteLock(other, f"{name}:rw", ttl=10).read():
            pass
        async with rw.write():
            assert await rw.locked()
        refused = set(_log_objects(await admin.execute_command("ACL", "LOG")))  # type: ignore[no-untyped-call]
        refused.discard("set")  # the deliberate SET above
        assert refused <= HANDSHAKE_REFUSALS, f"aiolock was refused: {refused}"
    finally:
        await user.aclose()
        await other.aclose()
        await admin.aclose()


# =========================================================================== (b) TLS
def _make_certificate(directory: Path) -> tuple[Path, Path] | None:
    """A self-signed certificate for 127.0.0.1 (cert, key), or None if nothing can make one."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    openssl = shutil.which("openssl")
    if openssl:
        subprocess.run(
            [
                openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                "-keyout", str(key), "-out", str(cert),
                "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip
        return cert, key
    try:
        x509: Any = importlib.import_module("cryptography.x509")
        hashes: Any = importlib.import_module("cryptography.hazmat.primitives.hashes")
        rsa: Any = importlib.import_module("cryptography.hazmat.primitives.asymmetric.rsa")
        serialization: Any = importlib.import_module("cryptography.hazmat.primitives.serialization")
    except ImportError:
        return None
    import datetime
    import ipaddress

    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return cert, key


def _tls_candidates() -> list[str]:
    """Server binaries to try, the system's first (Debian builds Redis with TLS)."""
    paths = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        paths += [os.path.join(directory, n) for n in ("redis-server", "valkey-server")]
    paths += [binary.path for binary in find_binaries()]
    unique: dict[str, str] = {}
    for path in paths:
        if os.access(path, os.X_OK):
            unique.setdefault(os.path.realpath(path), path)
    return list(unique.values())


@dataclass
class TlsServer:
    url: str
    ca: Path
    binary: str


@pytest.fixture
def tls_server() -> Iterator[TlsServer]:
    """A server of this test's own listening on TLS only, on a free port of 127.0.0.1.

    The first binary here that starts with TLS options is used. In CI (`CI=true`) a
    missing one is a failure, as a missing server binary is (tests/conftest.py)."""
    if os.environ.get("REDIS_URL"):
        pytest.skip("REDIS_URL is set: this test must own its server")
    with tempfile.TemporaryDirectory(prefix="aiolock-tls-") as tmp:
        made = _make_certificate(Path(tmp))
        if made is None:
            _missing("cannot make a certificate: neither openssl nor cryptography is here")
        cert, key = made
        refused = []
        for path in _tls_candidates():
            server = RedisServer(ServerBinary("tls", path), tls=TLSFiles(cert, key, cert))
            try:
                server.start()
            except ServerStartError as error:
                refused.append(f"{path}: {str(error).splitlines()[-1]}")
                continue
            try:
                yield TlsServer(server.url, cert, path)
            finally:
                server.stop()
            return
        _missing("no server binary here supports TLS; tried:\n" + "\n".join(refused))


def _missing(message: str) -> NoReturn:
    if in_ci():
        pytest.fail(f"{message} (CI=true: the TLS test must run)")
    pytest.skip(message)


async def test_a_lock_cycle_over_tls(tls_server: TlsServer, name: str) -> None:
    client = redis.asyncio.Redis.from_url(tls_server.url, ssl_ca_certs=str(tls_server.ca))
    other = redis.asyncio.Redis.from_url(tls_server.url, ssl_ca_certs=str(tls_server.ca))
    plain = redis.asyncio.Redis.from_url(tls_server.url.replace("rediss://", "redis://"))
    loop = asyncio.get_running_loop()
    try:
        with pytest.raises(redis.exceptions.ConnectionError):
            async with asyncio.timeout(5):
                await plain.ping()  # the port speaks TLS only
        # Room for the TLS handshakes and the stalls of a loaded machine.
        lock = Lock(client, name, ttl=scaled(1.0))
        async with lock as lease:  # renewed over TLS past its ttl
            waiting = asyncio.create_task(Lock(other, name, ttl=5).acquire(timeout=10))
            first_deadline = lease.deadline
            while loop.time() < first_deadline + 0.1 and not lease.lost:
                await asyncio.sleep(0.02)
            assert lease.held and not lease.lost
            assert await lock.locked()
        successor = await asyncio.wait_for(waiting, 5)  # woken over TLS pub/sub
        assert successor.fencing_token > lease.fencing_token
        await successor.release()
        assert not await lock.locked()
    finally:
        await client.aclose()
        await other.aclose()
        await plain.aclose()


# =========================================================================== (c) secrets
@dataclass
class Seen:
    """Everything of a cycle that a user or an operator could read."""

    texts: list[str]
    leases: list[Lease]
    events: list[LockEvent]

    def add_error(self, error: BaseException) -> None:
        self.texts += [str(error), repr(error), *getattr(error, "__notes__", [])]
        self.texts.append("".join(traceback.format_exception(error)))
        if error.__cause__ is not None:
            self.add_error(error.__cause__)

    def assert_no_token(self, records: list[logging.LogRecord]) -> None:
        formatter = logging.Formatter()
        texts = list(self.texts)
        for record in records:
            texts += [record.getMessage(), repr(record.__dict__)]
            if record.exc_info:
                texts.append(formatter.formatException(record.exc_info))
        texts += [repr(event) for event in self.events]
        texts += [repr(lease) for lease in self.leases]
        assert self.events, "the cycle produced no event: the listener was not called"
        assert len(records) > 10, "nothing was logged at DEBUG"
        tokens = [lease.token for lease in self.leases]
        assert len(tokens) >= 4
        for token in tokens:
            assert len(token) == 32
            leaks = [text for text in texts if token in text]
            assert not leaks, f"a lease token appears whole in: {leaks[0][:500]}"


@pytest.fixture
def seen(caplog: pytest.LogCaptureFixture) -> Iterator[Seen]:
    seen = Seen([], [], [])
    remove = add_listener(seen.events.append)
    caplog.set_level(logging.DEBUG)
    try:
        yield seen
    finally:
        remove()


async def test_tokens_never_appear_in_logs_reprs_events_or_errors(
    server: RedisServer, name: str, seen: Seen, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(server.url)
    admin = make_client(server.url)
    loop = asyncio.get_running_loop()
    try:
        # A renewed, inspected, contended, extended and released lease.
        lock = Lock(client, name, ttl=scaled(0.3))
        async with lock as lease:
            seen.leases.append(lease)
            first_deadline = lease.deadline
            while loop.time() < first_deadline + 0.05:  # renewed meanwhile
                await asyncio.sleep(0.02)
            await lease.extend()
            seen.texts += [repr(lock), repr(await lock.info())]
            try:
                await Lock(admin, name, ttl=0.3).acquire(timeout=0.05)
            except AcquireTimeoutError as error:
                seen.add_error(error)
        # Lost: the key deleted behind the holder's back.
        with pytest.raises(LeaseLostError) as lost:
            async with Lock(client, name, ttl=scaled(0.3)) as lease:
                seen.leases.append(lease)
                await admin.delete(lock.key)
                await asyncio.sleep(5)
        assert lost.value.reason is LossReason.NOT_OWNER
        seen.add_error(lost.value)
        # Lost by deadline while Redis is frozen, with failing renewals and release, and a
        # BackendError from an acquire meanwhile (its attempt's bound is at least 1 s: the
        # lease's ttl is longer, so that the error comes before the loss).
        broken_seen = False
        try:
            with pytest.raises(LeaseLostError) as lost:
                async with Lock(client, name, ttl=2.0) as lease:
                    seen.leases.append(lease)
                    server.pause()
                    with pytest.raises(BackendError) as broken:
                        await Lock(admin, f"{name}:other", ttl=5).acquire(timeout=0.2)
                    seen.add_error(broken.value)
                    broken_seen = True
                    await asyncio.sleep(5)
        finally:
            server.resume()
        assert broken_seen, "the acquire's BackendError came after the loss"
        assert lost.value.reason is LossReason.DEADLINE
        assert isinstance(lost.value.__cause__, BackendError)
        seen.add_error(lost.value)
        # A release that finds the key taken.
        lease = await Lock(client, name, ttl=5, renew=False).acquire(timeout=5)
        seen.leases.append(lease)
        await admin.delete(lock.key)
        thief = await Lock(admin, name, ttl=5).acquire()
        seen.leases.append(thief)
        try:
            await lease.release()
        except LeaseLostError as error:
            seen.add_error(error)
        await thief.release()
    finally:
        server.resume()
        await client.aclose()
        await admin.aclose()
    seen.assert_no_token(caplog.records)


# =========================================================================== (d) no KEYS
_LUA_KEYS = re.compile(r"redis\.p?call\(\s*['\"]keys['\"]", re.IGNORECASE)
_CLIENTISH = re.compile(r"(client|redis|conn|pipe|backend)", re.IGNORECASE)


def keys_commands(source: str) -> list[str]:
    """Where `source` (Python) sends a KEYS command: the findings, empty if none."""
    findings: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.strip().upper() == "KEYS":
                findings.append(f"line {node.lineno}: the string {node.value!r}")
            if _LUA_KEYS.search(node.value):
                findings.append(f"line {node.lineno}: a Lua redis.call('KEYS', ...)")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "keys"
            and (node.args or node.keywords or _CLIENTISH.search(ast.unparse(node.func.value)))
        ):
            findings.append(f"line {node.lineno}: {ast.unparse(node)}")
    return findings


def test_the_keys_detector_finds_what_it_must() -> None:
    bad = [
        'await client.keys("aiolock:*")',
        "self._redis.keys()",
        'await client.execute_command("KEYS", "*")',
        "SCRIPT = \"return redis.call('keys', ARGV[1])\"",
    ]
    for source in bad:
        assert keys_commands(source), source
    good = ['{"a": 1}.keys()', "fields.keys()", "SRC = 'return #KEYS + KEYS[1]:len()'"]
    for source in good:
        assert not keys_commands(source), source


def test_no_keys_command_anywhere_in_the_package() -> None:
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 5
    findings = {
        str(path.relative_to(PACKAGE)): found
        for path in sources
        if (found := keys_commands(path.read_text(encoding="utf-8")))
    }
    assert not findings, f"KEYS is used (SCAN must be): {findings}"
