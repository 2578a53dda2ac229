"""`WeakSlot`: an object made on demand and referred to weakly, so that an owner can hand out
the same object while it is in use without keeping it (an object that refers back to its
owner, kept by it, would make a reference cycle, left to the garbage collector)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ("WeakSlot",)

O = TypeVar("O")
T = TypeVar("T")


class WeakSlot(Generic[T]):
    """One object, made by `get` when none is alive, the same one while it is."""

    __slots__ = ("_ref",)

    def __init__(self) -> None:
        self._ref: weakref.ref[T] | None = None

    def get(self, make: Callable[[O], T], owner: O) -> T:
        """The object alive in the slot, or a new one, `make(owner)`."""
        found = None if self._ref is None else self._ref()
        if found is None:
            found = make(owner)
            self._ref = weakref.ref(found)
        return found
