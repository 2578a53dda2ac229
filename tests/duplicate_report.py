"""Code written twice, as pylint's duplicate-code check (R0801) finds it, for `aiolock/` and
for `tests/` separately.

    python -m tests.duplicate_report                     # pylint found on PATH
    python -m tests.duplicate_report --pylint PATH       # that pylint executable
    python -m tests.duplicate_report --min-lines 4       # a finer grain than the default 8
    python -m tests.duplicate_report --list              # each block's copies as well

pylint is not one of the project's dependencies: install it in an environment of its own,
for instance `python3.11 -m venv /tmp/venv-pylint && /tmp/venv-pylint/bin/pip install pylint`,
and pass `--pylint /tmp/venv-pylint/bin/pylint`. Only its similarity checker runs (no
other message, no import of the code).

The settings, printed with the figures: `--min-similarity-lines=8` (unless `--min-lines`),
imports, signatures and Python comments ignored; docstrings are NOT ignored, because
pylint takes any line that starts with three quotes for a docstring's start and would skip
the Lua of `aiolock/_lua` (module constants whose text starts on such a line). Lua
comments (`--`) count as code.

A block is one R0801 message: a stretch of at least that many lines (once the ignored
ones are dropped) found in two or more files. Its duplicated lines are the lines of the
stretch as pylint prints it (from the first file named) times the copies beyond the first:
what writing it once would remove.
"""

# ruff: noqa: T201  (a command whose output is its figures)
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("aiolock", "tests")
MIN_LINES = 8

_COPY = re.compile(r"^==(?P<module>[\w.]+):\[(?P<start>\d+):(?P<end>\d+)\]$")


def settings(min_lines: int) -> list[str]:
    """pylint's arguments: its duplicate-code check alone, with these settings."""
    return [
        "--disable=all",
        "--enable=duplicate-code",
        f"--min-similarity-lines={min_lines}",
        "--ignore-comments=y",
        "--ignore-docstrings=n",
        "--ignore-imports=y",
        "--ignore-signatures=y",
    ]


@dataclasses.dataclass(frozen=True, slots=True)
class Block:
    """One stretch found in several files: each copy as (module, first line, end line)."""

    copies: tuple[tuple[str, int, int], ...]

    @property
    def duplicated_lines(self) -> int:
        """The first copy's lines times the copies beyond the first."""
        _, start, end = self.copies[0]
        return (end - start) * (len(self.copies) - 1)


def blocks(messages: Sequence[dict[str, object]]) -> list[Block]:
    """The blocks of pylint's JSON messages (those of R0801; others are ignored)."""
    found = []
    for message in messages:
        if message.get("message-id") != "R0801":
            continue
        copies = []
        for line in str(message["message"]).splitlines():
            matched = _COPY.match(line.strip())
            if matched:
                copies.append((matched["module"], int(matched["start"]), int(matched["end"])))
        if len(copies) >= 2:
            found.append(Block(tuple(copies)))
    return found


def run_pylint(pylint: str, target: str, min_lines: int) -> list[Block]:
    """pylint's duplicate-code check on `target` (a folder of the repository)."""
    done = subprocess.run(
        [pylint, *settings(min_lines), "--persistent=n", "--output-format=json", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    # pylint's exit status is a bit mask of the kinds of messages emitted; 1 (fatal) and 32
    # (usage error) mean it did not check the code.
    if done.returncode & (1 | 32) or not done.stdout.strip():
        raise SystemExit(f"pylint failed on {target}/: {done.stderr.strip() or done.stdout}")
    return blocks(json.loads(done.stdout))


def _version(pylint: str) -> str:
    done = subprocess.run([pylint, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.splitlines()[0] if done.stdout else "pylint"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.duplicate_report", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--pylint", help="the pylint executable (default: pylint on PATH)")
    parser.add_argument(
        "--min-lines", type=int, default=MIN_LINES, help="pylint's --min-similarity-lines"
    )
    parser.add_argument("--list", action="store_true", help="each block's copies as well")
    args = parser.parse_args(argv)
    if args.min_lines < 1:
        parser.error(f"--min-lines must be 1 or more, got {args.min_lines}")
    pylint = args.pylint or shutil.which("pylint")
    if pylint is None:
        parser.error("pylint not found: install it (see this module's docstring) or pass --pylint")
    print(f"{_version(pylint)}, duplicate-code (R0801): {' '.join(settings(args.min_lines)[2:])}")
    for target in TARGETS:
        found = run_pylint(pylint, target, args.min_lines)
        lines = sum(block.duplicated_lines for block in found)
        print(f"{target + '/':<9} {len(found):>3} duplicate blocks, {lines:>4} duplicated lines")
        if args.list:
            for block in found:
                copies = ", ".join(f"{m}:{start + 1}-{end}" for m, start, end in block.copies)
                print(f"    {block.duplicated_lines:>4}  {copies}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
