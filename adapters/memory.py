"""In-memory adapters: real implementations of the ports, for tests and for engines' tests.

They pass the same contract suites as the persistent adapters, so an engine team
can test its integration against them and trust the behaviour carries over.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from scratchbank.domain.errors import TimelineConflict
from scratchbank.domain.records import Record
from scratchbank.domain.runs import check_run_id


class InMemoryTimeline:
    """A Timeline kept in a dict; appends are atomic under a lock."""

    def __init__(self) -> None:
        self._runs: dict[str, list[Record]] = {}
        self._lock = threading.Lock()

    def read(self, run_id: str) -> Sequence[Record]:
        check_run_id(run_id)
        with self._lock:
            return tuple(self._runs.get(run_id, ()))

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        check_run_id(run_id)
        with self._lock:
            current = self._runs.setdefault(run_id, [])
            if expected is not None and len(current) != expected:
                raise TimelineConflict(f"run {run_id}: expected {expected} records, found {len(current)}")
            current.extend(records)
            return len(current)
