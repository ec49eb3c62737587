"""Long timelines for snapshots: appended in batches, counted reads, a timeline that refuses whole
reads.

First written for tests/test_snapshots.py: Snapshots of the fold on the event store: same decisions,
faster on long histories."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.application.resume import current_state
from scratchbank.domain.objects import BankStamp, object_name
from scratchbank.domain.records import Record
from scratchbank.testing.builders import banked, node, resumed, started


def long_run(tmp_path: Path, n: int) -> EventStoreTimeline:
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db")
    timeline.append("run-1", [started(), banked()])
    timeline.append("run-1", [node(f"h{i}", "human") for i in range(n)])
    return timeline


def appended_in_batches(url: str, n: int, batch: int = 100) -> EventStoreTimeline:
    """A run of ``n`` + 2 records appended through the port as an engine would, in batches."""
    timeline = EventStoreTimeline(url)
    timeline.append("run-1", [started(), banked()])
    for first in range(0, n, batch):
        timeline.append("run-1", [node(f"h{i}", "human") for i in range(first, min(n, first + batch))])
    return timeline


class CountingTimeline(InMemoryTimeline):
    """A timeline and snapshot store in memory that counts every record it hands out."""

    def __init__(self) -> None:
        super().__init__()
        self.handed = 0
        self.snaps: dict[str, tuple[int, dict[str, Any]]] = {}

    def read(self, run_id: str) -> Sequence[Record]:
        records = super().read(run_id)
        self.handed += len(records)
        return records

    def read_after(self, run_id: str, position: int) -> Iterable[Record]:
        tail = tuple(super().read(run_id))[position:]
        self.handed += len(tail)
        return tail

    def load_snapshot(self, run_id: str) -> tuple[int, dict[str, Any]] | None:
        return self.snaps.get(run_id)

    def save_snapshot(self, run_id: str, position: int, data: dict[str, Any]) -> None:
        self.snaps[run_id] = (position, data)


def archive(tmp_path: Path, content: bytes) -> tuple[Path, str]:
    path = tmp_path / hashlib.sha256(content).hexdigest()
    path.write_bytes(content)
    return path, path.name


TAIL = 6  # a resume and five finishes after the snapshot


def long_run_with_tail(
    tmp_path: Path, timeline: CountingTimeline | None = None
) -> tuple[CountingTimeline, InMemoryBankStore, str, str]:
    """3,000 records with a snapshot, then a tail: a resumed execution whose teardown put an
    object it never recorded (N3 records it); an older object a record before the snapshot
    names, kept without a stamp (N3 must know the record names it, or refuse it unproven)."""
    timeline, store = timeline or CountingTimeline(), InMemoryBankStore()
    old_path, old = archive(tmp_path, b"the old bank")
    timeline.append("run-1", [started(), attrs.evolve(banked(sha256=old), object=object_name(old))])
    timeline.append("run-1", [node(f"h{i}", "human") for i in range(3000)])
    store.put("run-1", old_path, sha256=old)  # no stamp: only the fold's names know it
    current_state(timeline, "run-1", snapshots=timeline)  # a decision saved the snapshot
    assert timeline.load_snapshot("run-1") is not None
    resumed_at = len(timeline.read("run-1"))
    timeline.append("run-1", [resumed(), *(node(f"t{i}", "tool") for i in range(TAIL - 1))])
    new_path, new = archive(tmp_path, b"the new bank, never recorded")
    stamp = BankStamp("run-1", f"@{resumed_at}", new_path.stat().st_size, new)
    store.put("run-1", new_path, sha256=new, stamp=stamp)
    timeline.handed = 0
    return timeline, store, object_name(old), object_name(new)


class NoWholeRead(CountingTimeline):
    """A CountingTimeline that refuses to hand out a run read whole once it has a snapshot."""

    strict = False

    def read(self, run_id: str) -> Sequence[Record]:
        assert not (self.strict and run_id in self.snaps), "a decision read a run with a snapshot whole"
        return super().read(run_id)


def long_run_refusing_whole_reads(tmp_path: Path) -> tuple[NoWholeRead, InMemoryBankStore, str, str]:
    timeline, store, old, new = long_run_with_tail(tmp_path, NoWholeRead())
    assert isinstance(timeline, NoWholeRead)
    timeline.strict = True
    return timeline, store, old, new
