"""In-memory adapters: real implementations of the ports, for tests and for engines' tests.

They pass the same contract suites as the persistent adapters, so an engine team
can test its integration against them and trust the behaviour carries over.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from scratchbank.application.ports import StoredBank
from scratchbank.domain.errors import BankGone, BankWriteFailed, HostileArchive, TimelineConflict
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


class InMemoryBankStore:
    """A BankStore in a dict. ``keeps_banks=False`` models a store that keeps none (T20)."""

    def __init__(self, *, keeps_banks: bool = True) -> None:
        self.keeps_banks = keeps_banks
        self.banks: dict[str, bytes] = {}
        self.puts = 0

    def put(self, run_id: str, archive: Path, *, sha256: str) -> None:
        check_run_id(run_id)
        if not self.keeps_banks:
            raise BankWriteFailed("this store keeps no bank")
        self.banks[run_id] = archive.read_bytes()
        self.puts += 1

    def fetch(self, run_id: str, dest: BinaryIO, *, max_bytes: int) -> StoredBank:
        check_run_id(run_id)
        data = self.banks.get(run_id)
        if data is None:
            raise BankGone(f"no bank for run {run_id}")
        if len(data) > max_bytes:
            raise HostileArchive(f"bank for {run_id} is over {max_bytes} bytes")
        dest.write(data)
        return StoredBank(len(data), hashlib.sha256(data).hexdigest())

    def delete(self, run_id: str) -> None:
        self.banks.pop(check_run_id(run_id), None)

    def sweep(self, run_id: str) -> None:
        self.delete(run_id)
