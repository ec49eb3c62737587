"""Contract suites for the ports: subclass one per adapter, define ``make``, let pytest run it.

Every adapter we ship (fakes included) passes these; an engine writing its own
Timeline or BankStore subclasses the same class to prove it behaves the same.
"""

from __future__ import annotations

import hashlib
import io
import threading
from pathlib import Path
from typing import Any

import pytest

from scratchbank.application.ports import BankStore, Timeline
from scratchbank.domain.errors import (
    BankGone,
    HostileArchive,
    InvalidRunId,
    TimelineConflict,
    TimelineUnreadable,
)
from scratchbank.domain.records import UnknownRecord
from scratchbank.testing.builders import banked, node, started

HOSTILE_IDS = ("../etc", "a/b", "", ".", "..", "a\x00b", "/abs", "x" * 200)


class TimelineContract:
    """What every Timeline does. Subclasses define ``make(self) -> Timeline``."""

    def make(self) -> Timeline:  # pragma: no cover - abstract
        raise NotImplementedError

    def test_a_new_run_reads_empty(self) -> None:
        assert tuple(self.make().read("run-new")) == ()

    def test_records_read_back_in_order_unknown_types_kept(self) -> None:
        t = self.make()
        recs = [started(), UnknownRecord(type="llm_usage", data={"n": 1}), banked(), node("a")]
        assert t.append("run-1", recs[:2]) == 2
        assert t.append("run-1", recs[2:], expected=2) == 4
        assert tuple(t.read("run-1")) == tuple(recs)
        assert tuple(t.read("run-2")) == ()

    def test_append_with_a_stale_expectation_is_a_named_conflict(self) -> None:
        t = self.make()
        t.append("run-1", [started()])
        with pytest.raises(TimelineConflict):
            t.append("run-1", [node("a")], expected=0)
        assert len(t.read("run-1")) == 1

    def test_racing_writers_exactly_one_wins(self) -> None:
        t = self.make()
        t.append("run-r", [started()])
        results: list[Any] = []
        barrier = threading.Barrier(4)

        def writer(i: int) -> None:
            barrier.wait()
            try:
                results.append(t.append("run-r", [node(f"w{i}")], expected=1))
            except TimelineConflict as error:
                results.append(error)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert sorted(r for r in results if isinstance(r, int)) == [2]
        assert sum(isinstance(r, TimelineConflict) for r in results) == 3
        assert len(t.read("run-r")) == 2

    def test_appends_without_expectation_never_lose_a_record(self) -> None:
        t = self.make()
        threads = [threading.Thread(target=lambda i=i: t.append("run-m", [node(f"n{i}")])) for i in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert len(t.read("run-m")) == 6

    def test_hostile_run_ids_are_refused(self) -> None:
        t = self.make()
        for bad in HOSTILE_IDS:
            with pytest.raises(InvalidRunId):
                t.read(bad)
            with pytest.raises(InvalidRunId):
                t.append(bad, [started()])


def _archive(tmp: Path, payload: bytes) -> tuple[Path, str]:
    path = tmp / "a.tgz"
    path.write_bytes(payload)
    return path, hashlib.sha256(payload).hexdigest()


class BankStoreContract:
    """What every BankStore that keeps banks does. Subclasses define ``make(self, tmp)``."""

    def make(self, tmp: Path) -> BankStore:  # pragma: no cover - abstract
        raise NotImplementedError

    def test_put_then_fetch_returns_the_same_bytes_and_digest(self, tmp_path: Path) -> None:
        store = self.make(tmp_path)
        payload = bytes(range(256)) * 4096 + b"tail"
        path, digest = _archive(tmp_path, payload)
        store.put("run-1", path, sha256=digest)
        out = io.BytesIO()
        got = store.fetch("run-1", out, max_bytes=1 << 30)
        assert (got.bytes, got.sha256) == (len(payload), digest)
        assert out.getvalue() == payload

    def test_put_replaces_the_previous_bank(self, tmp_path: Path) -> None:
        store = self.make(tmp_path)
        for payload in (b"first" * 100, b"second"):
            path, digest = _archive(tmp_path, payload)
            store.put("run-1", path, sha256=digest)
        out = io.BytesIO()
        store.fetch("run-1", out, max_bytes=1 << 20)
        assert out.getvalue() == b"second"

    def test_missing_bank_is_gone(self, tmp_path: Path) -> None:
        with pytest.raises(BankGone):
            self.make(tmp_path).fetch("run-none", io.BytesIO(), max_bytes=10)

    def test_delete_and_sweep_remove_the_bank_and_are_idempotent(self, tmp_path: Path) -> None:
        store = self.make(tmp_path)
        path, digest = _archive(tmp_path, b"x" * 10)
        for remove in (store.delete, store.sweep):
            store.put("run-1", path, sha256=digest)
            remove("run-1")
            remove("run-1")
            with pytest.raises(BankGone):
                store.fetch("run-1", io.BytesIO(), max_bytes=100)

    def test_runs_do_not_share_banks(self, tmp_path: Path) -> None:
        store = self.make(tmp_path)
        path, digest = _archive(tmp_path, b"mine")
        store.put("run-a", path, sha256=digest)
        store.sweep("run-b")
        with pytest.raises(BankGone):
            store.fetch("run-b", io.BytesIO(), max_bytes=100)
        store.fetch("run-a", io.BytesIO(), max_bytes=100)

    def test_fetch_past_the_cap_is_refused(self, tmp_path: Path) -> None:
        store = self.make(tmp_path)
        path, digest = _archive(tmp_path, b"z" * 5000)
        store.put("run-1", path, sha256=digest)
        with pytest.raises(HostileArchive):
            store.fetch("run-1", io.BytesIO(), max_bytes=4999)

    def test_hostile_run_ids_are_refused(self, tmp_path: Path) -> None:
        store = self.make(tmp_path)
        path, digest = _archive(tmp_path, b"x")
        for bad in HOSTILE_IDS:
            with pytest.raises(InvalidRunId):
                store.put(bad, path, sha256=digest)
            with pytest.raises(InvalidRunId):
                store.fetch(bad, io.BytesIO(), max_bytes=10)


__all__ = ["BankStoreContract", "TimelineContract", "TimelineUnreadable"]
