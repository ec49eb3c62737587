"""Rules A: readings this project chose where the design is open. The adapters tier's tests of A15,
A16, A17, A18 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from operator_rigs import RUN, cli, parked_run, tree_digest
from rigs import claiming_runner, gated_runs
from rigs.claiming_runner import _AnotherExecutionDuringTheEngine, _parked_and_banked
from rigs.gated_runs import NEW, OLD, WAIT, BlipTimeline, GatedSandbox, GatedStore, Rig, in_thread, objects
from rigs.long_timelines import TAIL, long_run_refusing_whole_reads, long_run_with_tail
from rigs.resume_world import ACCEPT, World, checksum

from scratchbank.adapters.host_directory import HostDirectory
from scratchbank.adapters.inprocess import InProcessLease
from scratchbank.adapters.memory import FakeSandbox
from scratchbank.adapters.run_lock import HandedLock, SqliteRunLock
from scratchbank.application.bank_objects import prune
from scratchbank.application.recording import Claim
from scratchbank.application.resume import Target, resume
from scratchbank.application.run_lock import start_run
from scratchbank.application.service import ScratchService
from scratchbank.application.teardown import Budgets, _Checked, _first_read
from scratchbank.domain import ResumeRequest, Verdict
from scratchbank.domain.errors import LockLost, NoRestoreTarget, RunLocked
from scratchbank.domain.objects import digest_of
from scratchbank.domain.records import RunResumed, ScratchBanked, ScratchRestored
from scratchbank.testing.builders import banked, node, resumed
from scratchbank.testing.clocks import ManualClock

# ---- from tests/test_cli_operators.py: The operators' CLI end to end (subprocesses, the embedded default: SQLite, banks on disk).


def test_A15_following_the_hint_without_a_sandbox_is_refused_by_name_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """Finding 1: --accept-scratch-loss with no --sandbox is NO_RESTORE_TARGET, nothing written.
    Proves ``scratchbank.adapters.bootstrap.open_home``."""
    parked_run(tmp_path, stale=True)
    before = tree_digest(tmp_path)
    done = cli("resume", RUN, "--accept-scratch-loss", home=tmp_path)
    assert done.returncode == 3, done.stderr
    assert "NO_RESTORE_TARGET" in done.stderr and "--sandbox" in done.stderr
    assert "the run goes on" not in done.stdout and "Traceback" not in done.stderr
    assert tree_digest(tmp_path) == before


def test_A15_the_same_resume_into_a_named_sandbox_restores_the_bank(tmp_path: Path) -> None:
    """Finding 1, the way out: name the target and the bank is restored there (R7).
    Proves ``scratchbank.adapters.bootstrap.open_home``."""
    parked_run(tmp_path / "home", stale=True)
    target = tmp_path / "box"
    target.mkdir()
    done = cli(
        "resume",
        RUN,
        "--accept-scratch-loss",
        "--sandbox",
        f"local:{target}",
        "--json",
        home=tmp_path / "home",
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["proceeds"] and out["restore"]["restored"] and out["decision"]["rule"] == "R7"
    assert (target / "scratch" / "a.txt").read_bytes() == b"kept"


# ---- from tests/rules/test_[AC]*.py: Issue 18 classes 1-3 and the lock's flows (A16, A18, R2, X3, X6, C8), each a named test.


def test_A16_R10_an_engine_resume_is_refused_retryably_while_the_first_teardown_still_banks() -> None:
    """The first execution holds the lock until its teardown recorded: a resume meanwhile is
    RUN_LOCKED (nothing written), never "go on without"; after the record it restores.
    Proves ``scratchbank.application.run_lock.start_run``."""
    rig = Rig()
    execution, grant = start_run(gated_runs.RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    rig.timeline.append(gated_runs.RUN, [node("clone", "tool")])
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


def test_A18_a_teardown_whose_first_read_failed_never_records_over_a_newer_execution() -> None:
    """E1's teardown meets a blip; meanwhile E2 resumes, runs a node and banks. E1's
    teardown reads again within its budget, is superseded (named), stores and records
    nothing; the next resume restores E2's bank, not E1's older scratch.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    rig = Rig()
    rig.timeline = BlipTimeline()
    e1, grant = start_run(gated_runs.RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    rig.lock.release(grant)  # E1's holder is gone (its lease let go); its teardown is late

    def e2() -> None:
        out = rig.resume()
        assert out.proceeds
        rig.timeline.append(gated_runs.RUN, [node("fix", "agent")])
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


def test_A18_a_late_teardown_of_an_older_execution_is_superseded_and_never_reverts() -> None:
    """E1 banked and parked; E2 resumed (restored E1's bank). A second, slow teardown of
    E1's sandbox then banks nothing over the bank and records nothing; when E2's sandbox
    is lost (``unknown``), the next resume restores the recorded bank, not E1's later files.
    Proves ``scratchbank.application.run_lock.start_run``."""
    rig = Rig()
    e1, grant = start_run(gated_runs.RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
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
    execution's (today's meaning). Proves ``scratchbank.application.run_lock.start_run``."""
    rig = Rig()
    e1, grant = start_run(gated_runs.RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    report = rig.teardown(OLD, e1, lock=rig.lock, grant=grant)
    assert isinstance(report.record, ScratchBanked)
    assert report.record.execution == e1
    unnamed = Rig()
    unnamed.timeline.append(gated_runs.RUN, [RunResumed()])
    legacy = unnamed.teardown(OLD, None)
    assert legacy.recorded
    assert legacy.execution == "@0"


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_A16_a_resume_while_another_restores_is_locked_out_and_one_run_resumed_is_recorded(
    store: str, tmp_path: Path
) -> None:
    """A reads, claims and is restoring when B reads: B is RUN_LOCKED (before: B claimed a
    second ``run_resumed`` and A's restore record was refused RESUME_SUPERSEDED)."""
    rig = Rig(SqliteRunLock(tmp_path / "t.locks") if store == "sqlite" else None)
    e1, grant = start_run(gated_runs.RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
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
    e1, grant = start_run(gated_runs.RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    slow = GatedSandbox({}, gate="restore")
    thread, _ = in_thread(lambda: rig.resume(slow, lock=None))
    assert slow.begun.wait(WAIT)
    with pytest.raises(RunLocked):
        rig.resume(FakeSandbox({}), lock=None)
    slow.go.set()
    thread.join(WAIT)
    assert [type(r) for r in rig.records()].count(RunResumed) == 1


def test_A16_R2_a_sandbox_lost_without_a_teardown_and_the_next_resume_under_the_lock() -> None:
    """E2 dies without a teardown (its lease lapses). The next resume takes the lock over,
    is not refused for the missing record, and still refuses by R2 (a node ran in the
    sandbox after the bank), saying which execution's teardown it decided without.
    Proves ``scratchbank.application.run_lock.start_run``."""
    rig = Rig()
    e1, grant = start_run(gated_runs.RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    e2 = rig.resume(FakeSandbox({}))
    rig.timeline.append(gated_runs.RUN, [node("fix", "agent", in_sandbox=True)])
    held = rig.lock.holder(gated_runs.RUN)
    assert held is not None
    assert held.holder == e2.execution
    rig.clock.advance(120)  # E2's process is gone: nobody refreshes; its lease lapses
    before = rig.records()
    out = rig.resume(FakeSandbox({}))
    assert out.decision.verdict is Verdict.REFUSE
    assert out.decision.rule == "R2"
    assert rig.records() == before  # a refusal writes nothing
    assert rig.lock.holder(gated_runs.RUN) is None  # and lets the lock go
    with pytest.raises(LockLost):
        rig.lock.refresh(e2.grant, ttl=60)  # E2 is fenced


def test_A16_X6_a_host_backed_scratch_never_banks_and_never_blocks_the_next_resume(tmp_path: Path) -> None:
    """A resume into a host directory (X6) ends the banking window; the execution's
    teardown skips (T1) and lets the lock go; the next resume goes on.
    Proves ``scratchbank.application.run_lock.start_run``."""
    rig = Rig()
    e1, grant = start_run(gated_runs.RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    out = rig.resume(None, host_directory=HostDirectory(tmp_path / "host"))
    assert out.proceeds
    assert out.grant is not None
    report = rig.teardown(
        None, out.execution, sandbox=FakeSandbox({}, host_backed=True), lock=rig.lock, grant=out.grant
    )
    assert not report.recorded
    assert rig.lock.holder(gated_runs.RUN) is None
    nxt = rig.resume(None, host_directory=HostDirectory(tmp_path / "host"))
    assert nxt.proceeds


def test_A16_X3_a_failed_restores_hold_lets_the_lock_go_and_the_next_resume_restores() -> None:
    """A restore that fails parks the run and holds the bank (X3): the resume lets the lock
    go; the failed sandbox's teardown banks nothing over the bank; the next resume restores.
    Proves ``scratchbank.application.run_lock.start_run``."""
    rig = Rig()
    e1, grant = start_run(gated_runs.RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    broken = FakeSandbox({})
    from scratchbank.domain.errors import StreamBroken

    broken.faults["restore"] = [StreamBroken("cut")]
    failed = rig.resume(broken)
    assert not failed.proceeds
    assert failed.grant is None
    assert rig.lock.holder(gated_runs.RUN) is None
    bank = objects(rig.store)
    held = rig.teardown({"work/a.txt": b"half"}, None)
    assert held.plan.rule == "X3"
    assert objects(rig.store) == bank
    target = FakeSandbox({})
    assert rig.resume(target).proceeds
    assert target.files == OLD


def test_A16_a_runner_holding_the_lease_resumes_without_contending_and_others_are_locked_out() -> None:
    """The runner hands its lease grant in: its resume never contends with its own holder;
    an engine-side resume elsewhere meets the live lease and is RUN_LOCKED.
    Proves ``scratchbank.application.run_lock.start_run``."""
    rig = Rig()
    e1, grant = start_run(gated_runs.RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    lease = InProcessLease(lapse=60.0)
    lease_grant = lease.acquire(gated_runs.RUN, "runner-a")
    assert lease_grant is not None
    handed = HandedLock(lease, lease_grant)
    mine = handed.acquire(gated_runs.RUN, "ignored", ttl=60)
    assert mine is not None
    target = FakeSandbox({})
    out = rig.resume(target, lock=handed, grant=mine)
    assert out.proceeds
    assert target.files == OLD
    with pytest.raises(RunLocked):
        rig.resume(FakeSandbox({}), lock=HandedLock(lease))
    assert lease.acquire(gated_runs.RUN, "runner-b") is None  # the resume left the runner's lease alone


def test_A16_A18_a_holder_past_its_ceiling_that_still_banks_is_found_not_dropped() -> None:
    """E1's lease lapses while its teardown's put is in flight (past its ceiling). E2
    takes the lock over and records that it decided without E1's teardown; E1's put lands
    but its record is superseded (named): the bytes stay in the store, nothing restores
    them in silence, and E1 is fenced. Proves ``scratchbank.application.run_lock.start_run``."""
    rig = Rig()
    rig.store = GatedStore()
    e1, grant = start_run(gated_runs.RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
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
    loose = rig.store.objects(gated_runs.RUN)
    assert len(loose) == 1  # the late bank is kept, not dropped ...
    assert loose[0].stamp is not None
    assert loose[0].stamp.execution == e1  # ... stamped with its execution (N3 finds it)
    status = ScratchService(rig.timeline, rig.store, clock=rig.clock, lock=rig.lock).status(gated_runs.RUN)
    assert status.unreferenced is not None
    listed = [*status.unreferenced.others, *status.unreferenced.unproven]
    assert status.unreferenced.record is None  # never recorded as E2's: it is E1's
    assert [o.name for o in listed] == [loose[0].name]  # status lists it
    with pytest.raises(LockLost):
        rig.lock.refresh(grant, ttl=60)


def test_A16_status_shows_the_lock_and_breaking_it_fences_the_old_holder(tmp_path: Path) -> None:
    """``status`` shows who holds the run's lock, since when, with which token; an
    operator's break ends it and the old holder's next refresh is LOCK_LOST."""
    from scratchbank.adapters.present import status_data, status_text

    rig = Rig(SqliteRunLock(tmp_path / "t.locks"))
    service = ScratchService(rig.timeline, rig.store, clock=rig.clock, lock=rig.lock)
    execution, grant = start_run(gated_runs.RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    report = service.status(gated_runs.RUN)
    assert report.lock is not None
    assert (report.lock.holder, report.lock.token, report.lock.live) == (execution, grant.token, True)
    data = status_data(report)["lock"]
    assert data["holder"] == execution
    assert data["token"] == grant.token
    assert any(f"lock: held by {execution}" in line for line in status_text(report))
    before = rig.records()
    broken = service.break_lock(gated_runs.RUN, by="test operator")
    assert broken is not None
    assert broken.holder == execution
    with pytest.raises(LockLost):
        rig.lock.refresh(grant, ttl=60)
    assert service.status(gated_runs.RUN).lock is None
    assert rig.records() == before  # breaking a lock writes nothing on the run


def test_A16_a_cli_resume_lets_the_lock_go_when_its_service_closes(tmp_path: Path) -> None:
    """An operator CLI resume holds the execution's lock only until its service closes: the
    next resume is not RUN_LOCKED for the rest of the lease.
    Proves ``scratchbank.application.run_lock.start_run``."""
    from scratchbank.adapters.bootstrap import close

    rig = Rig(SqliteRunLock(tmp_path / "t.locks"))
    e1, grant = start_run(gated_runs.RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    cli = ScratchService(rig.timeline, rig.store, clock=rig.clock, lock=rig.lock)
    out = cli.resume(gated_runs.RUN, ResumeRequest(), Target(FakeSandbox({})))
    assert out.proceeds
    held = rig.lock.holder(gated_runs.RUN)
    assert held is not None and held.holder == out.execution  # held while the CLI runs
    close(cli)
    assert rig.lock.holder(gated_runs.RUN) is None
    nxt = ScratchService(rig.timeline, rig.store, clock=rig.clock, lock=rig.lock)
    again = nxt.resume(gated_runs.RUN, ResumeRequest(), Target(FakeSandbox({})))  # before: RunLocked
    assert again.decision.verdict is not None
    close(nxt)


def test_A16_T3_a_run_is_deleted_under_its_lock_never_under_a_banking_teardown(tmp_path: Path) -> None:
    """Deleting a run (T3's sweep) takes the run's lock: while an execution's teardown still
    banks it is RUN_LOCKED and sweeps nothing; once the teardown recorded, it sweeps all
    (before: ``old:T.read > delete:S.sweep > old:S.put > old:T.append`` left an object).
    Proves ``scratchbank.application.run_lock.start_run``."""
    rig = Rig(SqliteRunLock(tmp_path / "t.locks"))
    service = ScratchService(rig.timeline, rig.store, clock=rig.clock, lock=rig.lock)
    e1, grant = start_run(gated_runs.RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    slow = GatedSandbox(OLD, gate="archive")
    thread, got = in_thread(lambda: rig.teardown(None, e1, sandbox=slow, lock=rig.lock, grant=grant))
    assert slow.begun.wait(WAIT)
    before = objects(rig.store)
    with pytest.raises(RunLocked):
        service.delete_run(gated_runs.RUN)
    assert objects(rig.store) == before  # the refusal swept nothing
    slow.go.set()
    thread.join(WAIT)
    assert not isinstance(got[0], BaseException) and got[0].recorded, got
    assert list(rig.store.objects(gated_runs.RUN))  # the teardown's bank landed, after no sweep
    service.delete_run(gated_runs.RUN)
    assert list(rig.store.objects(gated_runs.RUN)) == []
    assert rig.lock.holder(gated_runs.RUN) is None  # the deletion let its lock go


# ---- from tests/test_resume_use_case.py: The resume and restore use cases end to end, with fakes (R and X rules).


def test_A15_a_restore_with_no_target_is_refused_before_anything_is_written() -> None:
    """A restore with no target is refused before anything is written:
    ``scratchbank.application.resume.resume``."""
    w = World()
    w.park()
    before = checksum(w)
    with pytest.raises(NoRestoreTarget) as raised:
        resume("run-1", ResumeRequest(), timeline=w.timeline, store=w.store)
    assert raised.value.code == "NO_RESTORE_TARGET" and "--sandbox" in raised.value.remedy
    with pytest.raises(NoRestoreTarget):  # accepting the loss does not forsake it for lack of a target
        resume("run-1", ACCEPT, timeline=w.timeline, store=w.store)
    assert checksum(w) == before


def test_A15_without_a_restore_to_make_no_target_is_needed() -> None:
    """Nothing to restore (no bank): a resume with no target goes on (T1).
    Proves ``scratchbank.application.resume.resume``."""
    w = World()
    out = resume("run-1", ResumeRequest(), timeline=w.timeline, store=w.store)
    assert out.proceeds and out.decision.verdict is Verdict.GO_ON_WITHOUT


# ---- from tests/test_runner_claims.py: The runner on the engine's claim API: the resume's claim and the fenced writer compose.


def test_A18_the_runners_teardown_names_the_execution_its_resume_started(tmp_path: Path) -> None:
    """A runner execution's teardown names its own execution (A18): once a newer one
    started, it is superseded and records nothing over the newer execution.
    Proves ``scratchbank.application.runner.Runner.run_once``."""
    tl, rig = _parked_and_banked(tmp_path)
    rig.engine = _AnotherExecutionDuringTheEngine(rig.engine, tl)  # type: ignore[assignment]
    handled = rig.runner().run_once(1)
    assert handled is not None and handled.teardown is not None, handled
    ours = [r for r in tl.read(claiming_runner.RUN) if isinstance(r, RunResumed)][-2]
    assert ours.execution and handled.teardown.execution == ours.execution
    assert handled.teardown.superseded and not handled.teardown.recorded
    assert tl.read(claiming_runner.RUN)[-1] == RunResumed(attempt="cli", execution="the-newer-one")


# ---- from tests/test_snapshots.py: Snapshots of the fold on the event store: same decisions, faster on long histories.


def test_A18_a_teardown_of_an_older_execution_is_still_superseded_from_the_snapshot(tmp_path: Path) -> None:
    """Naming an execution that is not the latest: superseded by the newer one, as before.
    Proves ``scratchbank.domain.objects.object_name``."""
    timeline, _, _, _ = long_run_with_tail(tmp_path)
    first = _first_read(timeline, "run-1", "@0", Budgets(), ManualClock(), [], snapshots=timeline)
    whole = _first_read(timeline, "run-1", "@0", Budgets(), ManualClock(), [])
    assert first.why_not == whole.why_not != ""
    missing = _first_read(timeline, "run-1", "nobody", Budgets(), ManualClock(), [], snapshots=timeline)
    assert "no execution" in missing.why_not


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


def test_A17_the_prune_after_a_record_reads_the_snapshot_and_the_tail(tmp_path: Path) -> None:
    """prune on a long run: the old bank a record before the snapshot named goes, no whole read.
    Proves ``scratchbank.domain.objects.digest_of``."""
    timeline, store, old, new = long_run_refusing_whole_reads(tmp_path)
    record = attrs.evolve(banked(sha256=digest_of(new)), object=new)
    length = timeline.append("run-1", [record])
    timeline.handed = 0
    notes: list[str] = []
    gone = prune(store, timeline, Claim("run-1", length), notes, snapshots=timeline)
    assert timeline.handed <= TAIL + 2 and notes == []
    assert gone == (old,) and {o.name for o in store.objects("run-1")} == {new}


def test_A16_the_product_carries_no_test_only_keep_alive_and_the_explorer_refreshes_nothing() -> None:
    """HeldLock always refreshes (no ``keep_alive`` flag in the product, issue 22 item 4);
    the explorer's services (testing kit: StillHeldLock) hold a handed grant with no thread."""
    import inspect
    import threading

    from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
    from scratchbank.application.run_lock import HeldLock, MemoryRunLock
    from scratchbank.testing import interleavings

    assert "keep_alive" not in inspect.signature(HeldLock).parameters
    assert "keep_alive" not in inspect.signature(ScratchService.hand_over).parameters
    lock = MemoryRunLock(ManualClock())
    grant = lock.acquire("run-1", "x-1", ttl=60)
    assert grant is not None
    mine = interleavings.service(InMemoryTimeline(), InMemoryBankStore(), lock=lock)
    threads = threading.active_count()
    interleavings.hand(mine, grant)
    assert threading.active_count() == threads  # nothing refreshes it
    mine.let_go()
    assert lock.holder("run-1") is None
