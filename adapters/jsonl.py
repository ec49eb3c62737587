"""Timelines as JSON Lines files: one wire record per line (the `explain` command's input).

Blank lines are skipped; every other line must be a JSON object. Errors name the
line, and the whole file is refused on the first bad line (R15): a decision is
never made on part of a timeline.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import attrs

from scratchbank.domain.errors import TimelineUnreadable
from scratchbank.domain.records import Record
from scratchbank.domain.wire import decode, encode


@attrs.frozen
class TimelineFile:
    """The records of a JSONL timeline, with the line each came from."""

    records: tuple[Record, ...]
    lines: tuple[int, ...]

    def line_of(self, position: int) -> int:
        return self.lines[position]


def read_timeline_file(path: str | Path) -> TimelineFile:
    """Read and decode a JSONL timeline, or raise TimelineUnreadable naming the line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TimelineUnreadable(f"cannot read {path}: {error}") from error
    records: list[Record] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        obj = _parse(line, number)
        try:
            records.append(decode(obj))
        except TimelineUnreadable as error:
            raise TimelineUnreadable(error.message, line=number) from None
        except RecursionError:
            raise TimelineUnreadable("nested too deeply to be a record", line=number) from None
        lines.append(number)
    return TimelineFile(tuple(records), tuple(lines))


def _parse(line: str, number: int) -> object:
    """One line as JSON; nesting too deep or a number too long is named, not a traceback."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise TimelineUnreadable(f"not JSON ({error.msg})", line=number) from None
    except RecursionError:
        raise TimelineUnreadable("not JSON this reader accepts (nested too deeply)", line=number) from None
    except ValueError as error:  # e.g. an integer past Python's digit limit
        raise TimelineUnreadable(f"not JSON this reader accepts ({error})", line=number) from None


def write_timeline_file(path: str | Path, records: Sequence[Record]) -> None:
    """Write records as JSONL (used by examples and tests)."""
    body = "".join(json.dumps(encode(r), sort_keys=True) + "\n" for r in records)
    Path(path).write_text(body, encoding="utf-8")
