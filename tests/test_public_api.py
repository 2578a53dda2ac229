"""The public surface: what `aiolock` exports, the exception hierarchy, the class shapes."""

from __future__ import annotations

import inspect
from importlib import resources

import fakeredis
import pytest

import aiolock
import aiolock.errors
from aiolock import (
    AcquireTimeoutError,
    AiolockError,
    BackendError,
    ConfigError,
    Lease,
    LeaseLostError,
    Lock,
    LockError,
    LockInfo,
    LossReason,
)


def public_names(module: object) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }


def test_all_is_a_sorted_tuple_of_the_public_names() -> None:
    assert isinstance(aiolock.__all__, tuple)
    assert list(aiolock.__all__) == sorted(aiolock.__all__)
    assert len(set(aiolock.__all__)) == len(aiolock.__all__)
    assert set(aiolock.__all__) == public_names(aiolock) | {"__version__"}
    for name in aiolock.__all__:
        assert hasattr(aiolock, name)


def test_exported_classes_claim_the_package_as_their_module() -> None:
    exported = [getattr(aiolock, n) for n in aiolock.__all__ if n != "__version__"]
    assert all(inspect.isclass(obj) or inspect.isfunction(obj) for obj in exported)
    for obj in exported:
        assert obj.__module__ == "aiolock", obj


def test_errors_all_is_a_sorted_tuple_of_its_public_names() -> None:
    assert isinstance(aiolock.errors.__all__, tuple)
    assert list(aiolock.errors.__all__) == sorted(aiolock.errors.__all__)
    assert set(aiolock.errors.__all__) == public_names(aiolock.errors)
    for name in aiolock.errors.__all__:
        assert getattr(aiolock.errors, name) is getattr(aiolock, name)


def test_exception_hierarchy() -> None:
    assert issubclass(ConfigError, AiolockError)
    assert issubclass(ConfigError, ValueError)
    assert issubclass(LockError, AiolockError)
    assert issubclass(AcquireTimeoutError, LockError)
    assert issubclass(AcquireTimeoutError, TimeoutError)
    assert issubclass(LeaseLostError, LockError)
    assert not issubclass(LeaseLostError, TimeoutError)
    assert issubclass(BackendError, AiolockError)
    assert not issubclass(BackendError, TimeoutError)
    assert not issubclass(BackendError, LockError)
    assert not issubclass(LockError, ConfigError)
    assert issubclass(AiolockError, Exception)
    assert not issubclass(AiolockError, ValueError)


def test_exception_attributes() -> None:
    config = ConfigError("ttl bad", argument="ttl", value=0)
    assert (config.argument, config.value, str(config)) == ("ttl", 0, "ttl bad")
    timeout = AcquireTimeoutError("t", name="n", timeout=1.5, attempts=3)
    assert (timeout.name, timeout.timeout, timeout.attempts) == ("n", 1.5, 3)
    assert (timeout.holder, timeout.retry_after) == (None, None)
    holder = LockInfo(
        name="n", fencing_token=9, host="h", pid=1, task="t", acquired_at=0.0, ttl=10.0,
        expires_in=2.5,
    )  # fmt: skip
    hinted = AcquireTimeoutError(
        "t", name="n", timeout=0.0, attempts=1, holder=holder, retry_after=2.5
    )
    assert (hinted.holder, hinted.retry_after) == (holder, 2.5)
    with pytest.raises(TypeError):
        AcquireTimeoutError("t", "n", 0.0, 1, holder, 2.5)  # type: ignore[call-arg, arg-type]
    lost = LeaseLostError("l", name="n", reason=LossReason.DEADLINE, fencing_token=7)
    assert (lost.name, lost.reason, lost.fencing_token) == ("n", LossReason.DEADLINE, 7)
    backend = BackendError("b", operation="acquire", name=None)
    assert (backend.operation, backend.name) == ("acquire", None)


def test_loss_reasons() -> None:
    assert {r.value for r in LossReason} == {"not_owner", "deadline", "max_hold", "loop_closed"}
    assert str(LossReason.NOT_OWNER) == "not_owner"
    assert f"{LossReason.DEADLINE}" == "deadline"


@pytest.mark.parametrize("cls", [Lock, Lease, LockInfo])
def test_final_classes(cls: type) -> None:
    assert getattr(cls, "__final__", False) is True


@pytest.mark.parametrize("cls", [Lock, Lease, LockInfo])
def test_classes_have_slots(cls: type) -> None:
    assert "__slots__" in vars(cls)


async def test_instances_have_no_dict() -> None:
    client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    try:
        lock = Lock(client, "public-api", ttl=5)
        assert not hasattr(lock, "__dict__")
        with pytest.raises(AttributeError):
            lock.anything = 1  # type: ignore[attr-defined]
        lease = await lock.acquire(timeout=0)
        try:
            assert not hasattr(lease, "__dict__")
            info = await lock.info()
            assert info is not None
            assert not hasattr(info, "__dict__")
        finally:
            await lease.release()
    finally:
        await client.aclose()


def test_py_typed_is_shipped() -> None:
    assert resources.files("aiolock").joinpath("py.typed").is_file()


def test_version() -> None:
    assert isinstance(aiolock.__version__, str)
    assert aiolock.__version__


def test_the_sync_face_exports_a_sorted_tuple_under_its_own_module_name() -> None:
    import aiolock.sync

    assert isinstance(aiolock.sync.__all__, tuple)
    assert list(aiolock.sync.__all__) == sorted(aiolock.sync.__all__)
    assert set(aiolock.sync.__all__) == public_names(aiolock.sync)
    for name in aiolock.sync.__all__:
        obj = getattr(aiolock.sync, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert obj.__module__ == "aiolock.sync", obj
    for cls in (aiolock.sync.Lock, aiolock.sync.Lease, aiolock.sync.Semaphore):
        assert getattr(cls, "__final__", False) is True
        assert "__slots__" in vars(cls)
