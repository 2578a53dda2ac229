"""`Leader.fencing_token`, the one name of an election term's number, and `term`, its old
name, kept as a deprecated alias until 0.2 (docs/versioning.md): it warns, naming the new
name and that release, and gives the same number. No server."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from aiolock import Leader

FIELDS = {"name": "jobs", "identity": "host-a:1234", "since": 1765000000.5, "value": "x"}


def leader(token: int = 42) -> Leader:
    return Leader(
        name="jobs", identity="host-a:1234", fencing_token=token, since=1765000000.5, value="x"
    )


def test_fencing_token_is_the_field_and_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = leader(42)
        assert new.fencing_token == 42
        assert dataclasses.asdict(new) == {**FIELDS, "fencing_token": 42}
        assert "fencing_token=42" in repr(new)
        assert dataclasses.replace(new, value=None).fencing_token == 42


def test_the_term_attribute_warns_and_gives_the_fencing_token() -> None:
    new = leader(42)
    with pytest.warns(DeprecationWarning, match="Leader.term") as caught:
        term = new.term
    assert term == new.fencing_token == 42
    (warning,) = caught
    message = str(warning.message)
    assert "Leader.term" in message and "Leader.fencing_token" in message, message
    assert "removed in aiolock 0.2" in message, message
    assert warning.filename == __file__  # it points at the code that used the old name


def test_the_term_argument_warns_and_builds_the_same_leader() -> None:
    with pytest.warns(DeprecationWarning, match=r"Leader\(term=\.\.\.\).*0\.2.*fencing_token"):
        old = Leader(name="jobs", identity="host-a:1234", term=42, since=1765000000.5, value="x")
    assert old == leader(42)
    assert old.fencing_token == 42


def test_the_constructor_takes_exactly_one_of_the_two_names() -> None:
    with pytest.raises(TypeError, match="fencing_token= or its deprecated old name term="):
        Leader(fencing_token=1, term=1, **FIELDS)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="missing required keyword argument: 'fencing_token'"):
        Leader(**FIELDS)  # type: ignore[call-overload]


def test_recorded_takes_term_as_the_deprecated_name_of_announced() -> None:
    fields = {"identity": "host-a:1234", "since_ms": "1765000000500", "value": "=x"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = Leader.recorded("jobs", held=True, fence="42", announced="42", **fields)
    assert new == leader(42)
    with pytest.warns(
        DeprecationWarning, match=r"Leader\.recorded\(term=\.\.\.\).*0\.2.*announced"
    ):
        old = Leader.recorded("jobs", held=True, fence="42", term="42", **fields)
    assert old == new
