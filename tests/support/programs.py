"""What the suite's own programs share: the child processes its tests start
(`tests.faults.holder`, `tests.faults.permits`, `tests.usage.fenced_holder`,
`tests.usage.sigterm_holder`, `tests.integration.sync_child`).

- `parser(description)`: their argument parser, with the server (`--url`) and the name
  (`--name`) every one of them takes, both required;
- `emit(event, **fields)`: what they tell their test, one JSON line on standard output
  (`{"event": event, **fields}`), flushed at once.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ("emit", "parser")


def parser(description: str | None = None) -> argparse.ArgumentParser:
    """An argument parser with `--url` and `--name`, both required."""
    made = argparse.ArgumentParser(description=description)
    made.add_argument("--url", required=True, help="the server, redis://host:port")
    made.add_argument("--name", required=True, help="the name of the lock (or primitive)")
    return made


def emit(event: str, **fields: object) -> None:
    """One line of JSON on standard output, `{"event": event, **fields}`, flushed."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()
