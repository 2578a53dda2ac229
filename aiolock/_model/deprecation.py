"""Deprecated names: the one warning they give (docs/versioning.md, "How deprecation works").

A deprecated name keeps working until the release `REMOVED_IN`, and each use warns with a
`DeprecationWarning` that names its replacement and that release.
"""

from __future__ import annotations

import warnings
from typing import TypeVar

__all__ = ("REMOVED_IN", "renamed_argument", "warn_renamed")

T = TypeVar("T")

REMOVED_IN = "0.2"
"""The release that removes the names deprecated in this one."""


def warn_renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that `old` is deprecated: it was renamed `new`, with the same meaning. The
    default `stacklevel` points at the code calling the function or property that calls
    this one."""
    warnings.warn(
        f"{old} is deprecated and will be removed in aiolock {REMOVED_IN}: use {new}, its new name",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def renamed_argument(
    call: str, given: T | None, old_given: T | None, *, new: str, old: str = "term"
) -> T:
    """The argument `new=` of `call`, or `old=`, its deprecated old name (which warns);
    exactly one of the two is required (a `TypeError` naming them otherwise)."""
    if old_given is None:
        if given is None:
            raise TypeError(f"{call}() missing required keyword argument: {new!r}")
        return given
    if given is not None:
        raise TypeError(f"{call}() takes {new}= or its deprecated old name {old}=, not both")
    warn_renamed(f"{call}({old}=...)", f"{call}({new}=...)", stacklevel=4)
    return old_given
