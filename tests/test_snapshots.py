"""Snapshots of the fold on the event store: same decisions, faster on long histories."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from scratchbank.adapters.event_store import PAGE, EventStoreTimeline
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.bank_objects import prune, reconcile_before_resume
from scratchbank.application.recording import Claim
from scratchbank.application.resume import SNAPSHOT_EVERY, check_resume, current_state
from scratchbank.application.teardown import Budgets, _Checked, _first_read, _replan, bank_at_teardown
from scratchbank.domain import ResumeRequest, fold
from scratchbank.domain.objects import BankStamp, digest_of, object_name, reconcile, reconciled
from scratchbank.domain.records import Record, ScratchBanked
from scratchbank.testing.builders import banked, node, resumed, started
from scratchbank.testing.clocks import ManualClock


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
    fresh = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db")  # the appender decides from its own fold
    assert current_state(fresh, "run-1", snapshots=fresh) == fold(timeline.read("run-1"))


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
    timeline = EventStoreTimeline(url, snapshot_every=10 * PAGE)  # not the appender: no fold of its own
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
    assert EventStoreTimeline(url).load_snapshot("run-1") is None  # none saved in the store
    second = EventStoreTimeline(url)  # another process: it never saw the run's records
    second.append("run-1", [node("measure", "agent")] * 20)
    snap = EventStoreTimeline(url).load_snapshot("run-1")  # the one saved in the store
    assert snap is not None and snap[0] == SNAPSHOT_EVERY + 12
    assert current_state(EventStoreTimeline(url), "run-1", snapshots=second) == fold(second.read("run-1"))


# -- N3's reconcile and the teardown's plan decide from the snapshot + tail (issue 26) -------


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


def test_N3_the_reconcile_reads_the_snapshot_and_the_tail_only(tmp_path: Path) -> None:
    """N3 on a long run with a snapshot: records read <= the tail + a constant, same outcome."""
    timeline, store, old, new = long_run_with_tail(tmp_path)
    done = reconcile_before_resume(store, timeline, "run-1", ManualClock(), 30.0, snapshots=timeline)
    assert timeline.handed <= TAIL + 2
    assert done is not None and done.found.record is not None and done.found.record.name == new
    assert done.found.unproven == () and old not in {o.name for o in done.found.others}
    records = timeline.read("run-1")
    assert isinstance(records[-1], ScratchBanked) and records[-1].object == new
    assert done.version == len(records)


def test_N3_the_reconcile_from_a_snapshot_sorts_as_from_the_whole_run(tmp_path: Path) -> None:
    """The fold's named objects (snapshot + tail) sort a listing as the whole timeline does."""
    timeline, store, _, _ = long_run_with_tail(tmp_path)
    records = timeline.read("run-1")
    state = current_state(timeline, "run-1", snapshots=timeline)
    assert state == fold(records)
    assert reconciled(state, store.objects("run-1")) == reconcile(
        fold(records), records, store.objects("run-1")
    )


def test_T1_the_teardowns_plan_reads_the_snapshot_and_the_tail_only(tmp_path: Path) -> None:
    """The teardown's plan on a long run with a snapshot: records read <= tail + a constant."""
    timeline, _, _, _ = long_run_with_tail(tmp_path)
    notes: list[str] = []
    first = _first_read(timeline, "run-1", None, Budgets(), ManualClock(), notes, snapshots=timeline)
    assert timeline.handed <= TAIL + 2
    records = timeline.read("run-1")
    assert first.state == fold(records) and first.claim is not None
    assert first.claim.position == len(records) and notes == []
    assert first.mine is not None and first.mine.label == f"@{len(records) - TAIL}"


def test_A18_a_teardown_of_an_older_execution_is_still_superseded_from_the_snapshot(tmp_path: Path) -> None:
    """Naming an execution that is not the latest: superseded by the newer one, as before."""
    timeline, _, _, _ = long_run_with_tail(tmp_path)
    first = _first_read(timeline, "run-1", "@0", Budgets(), ManualClock(), [], snapshots=timeline)
    whole = _first_read(timeline, "run-1", "@0", Budgets(), ManualClock(), [])
    assert first.why_not == whole.why_not != ""
    missing = _first_read(timeline, "run-1", "nobody", Budgets(), ManualClock(), [], snapshots=timeline)
    assert "no execution" in missing.why_not


# -- the teardown's later reads: the check, the replan, the prune (issue 26) -----------------


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


def test_A18_the_check_before_each_store_write_reads_the_tail_only(tmp_path: Path) -> None:
    """_Checked.lost on a long run: the records after the claim only; it still sees a newer execution."""
    timeline, _, _, _ = long_run_refusing_whole_reads(tmp_path)
    first = _first_read(timeline, "run-1", None, Budgets(), ManualClock(), [], snapshots=timeline)
    checked = _Checked(timeline, "run-1", first.claim, first.mine, None, snapshots=timeline)
    timeline.handed = 0
    assert checked.lost() == "" and timeline.handed == 0
    timeline.append("run-1", [node("late", "tool"), resumed()])
    lost = checked.lost()
    assert timeline.handed == 2
    timeline.strict = False
    whole = _Checked(timeline, "run-1", first.claim, first.mine, None)
    assert lost == whole.lost() and "superseded: execution @" in lost


def test_T8_a_conflict_is_planned_again_on_the_snapshot_and_the_tail(tmp_path: Path) -> None:
    """_replan after a conflict: snapshot + tail, and the claim it plans at is the run's length."""
    timeline, _, _, _ = long_run_refusing_whole_reads(tmp_path)
    first = _first_read(timeline, "run-1", None, Budgets(), ManualClock(), [], snapshots=timeline)
    assert first.claim is not None
    checked = _Checked(timeline, "run-1", first.claim, first.mine, None, snapshots=timeline)
    timeline.append("run-1", [node("late", "tool")])
    timeline.handed = 0
    claim, lost = _replan(timeline, first.claim, FakeSandbox({"f": b"x"}), False, checked)
    assert lost == "" and claim == Claim("run-1", first.claim.position + 1)
    assert timeline.handed <= 2 * (TAIL + 2)


def test_A17_the_prune_after_a_record_reads_the_snapshot_and_the_tail(tmp_path: Path) -> None:
    """prune on a long run: the old bank a record before the snapshot named goes, no whole read."""
    timeline, store, old, new = long_run_refusing_whole_reads(tmp_path)
    record = attrs.evolve(banked(sha256=digest_of(new)), object=new)
    length = timeline.append("run-1", [record])
    timeline.handed = 0
    notes: list[str] = []
    gone = prune(store, timeline, Claim("run-1", length), ManualClock(), notes, snapshots=timeline)
    assert timeline.handed <= TAIL + 2 and notes == []
    assert gone == (old,) and {o.name for o in store.objects("run-1")} == {new}


def test_T1_a_whole_teardown_on_a_long_run_never_reads_it_whole(tmp_path: Path) -> None:
    """bank_at_teardown on a run with a snapshot: plan, checks, record and prune on snapshot + tail."""
    timeline, store, _, _ = long_run_refusing_whole_reads(tmp_path)
    report = bank_at_teardown(
        "run-1",
        timeline=timeline,
        store=store,
        sandbox=FakeSandbox({"f": b"the scratch"}),
        run_finished=False,
        clock=ManualClock(),
        snapshots=timeline,
    )
    assert report.recorded, report.notes
    assert timeline.handed <= 4 * (TAIL + 4)


def test_R2_a_run_this_process_appends_is_decided_from_its_own_fold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The appender's fold stands for the snapshot: no snapshot query, only the tail others appended."""
    url = f"sqlite:///{tmp_path}/t.db"
    mine, other = EventStoreTimeline(url), EventStoreTimeline(url)
    mine.append("run-1", [started(), banked(), *(node(f"h{i}", "human") for i in range(10))])
    other.append("run-1", [node("late", "tool")], expected=12)  # another process appended since
    asked: list[str] = []
    select = mine._snapshots.select_events
    monkeypatch.setattr(
        mine._snapshots, "select_events", lambda *a, **k: asked.append("snap") or select(*a, **k)
    )
    before = mine.records_read
    state = current_state(mine, "run-1", snapshots=mine)
    assert asked == [] and mine.records_read - before == 1
    assert state == fold(other.read("run-1")) == current_state(other, "run-1", snapshots=other)
