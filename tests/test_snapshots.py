"""Snapshots of the fold on the event store: same decisions, faster on long histories."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from scratchbank.adapters.event_store import PAGE, EventStoreTimeline
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


def appended_in_batches(url: str, n: int, batch: int = 100) -> EventStoreTimeline:
    """A run of ``n`` + 2 records appended through the port as an engine would, in batches."""
    timeline = EventStoreTimeline(url)
    timeline.append("run-1", [started(), banked()])
    for first in range(0, n, batch):
        timeline.append("run-1", [node(f"h{i}", "human") for i in range(first, min(n, first + batch))])
    return timeline


def test_R2_a_cold_first_decision_reads_one_snapshot_interval_at_most(tmp_path: Path) -> None:
    """Appends through the port leave snapshots: a fresh process folds < one interval + a batch."""
    url = f"sqlite:///{tmp_path}/t.db"
    writer = appended_in_batches(url, 5 * SNAPSHOT_EVERY + 17)
    whole = fold(writer.read("run-1"))
    cold = EventStoreTimeline(url)  # a fresh process: nothing in memory, no decision made yet
    state = current_state(cold, "run-1", snapshots=cold)
    assert state == whole
    assert cold.records_read <= SNAPSHOT_EVERY + 100
    decision = check_resume(cold, "run-1", ResumeRequest(), snapshots=cold)
    assert decision == check_resume(writer, "run-1", ResumeRequest())


def test_R2_the_fold_streams_pages_where_no_snapshot_exists_yet(tmp_path: Path) -> None:
    """No snapshot: the decision folds the store's pages one at a time, never the whole run."""
    url = f"sqlite:///{tmp_path}/t.db"
    timeline = EventStoreTimeline(url, snapshot_every=10 * PAGE)
    timeline.append("run-1", [started(), banked()])
    timeline.append("run-1", [node(f"h{i}", "human") for i in range(3 * PAGE)])
    assert timeline.load_snapshot("run-1") is None
    pages: list[int] = []
    select = timeline._select

    def counted(*args: Any, **kwargs: Any) -> Any:
        page = select(*args, **kwargs)
        pages.append(len(page))
        return page

    timeline._select = counted
    state = current_state(timeline, "run-1", snapshots=timeline)
    assert state == fold(EventStoreTimeline(url).read("run-1"))
    assert sum(pages) == 3 * PAGE + 2 and max(pages) <= PAGE


def test_R2_an_appender_that_did_not_follow_the_run_still_snapshots_it_right(tmp_path: Path) -> None:
    """A second process's append past the interval folds from the store, and saves the truth."""
    url = f"sqlite:///{tmp_path}/t.db"
    first = EventStoreTimeline(url)
    first.append("run-1", [started(), banked()])
    first.append("run-1", [node(f"h{i}", "human") for i in range(SNAPSHOT_EVERY - 10)])
    assert first.load_snapshot("run-1") is None
    second = EventStoreTimeline(url)  # another process: it never saw the run's records
    second.append("run-1", [node("measure", "agent")] * 20)
    snap = second.load_snapshot("run-1")
    assert snap is not None and snap[0] == SNAPSHOT_EVERY + 12
    assert current_state(EventStoreTimeline(url), "run-1", snapshots=second) == fold(second.read("run-1"))
