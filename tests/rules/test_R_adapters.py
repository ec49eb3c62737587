"""Rules R: the resume gate: refuse or go on, before anything moves. The adapters tier's tests of R2,
R10, R11, R12, R13, R15 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from operator_rigs import RUN, cli, tree_digest
from rigs.cli_process import run
from rigs.landed_records import held
from rigs.long_timelines import appended_in_batches, long_run
from rigs.resume_world import ACCEPT, FILES, World
from runner_rigs import RecordingInbound, checksum, make_rig, queue_resume

from scratchbank.adapters.event_store import PAGE, EventStoreTimeline
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.present import decision_text
from scratchbank.adapters.rules import RULES
from scratchbank.application.cancellation import Cancel, Deadline, calls_within
from scratchbank.application.ports import ResumeDelivery
from scratchbank.application.recording import RETRYABLE, Claim, append_at
from scratchbank.application.resume import SNAPSHOT_EVERY, check_resume, current_state
from scratchbank.application.retry import Budget
from scratchbank.application.runner import Handled
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import SCRATCH_NOT_PORTABLE, ResumeRequest, Verdict, Where, fold
from scratchbank.domain.errors import TimelineBusy
from scratchbank.domain.records import (
    AttemptClaimed,
    AttemptQueued,
    ResumeRefused,
    RunStarted,
    ScratchBanked,
    ScratchRestored,
)
from scratchbank.domain.remedy import remedy
from scratchbank.domain.resume_gate import decide_resume
from scratchbank.testing.builders import banked, node, started, unbanked
from scratchbank.testing.clocks import ManualClock

# ---- from tests/test_cli_explain.py: `scratchbank explain TIMELINE.jsonl`: the decision with its rule and events, or a named error.


def test_R15_bad_file_names_the_line_and_exits_non_zero(tmp_path: Path) -> None:
    """R15: a bad file names the line and exits 2, never a decision.
    Proves ``scratchbank.application.service.explain``."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"type": "run_started"}\n\n{"type": "node_finished", "node": "a"}\n')
    done = run("explain", path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "TIMELINE_UNREADABLE: line 3: node_finished lacks required field 'succeeded'" in done.stderr
    path.write_text('{"type": "run_started"}\n{not json\n')
    done = run("explain", path)
    assert done.returncode == 2 and "line 2: not JSON" in done.stderr
    done = run("explain", tmp_path / "missing.jsonl")
    assert done.returncode == 2 and "cannot read" in done.stderr
    path.write_bytes(b"\xff\xfe\n")
    assert run("explain", path).returncode == 2


# ---- from tests/test_cli_operators.py: The operators' CLI end to end (subprocesses, the embedded default: SQLite, banks on disk).


def test_R15_a_resume_on_an_unreadable_timeline_is_refused_by_name(tmp_path: Path) -> None:
    """A garbage timeline.db: TIMELINE_UNREADABLE, exit 5, no traceback, the file untouched.
    Proves ``scratchbank.domain.errors.TimelineUnreadable``."""
    (tmp_path / "timeline.db").write_bytes(b"garbage" * 100)
    before = tree_digest(tmp_path)
    done = cli("resume", RUN, home=tmp_path)
    assert done.returncode == 5 and "TIMELINE_UNREADABLE" in done.stderr
    assert "Traceback" not in done.stderr
    assert tree_digest(tmp_path) == before


# ---- from tests/test_load_without_lies.py: Issue 26: load without lies. A report says ``recorded`` only for a record known to have landed; a busy timeline waits for a call slot and is never read as unreadable (R15).


def test_R15_a_busy_timeline_is_TIMELINE_BUSY_never_unreadable(tmp_path: Path) -> None:
    """Every call slot held past the deadline: a named retryable error, no R15, nothing written.
    Proves ``scratchbank.application.resume.check_resume``."""
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


def test_R15_a_slot_wait_gives_up_at_the_callers_deadline_with_TIMELINE_BUSY(tmp_path: Path) -> None:
    """A caller's passed deadline ends the wait for a slot: TIMELINE_BUSY naming it, nothing written.
    Proves ``scratchbank.application.cancellation.calls_within``."""
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


def test_R15_the_slot_goes_to_the_waiter_whose_deadline_is_nearest() -> None:
    """The line is served nearest deadline first: a claim with its budget running out goes
    before a fresh read that may still wait a minute (issue 26: 200 resumes at once, every
    first read ahead of the claims, 4 claims refused TIMELINE_BUSY).
    Proves ``scratchbank.adapters.event_store._Slots.acquire``."""
    from waiting import eventually

    from scratchbank.adapters.event_store import _Slots

    slots = _Slots(1)
    assert slots.acquire(1.0) == ""  # another caller holds the only slot
    served: list[str] = []

    def wait(name: str, deadline: Deadline | None) -> None:
        assert slots.acquire(60.0, deadline) == ""
        served.append(name)
        slots.release()

    fresh = threading.Thread(target=wait, args=("fresh read", None))
    fresh.start()
    eventually(lambda: slots.waiting() == 1, what="the read in line")
    claim = threading.Thread(target=wait, args=("claim", Deadline.after(30.0)))
    claim.start()
    eventually(lambda: slots.waiting() == 2, what="the claim in line")
    slots.release()
    fresh.join()
    claim.join()
    assert served == ["claim", "fresh read"]


def test_R15_sqlite_appends_wait_for_the_writer_without_holding_the_read_slots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite has one writer: an append queued behind another holds no call slot, so a read
    goes at once (issue 26: every slot held by appenders queued on the writer lock, ~140 ms
    each, and the resumes behind them refused TIMELINE_BUSY).
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline.append``."""
    from waiting import eventually

    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db", in_flight=2, wait_seconds=30.0)
    for name in ("run-1", "run-2"):
        timeline.append(name, [started()])
    inside, go, real = [], threading.Event(), timeline._insert

    def slow(stored: Any) -> None:  # a writer that takes its time (an fsync on a busy disk)
        inside.append(stored)
        go.wait(60.0)
        real(stored)

    monkeypatch.setattr(timeline, "_insert", slow)
    appends = [
        threading.Thread(target=timeline.append, args=(name, [node("clone")]), kwargs={"expected": 1})
        for name in ("run-1", "run-2")
    ]
    for thread in appends:
        thread.start()
    writes = getattr(timeline, "_writes", None)
    eventually(
        lambda: len(inside) == 2 or (len(inside) == 1 and writes is not None and writes.waiting() == 1),
        what="both appends in flight",
    )
    try:
        with calls_within(Deadline.after(5.0)):
            assert len(timeline.read("run-1")) == 1  # not TIMELINE_BUSY behind the writers
    finally:
        go.set()
        for thread in appends:
            thread.join()
    assert [len(timeline.read(name)) for name in ("run-1", "run-2")] == [2, 2]


def test_R15_a_cancelled_run_context_ends_the_slot_wait_at_once(tmp_path: Path) -> None:
    """The run context cancelled while its call waits in line: the wait ends, TIMELINE_BUSY.
    Proves ``scratchbank.application.cancellation.calls_within``."""
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


def test_R15_a_store_call_starts_no_thread_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads and appends arm their cut on the process's one alarm thread: none started per call.
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline``."""
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
    """The shared alarm cuts a call that outlives its deadline; the read fails by name, not R15's empty.
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline``."""
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
    """A call that ended before its deadline: its alarm is dropped when its time comes.
    Proves ``scratchbank.adapters.alarms.Alarms.arm``."""
    from scratchbank.adapters.alarms import ALARMS

    done, live = threading.Event(), threading.Event()
    with ALARMS._cond:  # the alarm thread cannot pop it between the two
        ended = ALARMS.arm(0.0, done.set)
        ended.disarm()
    ALARMS.arm(0.01, live.set)
    assert live.wait(60.0)
    assert not done.is_set() and not ended.fired


def _foreign(thread: threading.Thread) -> bool:
    """A thread a library started under its own name (a psycopg pool's ``pool-N-worker-M``, an
    asyncio executor's ``asyncio_N``): not the product's, whose threads are named
    ``scratchbank-*``, and not a ``Timer`` or an unnamed ``Thread-N``."""
    return not isinstance(thread, threading.Timer) and not thread.name.startswith(("scratchbank", "Thread-"))


def test_R15_a_thousand_cuts_armed_at_once_start_no_thread_of_their_own(tmp_path: Path) -> None:
    """Watchdogs and the timeline's call cuts are alarms on the one alarm thread: a
    thousand of each armed at once add at most that thread, and no Timer.
    Proves ``scratchbank.adapters.alarms.Alarms.arm``, ``scratchbank.adapters.watchdog.Watchdog``."""
    import contextlib

    from scratchbank.adapters.alarms import ALARMS
    from scratchbank.adapters.watchdog import Watchdog

    ALARMS.arm(3600.0, lambda: None).disarm()  # the alarm thread is up before counting
    before = set(threading.enumerate())
    with contextlib.ExitStack() as armed:
        dogs = [armed.enter_context(Watchdog(Deadline.after(3600.0), lambda: None)) for _ in range(1000)]
        cuts = [ALARMS.arm(3600.0, lambda: None) for _ in range(1000)]
        started = set(threading.enumerate()) - before
        timers = [t for t in threading.enumerate() if isinstance(t, threading.Timer)]
    for cut in cuts:
        cut.disarm()
    # The threads started while they were armed, counted by identity (not by a count that a thread
    # another test left can lower as it ends): none of ours, no Timer, no unnamed one. A cutter is
    # not counted: none of these cuts is due within the hour, so a cutter that starts meanwhile runs
    # a cut another test armed.
    ours = [t.name for t in started if t.name != "scratchbank-cut" and not _foreign(t)]
    assert ours == [] and timers == []
    assert not any(dog.fired for dog in dogs)


def test_R15_a_disarmed_alarm_lets_go_of_its_transport_at_once() -> None:
    """A call that ended long before its deadline (an hour's exec) leaves nothing of its
    transport held by the alarm heap until that hour passes.
    Proves ``scratchbank.adapters.alarms.Alarm.disarm``."""
    import gc
    import weakref

    from scratchbank.adapters.alarms import ALARMS

    class Transport:
        def cut(self) -> None:
            pass

    transport = Transport()
    gone = weakref.ref(transport)
    alarm = ALARMS.arm(3600.0, transport.cut)
    alarm.disarm()
    del transport
    gc.collect()
    assert gone() is None, "the disarmed alarm still holds its transport"


def test_R15_an_alarm_cuts_at_its_deadline_by_the_clock_it_was_given() -> None:
    """A cut lands once its clock passes its deadline, not before (an injected clock).
    Proves ``scratchbank.adapters.alarms.Alarms.arm``."""
    from scratchbank.adapters.alarms import Alarms
    from scratchbank.adapters.watchdog import Watchdog

    clock = ManualClock()
    alarms = Alarms(clock.monotonic)
    cut, early = threading.Event(), threading.Event()
    alarms.arm(5.0, cut.set)
    with Watchdog(Deadline.after(3600.0), early.set, alarms=alarms) as dog:
        clock.advance(4.0)
        alarms.poke()
        assert alarms.armed() == 2 and not cut.is_set()  # nothing came due: both still armed
        clock.advance(1.0)
        alarms.poke()
        assert cut.wait(60.0)
        assert not dog.fired and not early.is_set()


def test_R15_a_cut_that_blocks_stalls_no_other_alarm() -> None:
    """A cut that never returns (the S3 store's ``_shut`` falling back to a ``body.close()``
    that blocks) leaves the next alarm to fire at its deadline by the injected clock.
    Proves ``scratchbank.adapters.alarms.Alarms.arm``, ``scratchbank.adapters.s3_bank._shut``."""
    from scratchbank.adapters.alarms import Alarms
    from scratchbank.adapters.s3_bank import _shut
    from scratchbank.adapters.watchdog import Watchdog

    clock = ManualClock()
    alarms = Alarms(clock.monotonic)
    closing, release, second = threading.Event(), threading.Event(), threading.Event()

    class StuckBody:
        """A body with no socket to find, whose close blocks (a lock its reader holds)."""

        def close(self) -> None:
            closing.set()
            release.wait(60.0)

    try:
        with Watchdog(Deadline.after(1.0), lambda: _shut(StuckBody()), alarms=alarms) as stuck:
            alarms.arm(2.0, second.set)
            clock.advance(1.5)
            alarms.poke()
            assert closing.wait(60.0)  # the first cut runs, and blocks
            assert stuck.fired and not second.is_set()
            clock.advance(1.0)
            alarms.poke()
            assert second.wait(60.0), "a blocked cut stalled the next alarm"
    finally:
        release.set()


def test_R15_a_storm_of_cuts_that_block_starts_a_bounded_number_of_cutters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thousand cuts due at one instant that each block (S3 bodies whose close hangs): at
    most ``MAX_CUTTERS`` cutter threads start (a thousand before), and once the cuts return
    every one has run exactly once (an injected clock).
    Proves ``scratchbank.adapters.alarms.Alarms.arm``."""
    import collections

    from waiting import eventually

    from scratchbank.adapters import alarms as alarms_module

    monkeypatch.setattr(alarms_module, "CUTTER_IDLE", 0.2)  # the cutters end soon after
    clock = ManualClock()
    alarms = alarms_module.Alarms(clock.monotonic)
    release, lock = threading.Event(), threading.Lock()
    ran: collections.Counter[int] = collections.Counter()

    def blocking(i: int) -> Any:
        def cut() -> None:
            with lock:
                ran[i] += 1
            release.wait(60.0)

        return cut

    try:
        with alarms._cond:
            for i in range(1000):
                alarms.arm(1.0, blocking(i))
        clock.advance(1.0)
        alarms.poke()
        eventually(lambda: alarms.armed() == 0, what="every cut handed to a cutter")
        eventually(lambda: sum(ran.values()) >= min(1000, alarms_module.MAX_CUTTERS), what="cuts running")
        started = alarms._cutters.started
        assert started <= min(100, alarms_module.MAX_CUTTERS), f"{started} cutter threads for 1000 cuts"
    finally:
        release.set()
    eventually(lambda: sum(ran.values()) == 1000, what="every cut run once")
    assert set(ran.values()) == {1} and len(ran) == 1000


def test_R15_a_cut_waiting_for_a_cutter_is_dropped_when_disarmed_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every cutter busy (a cut that blocks): a cut due waits for one, and a disarm that comes
    before a cutter takes it wins: the cut never runs. Proves ``scratchbank.adapters.alarms.Alarms.arm``."""
    from waiting import eventually

    from scratchbank.adapters import alarms as alarms_module

    monkeypatch.setattr(alarms_module, "MAX_CUTTERS", 1)
    clock = ManualClock()
    alarms = alarms_module.Alarms(clock.monotonic)
    blocking, release, late = threading.Event(), threading.Event(), threading.Event()
    try:
        alarms.arm(1.0, lambda: (blocking.set(), release.wait(60.0)))
        second = alarms.arm(2.0, late.set)
        clock.advance(1.0)
        alarms.poke()
        assert blocking.wait(60.0)
        clock.advance(1.0)
        alarms.poke()
        eventually(lambda: alarms.armed() == 0, what="the second cut handed over")
        second.disarm()
    finally:
        release.set()
    done = threading.Event()
    alarms.arm(0.0, done.set)  # the one cutter takes its cuts in order: the second first
    assert done.wait(60.0)
    assert not late.is_set() and not second.fired


def test_R15_cuts_handed_over_as_cutters_reach_their_idle_end_all_run_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cutters that end as soon as they are idle (``CUTTER_IDLE`` near 0): cuts due one after
    another, each handed over at a cutter's idle end, all run, once each.
    Proves ``scratchbank.adapters.alarms.Alarms.arm``."""
    import collections

    from waiting import eventually

    from scratchbank.adapters import alarms as alarms_module

    monkeypatch.setattr(alarms_module, "CUTTER_IDLE", 1e-4)
    alarms = alarms_module.Alarms()
    lock = threading.Lock()
    ran: collections.Counter[int] = collections.Counter()

    def counting(i: int) -> Any:
        def cut() -> None:
            with lock:
                ran[i] += 1

        return cut

    for i in range(300):
        alarms.arm(0.0, counting(i))
    eventually(lambda: sum(ran.values()) >= 300, what="every cut run")
    assert len(ran) == 300 and set(ran.values()) == {1}


def test_R15_an_alarm_at_an_infinite_deadline_leaves_the_alarm_thread_serving() -> None:
    """A cut armed at ``inf`` (a call given no deadline) never fires and never kills the
    one alarm thread: every later cut still lands, on that same thread, no traceback.
    Proves ``scratchbank.adapters.alarms.Alarms.arm``."""
    from scratchbank.adapters.alarms import Alarms

    alarms = Alarms()
    crashed: list[BaseException | None] = []
    hook = threading.excepthook
    threading.excepthook = lambda args: crashed.append(args.exc_value)
    try:
        never, first, second = threading.Event(), threading.Event(), threading.Event()
        served: list[int] = []

        def on_thread(event: threading.Event) -> Any:
            return lambda: (served.append(threading.get_ident()), event.set())

        alarms.arm(float("inf"), never.set)
        alarms.arm(0.0, on_thread(first))
        assert first.wait(60.0)
        alarms.arm(0.0, on_thread(second))
        assert second.wait(60.0)
    finally:
        threading.excepthook = hook
    assert crashed == [] and not never.is_set()
    assert len(served) == 2 and alarms._thread is not None and alarms._thread.is_alive()


def test_R15_an_alarm_at_a_nan_deadline_cuts_at_once_and_delays_no_other_cut() -> None:
    """A deadline that is no number (nan) cuts at once and leaves the heap in order: a
    cut armed after it with the nearest deadline still lands first (an injected clock).
    Proves ``scratchbank.adapters.alarms.Alarms.arm``."""
    from scratchbank.adapters.alarms import Alarms

    clock = ManualClock()
    alarms = Alarms(clock.monotonic)
    late, nan, later, soon = (threading.Event() for _ in range(4))
    with alarms._cond:  # all four in the heap before the alarm thread looks
        alarms.arm(10.0, late.set)
        alarms.arm(float("nan"), nan.set)
        alarms.arm(20.0, later.set)
        alarms.arm(1.0, soon.set)
    assert nan.wait(10.0)
    clock.advance(1.0)
    alarms.poke()
    assert soon.wait(10.0)
    assert not late.is_set() and not later.is_set()


def _forked_child_cuts(alarms: Any, first: Callable[[], object] = lambda: None) -> int:
    """Fork; the child runs ``first``, arms one alarm due at once and exits 0 when it fired
    (1 when not within 30 s); the child's wait status, for the parent."""
    import os

    pid = os.fork()
    if pid == 0:
        try:
            first()
            mine = threading.Event()
            alarms.arm(0.0, mine.set)
            os._exit(0 if mine.wait(30.0) else 1)
        finally:
            os._exit(2)
    return os.waitpid(pid, 0)[1]


def test_R15_a_forked_child_never_fires_its_parents_cuts(tmp_path: Path) -> None:
    """A child forked while a call's cut is armed starts with no alarm of its parent's: its
    own first alarm does not shut the parent's socket down (a shared descriptor).
    Proves ``scratchbank.adapters.alarms.Alarms.arm``."""
    import os
    import socket

    from scratchbank.adapters.alarms import Alarms

    clock = ManualClock()
    alarms = Alarms(clock.monotonic)
    ours, peer = socket.socketpair()
    with ours, peer:
        parents = alarms.arm(10.0, lambda: ours.shutdown(socket.SHUT_RDWR))
        # the child: its clock past the parent's deadline, one alarm of its own
        status = _forked_child_cuts(alarms, lambda: clock.advance(20.0))
        parents.disarm()
        assert os.waitstatus_to_exitcode(status) == 0
        peer.sendall(b"x")
        assert ours.recv(1) == b"x"  # the parent's socket is still open both ways


def test_R15_a_cut_due_when_no_thread_can_start_still_runs_and_the_alarm_thread_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process at its thread limit (a cutter cannot start): the cut runs all the same (on
    the alarm thread) and the alarm thread lives to serve the next one; before, the
    RuntimeError killed it and no cut of the process ever ran again.
    Proves ``scratchbank.adapters.alarms.Alarms.arm``."""
    from scratchbank.adapters import alarms as alarms_module

    alarms = alarms_module.Alarms()
    alarms.arm(3600.0, lambda: None).disarm()  # the alarm thread is up

    class NoThreads(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    first, second = threading.Event(), threading.Event()
    monkeypatch.setattr(alarms_module.threading, "Thread", NoThreads)
    alarms.arm(0.0, first.set)
    assert first.wait(30.0), "the cut was dropped"
    monkeypatch.undo()
    alarms.arm(0.0, second.set)
    assert second.wait(30.0), "the alarm thread died"


def test_R15_a_child_forked_while_every_cutter_is_busy_still_cuts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forked while the parent's cutters are all busy (a cut that blocks, ``MAX_CUTTERS`` of
    them): the child counts none of its parent's cutters, its own cut runs.
    Proves ``scratchbank.adapters.alarms.Alarms.arm``."""
    import os

    from scratchbank.adapters import alarms as alarms_module

    monkeypatch.setattr(alarms_module, "MAX_CUTTERS", 1)
    alarms = alarms_module.Alarms()
    blocking, release = threading.Event(), threading.Event()
    try:
        alarms.arm(0.0, lambda: (blocking.set(), release.wait(60.0)))
        assert blocking.wait(60.0)
        status = _forked_child_cuts(alarms)  # the child: one cut of its own, due at once
    finally:
        release.set()
    assert os.waitstatus_to_exitcode(status) == 0


# ---- from tests/test_resume_use_case.py: The resume and restore use cases end to end, with fakes (R and X rules).


def test_R2_a_stale_bank_is_refused_before_anything_moves_the_run() -> None:
    """A stale bank is refused before anything moves the run:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    w = World()
    w.park()
    w.timeline.append("run-1", [node("measure", "agent")])
    before = len(w.timeline.read("run-1"))
    out, box = w.resume()
    assert out.decision.code == SCRATCH_NOT_PORTABLE and not out.proceeds
    assert len(w.timeline.read("run-1")) == before and box.files == {}
    out, box = w.resume(ACCEPT)
    assert out.proceeds and box.files == FILES
    rec = w.last()
    assert isinstance(rec, ScratchRestored) and rec.stale and rec.accepted


def test_R10_the_surface_defers_while_the_latest_execution_may_still_bank() -> None:
    """The surface defers while the latest execution may still bank:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    w = World()
    out, _ = w.resume(ResumeRequest(where=Where.SURFACE))
    assert out.decision.verdict is Verdict.DEFER_TO_ENGINE and not out.proceeds


def test_R13_accepting_an_unbanked_loss_records_it_and_goes_on() -> None:
    """Accepting an unbanked loss records it and goes on:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    w = World()
    bank_at_teardown(
        "run-1",
        timeline=w.timeline,
        store=InMemoryBankStore(keeps_banks=False),
        sandbox=FakeSandbox(dict(FILES)),
        run_finished=False,
    )
    out, _ = w.resume()
    assert out.decision.code == SCRATCH_NOT_PORTABLE and out.decision.rule == "R1"
    out, box = w.resume(ACCEPT)
    assert out.proceeds and box.files == {}
    rec = w.last()
    assert isinstance(rec, ScratchRestored) and rec.accepted and "keeps no bank" in rec.reason


# ---- from tests/test_runner_deliveries.py: The runner on the embedded default: deliveries, consents, refusals (C3-C8, R10-R12, L4).


def test_R12_C10_detached_runner_writes_the_refusal_with_the_remedy_hint(tmp_path: Path) -> None:
    """A refusal under the lease lands in the run's log, its hint from remedy(); acked."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    unbanked = ScratchBanked(banked=False, empty=False, unknown=False, bytes=0, reason="tar failed")
    tl.append("run-1", [RunStarted(), unbanked, AttemptQueued(attempt="a1")])
    inbound = RecordingInbound(ResumeDelivery("run-1", "a1"))
    handled = rig.runner().handle(inbound)
    assert handled.handled is Handled.REFUSED and handled.decision is not None
    refusals = [r for r in tl.read("run-1") if isinstance(r, ResumeRefused)]
    assert len(refusals) == 1
    assert refusals[0].hint == remedy(handled.decision) and "--accept-scratch-loss" in refusals[0].hint
    assert refusals[0].code == "SCRATCH_NOT_PORTABLE" and refusals[0].rule == "R1"
    assert not [r for r in tl.read("run-1") if isinstance(r, AttemptClaimed)]  # refused before the claim


def test_R11_an_in_process_resume_hears_the_engines_refusal(tmp_path: Path) -> None:
    """The surface defers (R10, still banking); the engine refuses; the waiter hears it.
    Proves ``scratchbank.adapters.fs_bank.FilesystemBankStore``."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    unbanked = ScratchBanked(banked=False, empty=False, unknown=False, bytes=0, reason="over the cap")
    tl.append("run-1", [RunStarted(), unbanked, RunStarted()])  # the latest execution may still bank
    decision, delivery = queue_resume(tl, rig.queue, "run-1", "a1")
    assert decision.verdict is Verdict.DEFER_TO_ENGINE and delivery is not None
    rig.runner().run_once(1)
    heard = rig.verdicts.wait(delivery, timeout=5)
    assert heard is not None and heard.refused and heard.code == "SCRATCH_NOT_PORTABLE"


def test_R10_surface_refuses_from_the_latest_executions_record_and_queues_nothing(tmp_path: Path) -> None:
    """A refusal the surface can make itself publishes nothing and queues nothing.
    Proves ``scratchbank.adapters.fs_bank.FilesystemBankStore``."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    unbanked = ScratchBanked(banked=False, empty=False, unknown=False, bytes=0, reason="over the cap")
    tl.append("run-1", [RunStarted(), unbanked])
    before = checksum(tl, "run-1")
    decision, delivery = queue_resume(tl, rig.queue, "run-1", "a1")
    assert decision.refused and delivery is None
    assert checksum(tl, "run-1") == before and rig.queue.fetch(0.05) is None


# ---- from tests/test_snapshots.py: Snapshots of the fold on the event store: same decisions, faster on long histories.


def test_R2_snapshot_then_tail_decides_as_the_whole_timeline(tmp_path: Path) -> None:
    """Snapshot then tail decides as the whole timeline: ``scratchbank.application.resume.current_state``."""
    timeline = long_run(tmp_path, SNAPSHOT_EVERY + 5)
    whole = fold(timeline.read("run-1"))
    first = current_state(timeline, "run-1", snapshots=timeline)  # folds and saves a snapshot
    assert first == whole and timeline.load_snapshot("run-1") is not None
    timeline.append("run-1", [node("measure", "agent")])
    via_snapshot = check_resume(timeline, "run-1", ResumeRequest(), snapshots=timeline)
    plain = check_resume(timeline, "run-1", ResumeRequest())
    assert via_snapshot == plain and via_snapshot.code == "SCRATCH_NOT_PORTABLE"
    assert [e.position for e in via_snapshot.evidence] == [1, SNAPSHOT_EVERY + 7]


def test_R2_a_cold_first_decision_reads_one_snapshot_interval_at_most(tmp_path: Path) -> None:
    """Appends through the port leave snapshots: a fresh process folds < one interval + a batch.
    Proves ``scratchbank.application.resume.current_state``."""
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
    """No snapshot: the decision folds the store's pages one at a time, never the whole run.
    Proves ``scratchbank.application.resume.current_state``."""
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
    """A second process's append past the interval folds from the store, and saves the truth.
    Proves ``scratchbank.application.resume.current_state``."""
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


def test_R2_a_run_this_process_appends_is_decided_from_its_own_fold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The appender's fold stands for the snapshot: no snapshot query, only the tail others appended.
    Proves ``scratchbank.application.resume.current_state``."""
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


# ---- from tests/test_surface_error_table.py: The one error table (code, exit status, HTTP status, MCP error), the README that prints it, remedies in each surface's words, and the shipped rule reference every refusal line names.


def test_R2_every_refusal_line_names_its_rule_in_words() -> None:
    """R1, R2 (and the rules of their causes) are said in words on the refusal's lines.
    Proves ``scratchbank.adapters.present.decision_text``."""
    cases = [
        fold([started(), node("a", "tool"), banked(), node("b", "tool")]),
        fold([started(), node("a", "tool"), unbanked()]),
    ]
    for state in cases:
        lines = decision_text(decide_resume(state, ResumeRequest()))
        for line in lines:
            for rule in re.findall(r"\b([TSRXCLNA]\d{1,2})\b", line):
                assert f"{rule}: {RULES[rule].title}" in line, line


def test_R15_any_error_of_the_store_library_is_named_never_raw(tmp_path: Path) -> None:
    """An error of eventsourcing's outside its PersistenceError family (a pool closed under a
    call) is the call's named error: TIMELINE_UNREADABLE for a read, TIMELINE_WRITE_FAILED for
    an append, never a raw traceback.
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline._cut_at_deadline``."""
    from eventsourcing.persistence import ConnectionPoolClosedError

    from scratchbank.domain.errors import TimelineUnreadable, TimelineWriteFailed
    from scratchbank.testing.builders import node, started

    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/timeline.db")
    try:
        timeline.append("run-e", [started()])

        def closed(*args: Any, **kwargs: Any) -> Any:
            raise ConnectionPoolClosedError("the pool was closed")

        reader, inserter = timeline._select, timeline._insert_events
        timeline._select = closed
        with pytest.raises(TimelineUnreadable, match="pool was closed"):
            timeline.read("run-e")
        timeline._select = reader
        timeline._insert_events = closed
        with pytest.raises(TimelineWriteFailed, match="pool was closed"):
            timeline.append("run-e", [node("a", "tool")], expected=1)
        timeline._insert_events = inserter
        assert len(timeline.read("run-e")) == 1  # nothing landed
    finally:
        timeline.close()


def test_R15_a_quiet_reader_reopening_never_closes_the_store_under_another_call(tmp_path: Path) -> None:
    """A read-only timeline whose quiet file gains a writer reopens the plain way; a read
    already in flight on the store it opened first still ends with its records, never
    TIMELINE_UNREADABLE (the first store is not closed under it).
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline``."""
    from scratchbank.testing.builders import node, started

    url = f"sqlite:///{tmp_path}/timeline.db"
    first = EventStoreTimeline(url)
    first.append("run-q", [started()])
    first.close()
    reader = EventStoreTimeline(url, read_only=True, in_flight=2)
    entered, go = threading.Event(), threading.Event()
    on_first_store = reader._select

    def in_flight(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        assert go.wait(60.0)
        return on_first_store(*args, **kwargs)

    reader._select = in_flight
    got: list[object] = []
    slow = threading.Thread(target=lambda: got.append(_read_or_error(reader, "run-q")))
    slow.start()
    assert entered.wait(60.0)
    writer = EventStoreTimeline(url)
    try:
        writer.append("run-q", [node("late", "tool")])  # the file is no longer quiet
        assert len(reader.read("run-q")) == 2  # this read reopens the plain way
        go.set()
        slow.join(60.0)
        assert isinstance(got[0], tuple) and len(got[0]) >= 1, got
    finally:
        go.set()
        writer.close()
        reader.close()


def _read_or_error(timeline: EventStoreTimeline, run_id: str) -> object:
    try:
        return timeline.read(run_id)
    except Exception as error:  # the test shows what the read raised
        return error
