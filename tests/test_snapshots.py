"""Snapshots of the fold on the event store: same decisions, faster on long histories."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.application.resume import SNAPSHOT_EVERY, check_resume, current_state
from scratchbank.domain import ResumeRequest, fold
from scratchbank.testing.builders import banked, node, started


def long_run(tmp_path: Path, n: int) -> EventStoreTimeline:
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db")
    timeline.append("run-1", [started(), banked()])
    timeline.append("run-1", [node(f"h{i}", "human") for i in range(n)])
    return timeline


def test_R2_snapshot_then_tail_decides_as_the_whole_timeline(tmp_path: Path) -> None:
    timeline = long_run(tmp_path, SNAPSHOT_EVERY + 5)
    whole = fold(timeline.read("run-1"))
    first = current_state(timeline, "run-1", snapshots=timeline)  # folds and saves a snapshot
    assert first == whole and timeline.load_snapshot("run-1") is not None
    timeline.append("run-1", [node("measure", "agent")])
    via_snapshot = check_resume(timeline, "run-1", ResumeRequest(), snapshots=timeline)
    plain = check_resume(timeline, "run-1", ResumeRequest())
    assert via_snapshot == plain and via_snapshot.code == "SCRATCH_NOT_PORTABLE"
    assert [e.position for e in via_snapshot.evidence] == [1, SNAPSHOT_EVERY + 7]


def test_a_corrupt_snapshot_is_ignored_not_trusted(tmp_path: Path) -> None:
    timeline = long_run(tmp_path, SNAPSHOT_EVERY + 5)
    current_state(timeline, "run-1", snapshots=timeline)
    with sqlite3.connect(tmp_path / "t.db") as db:
        tables = [r[0] for r in db.execute("select name from sqlite_master where type='table'")]
        (snaps,) = [t for t in tables if "snapshot" in t]
        db.execute(f"update {snaps} set state = ?", (b'{"v": 1, "records": "x"}',))
    assert current_state(timeline, "run-1", snapshots=timeline) == fold(timeline.read("run-1"))
