"""Issue 26: load without lies. A report says ``recorded`` only for a record known to have
landed; a busy timeline waits for a call slot and is never read as unreadable (R15)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.present import outcome_data, outcome_text
from scratchbank.application.cancellation import Cancel, Deadline, calls_within
from scratchbank.application.recording import RETRYABLE, Claim, append_at
from scratchbank.application.resume import Target, check_resume, resume
from scratchbank.application.retry import Budget
from scratchbank.application.service import ScratchService
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import ResumeRequest
from scratchbank.domain.errors import TimelineBusy, TimelineWriteFailed
from scratchbank.domain.records import Record, ScratchBanked, ScratchRestored
from scratchbank.testing.builders import node, started
from scratchbank.testing.clocks import ManualClock

FILES = {"verify.sh": b"#!/bin/sh\n", "clone/README": b"docs"}


class RestoreRecordFails(InMemoryTimeline):
    """Every append of a ``scratch_restored`` fails; ``lands`` says whether it landed anyway
    (a reply lost on the way back) or not at all (a lost append)."""

    def __init__(self, *, lands: bool) -> None:
        super().__init__()
        self.lands = lands

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        if any(isinstance(r, ScratchRestored) for r in records):
            if self.lands:
                super().append(run_id, records, expected=expected)
            raise TimelineWriteFailed("the store went away (injected)")
        return super().append(run_id, records, expected=expected)


def parked(timeline: InMemoryTimeline) -> InMemoryBankStore:
    store = InMemoryBankStore()
    timeline.append("run-1", [started(), node("clone", "tool")])
    report = bank_at_teardown(
        "run-1", timeline=timeline, store=store, sandbox=FakeSandbox(dict(FILES)), run_finished=False
    )
    assert report.recorded
    return store


def restored_records(timeline: InMemoryTimeline) -> list[Record]:
    return [r for r in timeline.read("run-1") if isinstance(r, ScratchRestored)]


def test_X7_a_lost_restore_record_is_reported_as_not_recorded() -> None:
    """A best-effort restore record that never landed: the report and its data say so."""
    timeline = RestoreRecordFails(lands=False)
    store = parked(timeline)
    box = FakeSandbox({})
    out = resume("run-1", ResumeRequest(), timeline=timeline, store=store, sandbox=box, clock=ManualClock())
    assert out.restore is not None and out.restore.record.restored and not out.restore.must_record
    assert restored_records(timeline) == []
    assert not out.recorded
    assert out.proceeds and box.files == FILES  # X7 as it was: that record decides nothing
    data = outcome_data(out)
    assert data["restore"]["recorded"] is False and data["proceeds"] is True
    assert any("not written" in line for line in outcome_text(out))


def test_X7_a_restore_record_that_landed_despite_an_error_is_recorded() -> None:
    """An append that failed on the way back but landed: re-read, it is recorded."""
    timeline = RestoreRecordFails(lands=True)
    store = parked(timeline)
    out = resume(
        "run-1", ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({}), clock=ManualClock()
    )
    assert len(restored_records(timeline)) == 1
    assert out.recorded and out.proceeds
    assert out.claim is not None and out.claim.position == len(timeline.read("run-1"))
    assert outcome_data(out)["restore"]["recorded"] is True


# -- backpressure (item 1) ------------------------------------------------------------------

N = 200


def test_R15_200_teardowns_and_resumes_at_once_on_sqlite_none_refused_none_falsely_recorded(
    tmp_path: Path,
) -> None:
    """200 threads at once on one SQLite file: no refusal, every `recorded` on the timeline."""
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/timeline.db")
    service = ScratchService(timeline, FilesystemBankStore(tmp_path / "banks"), snapshots=timeline)
    runs = [f"run-{i}" for i in range(N)]
    for run in runs:
        timeline.append(run, [started(), node("clone", "tool")])
    barrier = threading.Barrier(N)

    def one(run: str) -> tuple[bool, bool, bool, str]:
        barrier.wait()
        report = service.bank_at_teardown(run, FakeSandbox(dict(FILES)), run_finished=False)
        out = service.resume(run, target=Target(sandbox=FakeSandbox({})))
        return report.recorded, out.recorded, out.proceeds, out.decision.rule

    with ThreadPoolExecutor(N) as pool:
        results = dict(zip(runs, pool.map(one, runs), strict=True))
    refused = {run: r[3] for run, r in results.items() if not r[2]}
    assert refused == {}
    for run, (banked, restored, _, _) in results.items():
        records = timeline.read(run)
        assert banked == any(isinstance(r, ScratchBanked) for r in records), run
        assert restored == any(isinstance(r, ScratchRestored) for r in records), run
    assert all(r[0] and r[1] for r in results.values())


def test_R15_a_busy_timeline_is_TIMELINE_BUSY_never_unreadable(tmp_path: Path) -> None:
    """Every call slot held past the deadline: a named retryable error, no R15, nothing written."""
    timeline = EventStoreTimeline(
        f"sqlite:///{tmp_path}/t.db", call_seconds=0.2, in_flight=1, wait_seconds=0.2
    )
    timeline.append("run-1", [started()])
    before = timeline.read("run-1")
    assert timeline._slots.acquire(1.0) == ""  # another caller holds the only slot
    try:
        with pytest.raises(TimelineBusy):
            timeline.read("run-1")
        with pytest.raises(TimelineBusy):
            timeline.append("run-1", [node("clone")], expected=1)
        with pytest.raises(TimelineBusy):
            check_resume(timeline, "run-1", ResumeRequest(), snapshots=timeline)
    finally:
        timeline._slots.release()
    assert timeline.read("run-1") == before
    assert TimelineBusy("x").code == "TIMELINE_BUSY"


def test_the_in_flight_bound_is_one_setting_with_a_default_per_store(tmp_path: Path) -> None:
    """SQLite's default, the URL's ``in_flight``, and SQLite's pool sized from it."""
    default = EventStoreTimeline(f"sqlite:///{tmp_path}/a.db")
    given = EventStoreTimeline(f"sqlite:///{tmp_path}/b.db?in_flight=7")
    assert (default.in_flight, given.in_flight) == (4, 7)
    pool = given._factory.datastore.pool  # type: ignore[attr-defined]
    assert (pool.pool_size, pool.max_overflow, pool.pool_timeout) == (7, 0, given.call_seconds)
    with pytest.raises(ValueError, match="in_flight"):
        EventStoreTimeline(f"sqlite:///{tmp_path}/c.db?in_flight=0")


# -- the slot wait ends at the caller's deadline (issue 26, what is left, item 1) ------------


def held(tmp_path: Path) -> tuple[EventStoreTimeline, tuple[Record, ...]]:
    """A timeline whose only call slot another caller holds; its own line bound is long."""
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db", in_flight=1, wait_seconds=5.0)
    timeline.append("run-1", [started()])
    before = tuple(timeline.read("run-1"))
    assert timeline._slots.acquire(1.0) == ""
    return timeline, before


def test_R15_a_slot_wait_gives_up_at_the_callers_deadline_with_TIMELINE_BUSY(tmp_path: Path) -> None:
    """A caller's passed deadline ends the wait for a slot: TIMELINE_BUSY naming it, nothing written."""
    timeline, before = held(tmp_path)
    try:
        with calls_within(Deadline.after(0.0)), pytest.raises(TimelineBusy, match="caller's deadline"):
            timeline.append("run-1", [node("clone")], expected=1)
        assert timeline._slots.waiting() == 0  # it left the line
    finally:
        timeline._slots.release()
    assert tuple(timeline.read("run-1")) == before


def test_R15_a_use_cases_budget_bounds_the_slot_wait(tmp_path: Path) -> None:
    """append_at passes its budget down: a spent budget ends the wait, retryable, never R15."""
    timeline, before = held(tmp_path)
    clock = ManualClock()
    try:
        with pytest.raises(TimelineBusy, match="caller's deadline"):
            append_at(timeline, Claim("run-1", 1), [node("clone")], budget=Budget.start(clock, 0.0), tries=1)
    finally:
        timeline._slots.release()
    assert tuple(timeline.read("run-1")) == before
    assert isinstance(TimelineBusy("x"), RETRYABLE)


def test_R15_a_cancelled_run_context_ends_the_slot_wait_at_once(tmp_path: Path) -> None:
    """The run context cancelled while its call waits in line: the wait ends, TIMELINE_BUSY."""
    timeline, before = held(tmp_path)
    cancel = Cancel()
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            with calls_within(Deadline.after(60.0, cancel)):
                timeline.read("run-1")
        except TimelineBusy as error:
            errors.append(error)

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        while timeline._slots.waiting() == 0 and thread.is_alive():
            threading.Event().wait(0.001)  # until it is in line (a condition, not a timed assertion)
        cancel.cut("the lease was lost")
        thread.join()
    finally:
        timeline._slots.release()
    assert len(errors) == 1 and "cancelled" in str(errors[0])
    assert timeline._slots.waiting() == 0
    assert tuple(timeline.read("run-1")) == before


# -- a store call's deadline costs no thread (issue 26: the teardown's wait) -----------------


def test_R15_a_store_call_starts_no_thread_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads and appends arm their cut on the process's one alarm thread: none started per call."""
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db")
    timeline.append("run-1", [started()])  # the alarm thread, once per process
    started_threads: list[threading.Thread] = []
    start = threading.Thread.start

    def counted(self: threading.Thread) -> None:
        started_threads.append(self)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", counted)
    for i in range(10):
        timeline.append("run-1", [node(f"n{i}")], expected=i + 1)
        assert len(timeline.read("run-1")) == i + 2
    assert started_threads == []


def test_R15_a_store_call_past_its_deadline_is_still_cut_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared alarm cuts a call that outlives its deadline; the read fails by name, not R15's empty."""
    from eventsourcing.persistence import PersistenceError

    from scratchbank.adapters import event_store

    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db", call_seconds=0.01)
    monkeypatch.setattr(event_store, "CUT_GRACE", 0.0)
    cut = threading.Event()
    monkeypatch.setattr(timeline._cutter, "cut", lambda _thread: cut.set())

    def stalled() -> None:
        cut.wait(60.0)
        raise PersistenceError("the connection was shut down")

    with pytest.raises(event_store.TimelineUnreadable, match="no answer within its deadline"):
        timeline._cut_at_deadline(stalled, event_store.TimelineUnreadable, "cannot read run run-1")
    assert cut.is_set()


def test_R15_a_disarmed_alarm_never_cuts() -> None:
    """A call that ended before its deadline: its alarm is dropped when its time comes."""
    from scratchbank.adapters.event_store import _ALARMS

    done, live = threading.Event(), threading.Event()
    with _ALARMS._cond:  # the alarm thread cannot pop it between the two
        ended = _ALARMS.arm(0.0, done.set)
        ended.disarm()
    _ALARMS.arm(0.01, live.set)
    assert live.wait(60.0)
    assert not done.is_set() and not ended.fired
