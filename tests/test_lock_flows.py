"""Issue 18 classes 1-3 and the lock's flows (A16, A18, R2, X3, X6, C8), each a named test.

Every flow runs the real use cases over the memory adapters with the run's lock
(MemoryRunLock on a ManualClock, or SQLite files), so the interleavings are made
certain with events, never with timing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from scratchbank.adapters.inprocess import InProcessLease
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.run_lock import HandedLock, MemoryRunLock, SqliteRunLock
from scratchbank.application.cancellation import Deadline
from scratchbank.application.ports import ByteSink, RunLock, StagedRestore
from scratchbank.application.resume import Target, resume
from scratchbank.application.run_lock import start_run
from scratchbank.application.service import ScratchService
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import ResumeRequest, Verdict
from scratchbank.domain.errors import LockLost, RunLocked, TimelineUnreadable
from scratchbank.domain.records import Record, RunResumed, ScratchBanked, ScratchRestored
from scratchbank.testing.builders import node
from scratchbank.testing.clocks import ManualClock

RUN = "run-1"
OLD = {"work/a.txt": b"old"}
NEW = {"work/a.txt": b"new", "work/b.txt": b"newer"}
WAIT = 30.0  # an event that never comes fails the test instead of hanging it


class GatedSandbox(FakeSandbox):
    """A FakeSandbox whose archive (or restore) waits for ``go`` once it has begun."""

    def __init__(self, files: dict[str, bytes] | None = None, *, gate: str = "archive", **kw: Any) -> None:
        super().__init__(files, **kw)
        self.gate, self.begun, self.go = gate, threading.Event(), threading.Event()

    def _wait(self, op: str) -> None:
        if op == self.gate:
            self.begun.set()
            assert self.go.wait(WAIT)

    def archive(
        self, dest: ByteSink, *, compress: bool, verify: bool, deadline: Deadline | None = None
    ) -> Any:
        self._wait("archive")
        return super().archive(dest, compress=compress, verify=verify, deadline=deadline)

    def stage_restore(
        self, src: Any, *, compressed: bool, listing: ByteSink, need_bytes: int = 0
    ) -> StagedRestore:
        self._wait("restore")
        return super().stage_restore(src, compressed=compressed, listing=listing, need_bytes=need_bytes)


class Rig:
    """One run's ports: timeline, store, lock on a manual clock."""

    def __init__(self, lock: RunLock | None = None) -> None:
        self.clock = ManualClock()
        self.timeline = InMemoryTimeline()
        self.store = InMemoryBankStore()
        self.lock = lock or MemoryRunLock(self.clock)

    def records(self) -> tuple[Record, ...]:
        return tuple(self.timeline.read(RUN))

    def teardown(self, files: dict[str, bytes] | None, execution: str | None, **kw: Any) -> Any:
        box = kw.pop("sandbox", None) or FakeSandbox(dict(files) if files is not None else None)
        return bank_at_teardown(
            RUN,
            timeline=self.timeline,
            store=self.store,
            sandbox=box,
            run_finished=False,
            clock=self.clock,
            execution=execution,
            **kw,
        )

    def resume(self, box: FakeSandbox | None = None, **kw: Any) -> Any:
        return resume(
            RUN,
            ResumeRequest(),
            timeline=self.timeline,
            store=self.store,
            sandbox=box if box is not None else FakeSandbox({}),
            clock=self.clock,
            lock=kw.pop("lock", self.lock),
            **kw,
        )


def objects(store: InMemoryBankStore) -> dict[str, dict[str | None, bytes]]:
    """What the store holds, every run's objects by name (a copy)."""
    return {run: dict(named) for run, named in store.stored.items()}


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as error:  # handed to the test, which asserts on it
            out.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


# ---- Class 3: an engine-side resume decides under the lock (R10, A16) -------------------


def test_A16_R10_an_engine_resume_is_refused_retryably_while_the_first_teardown_still_banks() -> None:
    """The first execution holds the lock until its teardown recorded: a resume meanwhile is
    RUN_LOCKED (nothing written), never "go on without"; after the record it restores."""
    rig = Rig()
    execution, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    rig.timeline.append(RUN, [node("clone", "tool")])
    box = GatedSandbox(dict(OLD))
    thread, _ = in_thread(lambda: rig.teardown(None, execution, sandbox=box, lock=rig.lock, grant=grant))
    assert box.begun.wait(WAIT)
    before = rig.records()
    with pytest.raises(RunLocked) as raised:
        rig.resume()
    assert raised.value.retryable
    assert raised.value.code == "RUN_LOCKED"
    assert execution in raised.value.message
    assert rig.records() == before  # the refusal changed nothing
    box.go.set()
    thread.join(WAIT)
    target = FakeSandbox({})
    out = rig.resume(target)
    assert out.decision.verdict is Verdict.RESTORE
    assert target.files == OLD


# ---- Class 1: an unreadable first read is retried and never disables the check ---------


class BlipTimeline(InMemoryTimeline):
    """The first read fails (a blip); while it is failing, ``meanwhile`` runs (another actor)."""

    def __init__(self) -> None:
        super().__init__()
        self.blips = 0
        self.meanwhile: Callable[[], None] | None = None

    def read(self, run_id: str) -> Sequence[Record]:
        if self.meanwhile is not None:
            act, self.meanwhile = self.meanwhile, None
            self.blips += 1
            act()
            raise TimelineUnreadable("a blip")
        return super().read(run_id)


def test_A18_a_teardown_whose_first_read_failed_never_records_over_a_newer_execution() -> None:
    """E1's teardown meets a blip; meanwhile E2 resumes, runs a node and banks. E1's
    teardown reads again within its budget, is superseded (named), stores and records
    nothing; the next resume restores E2's bank, not E1's older scratch."""
    rig = Rig()
    rig.timeline = BlipTimeline()
    e1, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    rig.lock.release(grant)  # E1's holder is gone (its lease let go); its teardown is late

    def e2() -> None:
        out = rig.resume()
        assert out.proceeds
        rig.timeline.append(RUN, [node("fix", "agent")])
        report = rig.teardown(NEW, out.execution, lock=rig.lock, grant=out.grant)
        assert report.recorded

    rig.timeline.meanwhile = e2
    late = rig.teardown(OLD, e1)
    assert rig.timeline.blips == 1
    assert not late.recorded
    assert "superseded" in late.superseded
    assert e1 in late.superseded
    assert len(objects(rig.store)) == 1  # E2's bank is there, E1 stored nothing ...
    last = [r for r in rig.records() if isinstance(r, ScratchBanked)]
    assert len(last) == 1  # ... and only E2's teardown recorded
    target = FakeSandbox({})
    rig.resume(target)
    assert target.files == NEW


# ---- Class 2: a teardown that starts after a newer execution claimed ------------------


def test_A18_a_late_teardown_of_an_older_execution_is_superseded_and_never_reverts() -> None:
    """E1 banked and parked; E2 resumed (restored E1's bank). A second, slow teardown of
    E1's sandbox then banks nothing over the bank and records nothing; when E2's sandbox
    is lost (``unknown``), the next resume restores the recorded bank, not E1's later files."""
    rig = Rig()
    e1, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    e2 = rig.resume(FakeSandbox({}))
    assert e2.proceeds
    bank = objects(rig.store)
    before = rig.records()
    late = rig.teardown({"work/a.txt": b"E1 kept writing"}, e1)
    assert not late.recorded
    assert e2.execution in late.superseded
    assert rig.records() == before
    assert objects(rig.store) == bank
    gone = FakeSandbox(dict(NEW))
    gone.gone = True
    lost = rig.teardown(None, e2.execution, sandbox=gone, lock=rig.lock, grant=e2.grant)
    assert isinstance(lost.record, ScratchBanked)  # a record, not NothingRecorded
    assert lost.record.unknown
    target = FakeSandbox({})
    rig.resume(target)
    assert target.files == OLD


def test_A18_the_teardown_record_names_its_execution_and_older_records_keep_their_meaning() -> None:
    """The record carries the execution id; a record without one still reads as the latest
    execution's (today's meaning)."""
    rig = Rig()
    e1, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    report = rig.teardown(OLD, e1, lock=rig.lock, grant=grant)
    assert isinstance(report.record, ScratchBanked)
    assert report.record.execution == e1
    unnamed = Rig()
    unnamed.timeline.append(RUN, [RunResumed()])
    legacy = unnamed.teardown(OLD, None)
    assert legacy.recorded
    assert legacy.execution == "@0"


# ---- Racing resumes (C7, A16) -----------------------------------------------------------


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_A16_a_resume_while_another_restores_is_locked_out_and_one_run_resumed_is_recorded(
    store: str, tmp_path: Path
) -> None:
    """A reads, claims and is restoring when B reads: B is RUN_LOCKED (before: B claimed a
    second ``run_resumed`` and A's restore record was refused RESUME_SUPERSEDED)."""
    rig = Rig(SqliteRunLock(tmp_path / "t.locks") if store == "sqlite" else None)
    e1, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    slow = GatedSandbox({}, gate="restore")
    thread, got = in_thread(lambda: rig.resume(slow))
    assert slow.begun.wait(WAIT)
    with pytest.raises(RunLocked):
        rig.resume(FakeSandbox({}))
    slow.go.set()
    thread.join(WAIT)
    assert not isinstance(got[0], BaseException), got
    kinds = [type(r) for r in rig.records()]
    assert kinds.count(RunResumed) == 1
    assert kinds.count(ScratchRestored) == 1
    assert slow.files == OLD


def test_A16_lock_less_resumes_in_one_process_are_excluded_for_the_call() -> None:
    """The exported ``resume(...)`` without a lock takes this process's lock for its call."""
    rig = Rig()
    e1, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    slow = GatedSandbox({}, gate="restore")
    thread, _ = in_thread(lambda: rig.resume(slow, lock=None))
    assert slow.begun.wait(WAIT)
    with pytest.raises(RunLocked):
        rig.resume(FakeSandbox({}), lock=None)
    slow.go.set()
    thread.join(WAIT)
    assert [type(r) for r in rig.records()].count(RunResumed) == 1


# ---- The flows a missing teardown record must not refuse (A16) -------------------------


def test_A16_R2_a_sandbox_lost_without_a_teardown_and_the_next_resume_under_the_lock() -> None:
    """E2 dies without a teardown (its lease lapses). The next resume takes the lock over,
    is not refused for the missing record, and still refuses by R2 (a node ran in the
    sandbox after the bank), saying which execution's teardown it decided without."""
    rig = Rig()
    e1, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    e2 = rig.resume(FakeSandbox({}))
    rig.timeline.append(RUN, [node("fix", "agent", in_sandbox=True)])
    held = rig.lock.holder(RUN)
    assert held is not None
    assert held.holder == e2.execution
    rig.clock.advance(120)  # E2's process is gone: nobody refreshes; its lease lapses
    before = rig.records()
    out = rig.resume(FakeSandbox({}))
    assert out.decision.verdict is Verdict.REFUSE
    assert out.decision.rule == "R2"
    assert rig.records() == before  # a refusal writes nothing
    assert rig.lock.holder(RUN) is None  # and lets the lock go
    with pytest.raises(LockLost):
        rig.lock.refresh(e2.grant, ttl=60)  # E2 is fenced


def test_A16_X6_a_host_backed_scratch_never_banks_and_never_blocks_the_next_resume(tmp_path: Path) -> None:
    """A resume into a host directory (X6) ends the banking window; the execution's
    teardown skips (T1) and lets the lock go; the next resume goes on."""
    rig = Rig()
    e1, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    out = rig.resume(None, host_directory=tmp_path / "host")
    assert out.proceeds
    assert out.grant is not None
    report = rig.teardown(
        None, out.execution, sandbox=FakeSandbox({}, host_backed=True), lock=rig.lock, grant=out.grant
    )
    assert not report.recorded
    assert rig.lock.holder(RUN) is None
    nxt = rig.resume(None, host_directory=tmp_path / "host")
    assert nxt.proceeds


def test_A16_X3_a_failed_restores_hold_lets_the_lock_go_and_the_next_resume_restores() -> None:
    """A restore that fails parks the run and holds the bank (X3): the resume lets the lock
    go; the failed sandbox's teardown banks nothing over the bank; the next resume restores."""
    rig = Rig()
    e1, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    broken = FakeSandbox({})
    from scratchbank.domain.errors import StreamBroken

    broken.faults["restore"] = [StreamBroken("cut")]
    failed = rig.resume(broken)
    assert not failed.proceeds
    assert failed.grant is None
    assert rig.lock.holder(RUN) is None
    bank = objects(rig.store)
    held = rig.teardown({"work/a.txt": b"half"}, None)
    assert held.plan.rule == "X3"
    assert objects(rig.store) == bank
    target = FakeSandbox({})
    assert rig.resume(target).proceeds
    assert target.files == OLD


# ---- C8: an in-process resume locks and checks before its pause-path writes -------------


def test_C8_an_in_process_resume_locks_and_checks_before_its_pause_path_writes() -> None:
    """The service's ``hold`` takes the lock and decides before the engine writes its
    answers; another resume in between is RUN_LOCKED; the claim comes after the writes."""
    rig = Rig()
    service = ScratchService(rig.timeline, rig.store, clock=rig.clock, lock=rig.lock)
    e1, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    held, decision = service.hold(RUN)
    assert decision.verdict is Verdict.RESTORE
    rig.timeline.append(RUN, [node("ask", "human", answered=True)])  # the pause path's writes
    with pytest.raises(RunLocked):
        service.resume(RUN, target=Target(FakeSandbox({})))
    target = FakeSandbox({})
    out = service.resume(RUN, target=Target(target), grant=held)
    assert out.proceeds
    assert target.files == OLD
    kinds = [type(r).__name__ for r in rig.records()]
    assert kinds.index("NodeFinished", kinds.index("ScratchBanked")) < kinds.index("RunResumed")
    holder = rig.lock.holder(RUN)
    assert holder is not None
    assert holder.holder == held.holder  # the execution keeps the lock the check took
    service.bank_at_teardown(RUN, FakeSandbox(dict(NEW)), run_finished=False)
    assert rig.lock.holder(RUN) is None


# ---- A runner holding the lease (ADR 0005, 0007) ---------------------------------------


def test_A16_a_runner_holding_the_lease_resumes_without_contending_and_others_are_locked_out() -> None:
    """The runner hands its lease grant in: its resume never contends with its own holder;
    an engine-side resume elsewhere meets the live lease and is RUN_LOCKED."""
    rig = Rig()
    e1, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    lease = InProcessLease(lapse=60.0)
    lease_grant = lease.acquire(RUN, "runner-a")
    assert lease_grant is not None
    handed = HandedLock(lease, lease_grant)
    mine = handed.acquire(RUN, "ignored", ttl=60)
    assert mine is not None
    target = FakeSandbox({})
    out = rig.resume(target, lock=handed, grant=mine)
    assert out.proceeds
    assert target.files == OLD
    with pytest.raises(RunLocked):
        rig.resume(FakeSandbox({}), lock=HandedLock(lease))
    assert lease.acquire(RUN, "runner-b") is None  # the resume left the runner's lease alone


# ---- Split-brain: a holder past its ceiling that still banks ----------------------------


class GatedStore(InMemoryBankStore):
    """A store whose put waits for ``go`` once it has begun (a put in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.begun, self.go = threading.Event(), threading.Event()

    def put(self, run_id: str, archive: Path, *, sha256: str, **kw: Any) -> str:
        self.begun.set()
        assert self.go.wait(WAIT)
        return super().put(run_id, archive, sha256=sha256, **kw)


def test_A16_A18_a_holder_past_its_ceiling_that_still_banks_is_found_not_dropped() -> None:
    """E1's lease lapses while its teardown's put is in flight (past its ceiling). E2
    takes the lock over and records that it decided without E1's teardown; E1's put lands
    but its record is superseded (named): the bytes stay in the store, nothing restores
    them in silence, and E1 is fenced."""
    rig = Rig()
    rig.store = GatedStore()
    e1, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    late_thread, late = in_thread(lambda: rig.teardown(OLD, e1))
    assert rig.store.begun.wait(WAIT)
    rig.clock.advance(120)  # past its ceiling nobody refreshes E1's lease: it lapses
    e2 = rig.resume(FakeSandbox({}))  # the lapsed holder does not refuse it
    assert e2.proceeds
    claim = next(r for r in rig.records() if isinstance(r, RunResumed))
    assert claim.execution == e2.execution
    assert claim.without_teardown == e1  # the decision says whose teardown it went without
    rig.store.go.set()
    late_thread.join(WAIT)
    report = late[0]
    assert not report.recorded
    assert e2.execution in report.superseded
    assert not any(isinstance(r, ScratchBanked) for r in rig.records())
    loose = rig.store.objects(RUN)
    assert len(loose) == 1  # the late bank is kept, not dropped ...
    assert loose[0].stamp is not None
    assert loose[0].stamp.execution == e1  # ... stamped with its execution (N3 finds it)
    status = ScratchService(rig.timeline, rig.store, clock=rig.clock, lock=rig.lock).status(RUN)
    assert status.unreferenced is not None
    listed = [*status.unreferenced.others, *status.unreferenced.unproven]
    assert status.unreferenced.record is None  # never recorded as E2's: it is E1's
    assert [o.name for o in listed] == [loose[0].name]  # status lists it
    with pytest.raises(LockLost):
        rig.lock.refresh(grant, ttl=60)


# ---- status shows the lock; breaking it is an operator's action that fences ----------


def test_A16_status_shows_the_lock_and_breaking_it_fences_the_old_holder(tmp_path: Path) -> None:
    """``status`` shows who holds the run's lock, since when, with which token; an
    operator's break ends it and the old holder's next refresh is LOCK_LOST."""
    from scratchbank.adapters.present import status_data, status_text

    rig = Rig(SqliteRunLock(tmp_path / "t.locks"))
    service = ScratchService(rig.timeline, rig.store, clock=rig.clock, lock=rig.lock)
    execution, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    report = service.status(RUN)
    assert report.lock is not None
    assert (report.lock.holder, report.lock.token, report.lock.live) == (execution, grant.token, True)
    data = status_data(report)["lock"]
    assert data["holder"] == execution
    assert data["token"] == grant.token
    assert any(f"lock: held by {execution}" in line for line in status_text(report))
    before = rig.records()
    broken = service.break_lock(RUN, by="test operator")
    assert broken is not None
    assert broken.holder == execution
    with pytest.raises(LockLost):
        rig.lock.refresh(grant, ttl=60)
    assert service.status(RUN).lock is None
    assert rig.records() == before  # breaking a lock writes nothing on the run


def test_A16_a_cli_resume_lets_the_lock_go_when_its_service_closes(tmp_path: Path) -> None:
    """An operator CLI resume holds the execution's lock only until its service closes: the
    next resume is not RUN_LOCKED for the rest of the lease."""
    from scratchbank.adapters.bootstrap import close

    rig = Rig(SqliteRunLock(tmp_path / "t.locks"))
    e1, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    cli = ScratchService(rig.timeline, rig.store, clock=rig.clock, lock=rig.lock)
    out = cli.resume(RUN, ResumeRequest(), Target(FakeSandbox({})))
    assert out.proceeds
    held = rig.lock.holder(RUN)
    assert held is not None and held.holder == out.execution  # held while the CLI runs
    close(cli)
    assert rig.lock.holder(RUN) is None
    nxt = ScratchService(rig.timeline, rig.store, clock=rig.clock, lock=rig.lock)
    again = nxt.resume(RUN, ResumeRequest(), Target(FakeSandbox({})))  # before: RunLocked
    assert again.decision.verdict is not None
    close(nxt)


def test_A16_T3_a_run_is_deleted_under_its_lock_never_under_a_banking_teardown(tmp_path: Path) -> None:
    """Deleting a run (T3's sweep) takes the run's lock: while an execution's teardown still
    banks it is RUN_LOCKED and sweeps nothing; once the teardown recorded, it sweeps all
    (before: ``old:T.read > delete:S.sweep > old:S.put > old:T.append`` left an object)."""
    rig = Rig(SqliteRunLock(tmp_path / "t.locks"))
    service = ScratchService(rig.timeline, rig.store, clock=rig.clock, lock=rig.lock)
    e1, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    slow = GatedSandbox(OLD, gate="archive")
    thread, got = in_thread(lambda: rig.teardown(None, e1, sandbox=slow, lock=rig.lock, grant=grant))
    assert slow.begun.wait(WAIT)
    before = objects(rig.store)
    with pytest.raises(RunLocked):
        service.delete_run(RUN)
    assert objects(rig.store) == before  # the refusal swept nothing
    slow.go.set()
    thread.join(WAIT)
    assert not isinstance(got[0], BaseException) and got[0].recorded, got
    assert list(rig.store.objects(RUN))  # the teardown's bank landed, after no sweep
    service.delete_run(RUN)
    assert list(rig.store.objects(RUN)) == []
    assert rig.lock.holder(RUN) is None  # the deletion let its lock go
