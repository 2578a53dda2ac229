"""A griffe extension for the API reference: a parameter whose default is a module constant
(`retain: float = RETAIN_DEFAULT`) is shown with the constant's value (`retain: float =
10.0`), which is what a reader needs; the constant's name says nothing outside the module.

Only plain upper-case names bound to a number, a string, a bool or None are replaced;
anything else (an enum member, a call) is shown as written. Used by mkdocs.yml.
"""

from __future__ import annotations

import importlib
from typing import Any

import griffe

_SIMPLE = (bool, int, float, str, type(None))


class DefaultsAsValues(griffe.Extension):
    """Replace constant names in parameter defaults by their values."""

    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        try:
            module = importlib.import_module(func.module.path)
        except ImportError:
            return
        for parameter in func.parameters:
            default = parameter.default
            name = default.name if isinstance(default, griffe.ExprName) else default
            if not isinstance(name, str) or not name.isidentifier() or not name.isupper():
                continue
            value = getattr(module, name, parameter)
            if isinstance(value, _SIMPLE):
                parameter.default = repr(value)
