"""A mkdocs hook: under `--strict`, every warning is counted, `--quiet` or not.

`mkdocs build --quiet` raises the `mkdocs` logger's level to ERROR, so warnings (a broken
link or anchor, a docstring griffe cannot parse) are never logged, and `--strict`, which
counts logged warnings, never sees them: the build passes. With this hook a strict build
logs warnings again (errors and warnings only, still no INFO lines) and fails on them.
Used by mkdocs.yml.
"""

from __future__ import annotations

import logging
from typing import Any


def on_config(config: Any) -> None:
    if config.strict:
        logger = logging.getLogger("mkdocs")
        if logger.getEffectiveLevel() > logging.WARNING:
            logger.setLevel(logging.WARNING)
