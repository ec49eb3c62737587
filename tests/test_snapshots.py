"""Snapshots of the fold on the event store: same decisions, faster on long histories."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from rigs.long_timelines import long_run

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.application.resume import SNAPSHOT_EVERY, current_state
from scratchbank.domain import fold


def test_a_corrupt_snapshot_is_ignored_not_trusted(tmp_path: Path) -> None:
    timeline = long_run(tmp_path, SNAPSHOT_EVERY + 5)
    current_state(timeline, "run-1", snapshots=timeline)
    with sqlite3.connect(tmp_path / "t.db") as db:
        tables = [r[0] for r in db.execute("select name from sqlite_master where type='table'")]
        (snaps,) = [t for t in tables if "snapshot" in t]
        db.execute(f"update {snaps} set state = ?", (b'{"v": 1, "records": "x"}',))
    fresh = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db")  # the appender decides from its own fold
    assert current_state(fresh, "run-1", snapshots=fresh) == fold(timeline.read("run-1"))
