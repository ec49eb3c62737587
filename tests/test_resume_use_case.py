"""The resume and restore use cases end to end, with fakes (R and X rules)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.ports import StoredBank
from scratchbank.application.resume import ResumeOutcome, resume
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import (
    SCRATCH_NOT_PORTABLE,
    Consents,
    RestoreAttempt,
    RestoreResult,
    ResumeRequest,
    Verdict,
    Where,
    after_restore,
    decide_resume,
    fold,
)
from scratchbank.domain.errors import (
    BankGone,
    BankReadFailed,
    HostileArchive,
    NoRestoreTarget,
    RestoreRefused,
    ResumeSuperseded,
    RunNotFound,
    SandboxGone,
    StreamBroken,
    TimelineWriteFailed,
)
from scratchbank.domain.records import NodeFinished, Record, RunResumed, ScratchBanked, ScratchRestored
from scratchbank.testing.builders import banked, node, resumed, started
from scratchbank.testing.clocks import ManualClock

FILES = {"verify.sh": b"#!/bin/sh\n", "clone/README": b"docs"}
ACCEPT = ResumeRequest(consents=Consents(accept_scratch_loss=True))


class World:
    """One run: a timeline, a bank store, and its sandboxes."""

    def __init__(self) -> None:
        self.timeline = InMemoryTimeline()
        self.store = InMemoryBankStore()
        self.timeline.append("run-1", [started(), node("clone", "tool")])

    def park(self, files: dict[str, bytes] | None = None) -> None:
        bank_at_teardown(
            "run-1",
            timeline=self.timeline,
            store=self.store,
            sandbox=FakeSandbox(dict(files or FILES)),
            run_finished=False,
        )

    def resume(
        self, request: ResumeRequest = ResumeRequest(), sandbox: FakeSandbox | None = None, **kw: object
    ) -> tuple[ResumeOutcome, FakeSandbox]:
        box = sandbox if sandbox is not None else FakeSandbox({})
        out = resume("run-1", request, timeline=self.timeline, store=self.store, sandbox=box, **kw)  # type: ignore[arg-type]
        return out, box

    def last(self) -> Record:
        return self.timeline.read("run-1")[-1]


def test_X1_the_bank_is_restored_before_the_first_node_and_recorded() -> None:
    w = World()
    w.park()
    out, box = w.resume()
    assert out.proceeds and box.files == FILES
    rec = w.last()
    assert isinstance(rec, ScratchRestored) and rec.restored and not rec.stale


def test_R2_a_stale_bank_is_refused_before_anything_moves_the_run() -> None:
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
    w = World()
    out, _ = w.resume(ResumeRequest(where=Where.SURFACE))
    assert out.decision.verdict is Verdict.DEFER_TO_ENGINE and not out.proceeds


def test_X4_a_bank_that_is_gone_parks_scratch_not_portable_and_holds() -> None:
    w = World()
    w.park()
    w.store.sweep("run-1")
    out, _ = w.resume()
    assert out.restore is not None and out.restore.park is not None
    assert out.restore.park.code == SCRATCH_NOT_PORTABLE and out.restore.hold
    assert fold(w.timeline.read("run-1")).hold is not None
    out, box = w.resume(ACCEPT)
    assert out.proceeds and box.files == {}
    assert fold(w.timeline.read("run-1")).forsaken is not None


def test_X4_a_resume_without_a_sandbox_on_purpose_parks_scratch_not_portable() -> None:
    w = World()
    w.park()
    out = resume("run-1", ResumeRequest(), timeline=w.timeline, store=w.store, without_sandbox=True)
    assert out.restore is not None and out.restore.park is not None
    assert out.restore.park.code == SCRATCH_NOT_PORTABLE


def test_X4_a_bank_replaced_without_its_record_is_never_restored_as_recorded() -> None:
    """The banking process was killed between the upload and the record (N3)."""
    w = World()
    w.park()
    w.timeline.append("run-1", [])
    other = World()
    other.park({"other": b"unrecorded"})
    bank = fold(w.timeline.read("run-1")).bank
    assert bank is not None and bank.record.object is not None
    w.store.stored["run-1"][bank.record.object] = other.store.only("run-1") or b""  # changed in the store
    out, box = w.resume()
    assert out.restore is not None and out.restore.park is not None
    assert "BANK_MISMATCH" in out.restore.record.reason and box.files == {}
    w.store.sweep("run-1")
    assert w.store.objects("run-1") == []  # swept with the run


def test_X4_the_sandbox_refusing_the_bank_parks_with_the_code() -> None:
    from scratchbank.domain.errors import RestoreRefused

    w = World()
    w.park()
    box = FakeSandbox({})
    box.faults["restore"] = [RestoreRefused("disk full")]
    out, _ = w.resume(sandbox=box)
    assert out.restore is not None and out.restore.park is not None
    assert out.restore.park.code == SCRATCH_NOT_PORTABLE
    assert "disk full" in out.restore.record.reason


@pytest.mark.parametrize("fault", ["store", "stream"])
def test_X5_a_failed_read_parks_without_a_code_and_consent_does_not_skip_it(fault: str) -> None:
    w = World()
    w.park()
    box = FakeSandbox({})
    for request in (ResumeRequest(), ACCEPT):
        if fault == "store":
            w.store.fetch = _failing_fetch  # type: ignore[method-assign]
        else:
            box.faults["restore"] = [StreamBroken("kubectl exited 0 short")]
        out, _ = w.resume(request, sandbox=box)
        assert out.restore is not None and out.restore.park is not None
        assert out.restore.park.code is None and not out.proceeds


def _failing_fetch(*args: object, **kwargs: object) -> None:
    raise BankReadFailed("503 Slow Down")


def test_X2_a_partial_restore_is_refused_by_name() -> None:
    class Lossy(FakeSandbox):
        def staged_lines(self, tree: dict[str, tuple[str, bytes]]) -> list[str]:
            return super().staged_lines(tree)[:-1]  # a file lost on the way

    w = World()
    w.park()
    out, _ = w.resume(sandbox=Lossy({}))
    assert out.restore is not None and out.restore.park is not None
    assert "partial restore" in out.restore.record.reason


def test_X6_a_restore_into_a_host_directory_hands_the_scratch_over(tmp_path: Path) -> None:
    w = World()
    w.park()
    target = tmp_path / "host-scratch"
    out = resume(
        "run-1", ResumeRequest(), timeline=w.timeline, store=w.store, sandbox=None, host_directory=target
    )
    assert out.proceeds and (target / "clone/README").read_bytes() == b"docs"
    rec = w.last()
    assert isinstance(rec, ScratchRestored) and rec.host_backed
    w.timeline.append("run-1", [node("edit", "agent")])
    out2, _ = w.resume()
    assert out2.decision.verdict is Verdict.GO_ON_WITHOUT and out2.decision.rule == "X6"


def test_X7_a_stale_restore_whose_record_cannot_land_fails_without_a_code() -> None:
    w = World()
    w.park()
    w.timeline.append("run-1", [node("measure")])

    class Failing(InMemoryTimeline):
        calls = 0

        def append(self, run_id, records, *, expected=None):  # type: ignore[no-untyped-def]
            Failing.calls += 1
            if Failing.calls > 1:
                raise TimelineWriteFailed("down")
            return w.timeline.append(run_id, records, expected=expected)

        def read(self, run_id):  # type: ignore[no-untyped-def]
            return w.timeline.read(run_id)

    out = resume(
        "run-1", ACCEPT, timeline=Failing(), store=w.store, sandbox=FakeSandbox({}), clock=ManualClock()
    )
    assert out.restore is not None and out.restore.must_record
    assert not out.recorded and not out.proceeds
    # the next resume restores the bank again: the stale restore was never recorded
    out2, box = w.resume(ACCEPT)
    assert out2.proceeds and box.files == FILES


def test_R13_accepting_an_unbanked_loss_records_it_and_goes_on() -> None:
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


def test_X4_X5_a_failed_restores_record_names_what_failed() -> None:
    """after_restore: each failed result writes a record whose reason leads with its own name,
    one distinct reason per result (what an operator reads in the timeline)."""
    decision = decide_resume(
        fold([started(), node("clone", "tool", in_sandbox=True), banked()]), ResumeRequest()
    )
    assert decision.verdict is Verdict.RESTORE, decision
    reasons: dict[RestoreResult, str] = {}
    for result in RestoreResult:
        if result is RestoreResult.RESTORED:
            continue
        out = after_restore(decision, RestoreAttempt(result, detail="why"))
        assert out.record.reason == f"{result.name.lower()}: why", out.record
        reasons[result] = out.record.reason
    assert len(set(reasons.values())) == len(reasons)


# ---- A15, RUN_NOT_FOUND: refused before anything is written -----------------------


def checksum(w: World) -> str:
    """What a refusal must leave as it was: the run's records and every bank's bytes."""
    import hashlib

    from scratchbank.domain.wire import encode

    digest = hashlib.sha256(repr([encode(r) for r in w.timeline.read("run-1")]).encode())
    for run_id, data in sorted(w.store.banks.items()):
        digest.update(run_id.encode() + data)
    return digest.hexdigest()


def test_A15_a_restore_with_no_target_is_refused_before_anything_is_written() -> None:
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
    """Nothing to restore (no bank): a resume with no target goes on (T1)."""
    w = World()
    out = resume("run-1", ResumeRequest(), timeline=w.timeline, store=w.store)
    assert out.proceeds and out.decision.verdict is Verdict.GO_ON_WITHOUT


def test_RUN_NOT_FOUND_an_empty_timeline_is_named_and_nothing_is_written() -> None:
    w = World()
    before = checksum(w)
    with pytest.raises(RunNotFound) as raised:
        resume("run-404", ResumeRequest(), timeline=w.timeline, store=w.store, sandbox=FakeSandbox({}))
    assert raised.value.code == "RUN_NOT_FOUND"
    assert w.timeline.read("run-404") == () and checksum(w) == before


def test_T6_X1_records_carry_the_time_of_the_clock_the_engine_gave() -> None:
    w = World()
    clock = ManualClock()
    clock.advance(90)
    bank_at_teardown(
        "run-1",
        timeline=w.timeline,
        store=w.store,
        sandbox=FakeSandbox(dict(FILES)),
        run_finished=False,
        clock=clock,
    )
    clock.advance(30)
    resume("run-1", ResumeRequest(), timeline=w.timeline, store=w.store, sandbox=FakeSandbox({}), clock=clock)
    banked_rec, resumed_rec, restored_rec = w.timeline.read("run-1")[-3:]
    assert banked_rec.at == ManualClock.EPOCH + timedelta(seconds=90)
    assert resumed_rec.at == restored_rec.at == ManualClock.EPOCH + timedelta(seconds=120)
    assert banked_rec.at.tzinfo is not None


# ---- Claims: read, decide, append at what was read (C7) -----------------------------


class Interloper(InMemoryTimeline):
    """A real timeline on which another writer appends ``cut_in`` right after this
    resume's first read: the race two resumes started together run, made certain."""

    def __init__(self, cut_in: list[Record]) -> None:
        super().__init__()
        self.cut_in = cut_in

    def read(self, run_id: str):  # type: ignore[no-untyped-def]
        records = super().read(run_id)
        if self.cut_in:
            super().append(run_id, self.cut_in, expected=len(records))
            self.cut_in = []
        return records


def interloped(cut_in: list[Record]) -> tuple[World, Interloper]:
    w = World()
    w.park()
    timeline = Interloper(cut_in)
    timeline.append("run-1", w.timeline.read("run-1"))
    w.timeline = timeline
    return w, timeline


def test_C7_a_resume_that_lost_its_claim_to_another_resume_writes_nothing() -> None:
    w, timeline = interloped([])
    records, banks = timeline.read("run-1"), w.store.objects("run-1")
    timeline.cut_in = [resumed("other")]
    box = FakeSandbox({})
    with pytest.raises(ResumeSuperseded) as raised:
        resume("run-1", ResumeRequest(), timeline=timeline, store=w.store, sandbox=box)
    assert raised.value.code == "RESUME_SUPERSEDED" and box.files == {}  # nothing restored
    assert timeline.read("run-1") == (*records, resumed("other"))  # only the winner's claim
    assert w.store.objects("run-1") == banks


def test_C7_a_conflict_that_took_nothing_is_read_and_decided_again() -> None:
    """Another writer appended a finish in the sandbox after the bank: deciding again
    on what the timeline now holds refuses R2, where a blind retry would restore."""
    w, timeline = interloped([node("measure", "agent")])
    box = FakeSandbox({})
    out = resume("run-1", ResumeRequest(), timeline=timeline, store=w.store, sandbox=box)
    assert out.decision.code == SCRATCH_NOT_PORTABLE and out.decision.rule == "R2"
    assert box.files == {} and isinstance(w.last(), NodeFinished)


def test_C7_a_teardown_recorded_first_is_decided_on_again() -> None:
    w, timeline = interloped([])
    other = World()
    other.park({"newer": b"bank"})
    newer = other.timeline.read("run-1")[-1]
    assert isinstance(newer, ScratchBanked) and newer.object is not None
    w.store.stored["run-1"][newer.object] = other.store.bank("run-1", newer.object) or b""
    timeline.cut_in = [newer]
    box = FakeSandbox({})
    out = resume("run-1", ResumeRequest(), timeline=timeline, store=w.store, sandbox=box)
    assert out.proceeds and box.files == {"newer": b"bank"}
    assert out.claim is not None and out.claim.position == len(timeline.read("run-1"))


def test_C7_fencing_a_resume_whose_run_was_taken_after_its_claim_writes_nothing_more() -> None:
    w = World()
    w.park()

    class TakenDuringRestore(FakeSandbox):
        def staged_lines(self, tree: dict[str, tuple[str, bytes]]) -> list[str]:
            w.timeline.append("run-1", [resumed("newer")])  # another attempt claims now
            return super().staged_lines(tree)

    with pytest.raises(ResumeSuperseded):
        w.resume(sandbox=TakenDuringRestore({}))
    records = w.timeline.read("run-1")
    assert isinstance(records[-1], RunResumed) and records[-1].attempt == "newer"
    assert not any(isinstance(r, ScratchRestored) for r in records)


def test_C7_a_claim_whose_write_landed_but_failed_on_the_way_back_is_not_written_twice() -> None:
    w = World()
    w.park()

    class LostAnswer(InMemoryTimeline):
        fail_next = False

        def append(self, run_id, records, *, expected=None):  # type: ignore[no-untyped-def]
            length = super().append(run_id, records, expected=expected)
            if LostAnswer.fail_next:
                LostAnswer.fail_next = False
                raise TimelineWriteFailed("connection reset after commit")
            return length

    timeline = LostAnswer()
    timeline.append("run-1", w.timeline.read("run-1"))
    LostAnswer.fail_next = True
    out = resume(
        "run-1",
        ResumeRequest(),
        timeline=timeline,
        store=w.store,
        sandbox=FakeSandbox({}),
        clock=ManualClock(),
    )
    assert out.proceeds
    kinds = [type(r).__name__ for r in timeline.read("run-1")]
    assert kinds.count("RunResumed") == 1 and kinds.count("ScratchRestored") == 1


# ---- No path ends without its record (X3, X4, X5) -----------------------------------

#: From RULES.md, not from the code: X4 (the bank is gone or does not extract, host or
#: sandbox) parks SCRATCH_NOT_PORTABLE; X5 (a read that fails on the way: store, the
#: stream into the sandbox; anything unnamed is read again) parks without a code.
X4, X5 = SCRATCH_NOT_PORTABLE, None


class FaultyStore(InMemoryBankStore):
    def __init__(self, fault: Exception | None = None, corrupt: bool = False) -> None:
        super().__init__()
        self.fault, self.corrupt = fault, corrupt

    def fetch(self, run_id, dest, *, max_bytes, name=None, deadline=None):  # type: ignore[no-untyped-def]
        if self.fault is not None:
            raise self.fault
        if self.corrupt:
            dest.write(b"\x1f\x8b" + b"\x00" * 64)
            return StoredBank(66, "0" * 64)
        return super().fetch(run_id, dest, max_bytes=max_bytes, name=name, deadline=deadline)


class FaultySandbox(FakeSandbox):
    def __init__(self, at: str, fault: Exception) -> None:
        super().__init__({})
        self.at, self.fault = at, fault

    def stage_restore(self, src, *, compressed, listing, need_bytes=0):  # type: ignore[no-untyped-def]
        if self.at == "restore":
            src.read(1 << 10)
            raise self.fault
        return super().stage_restore(src, compressed=compressed, listing=listing, need_bytes=need_bytes)

    def staged_lines(self, tree: dict[str, tuple[str, bytes]]) -> list[str]:
        if self.at == "list":
            raise self.fault
        return super().staged_lines(tree)


RESTORE_STEPS = [
    ("fetch: gone", FaultyStore(BankGone("NoSuchKey")), None, X4),
    ("fetch: 503", FaultyStore(BankReadFailed("503 Slow Down")), None, X5),
    ("fetch: past the cap", FaultyStore(HostileArchive("over the cap")), None, X4),
    ("fetch: a bug", FaultyStore(RuntimeError("boom")), None, X5),
    ("host check: corrupt", FaultyStore(corrupt=True), None, X4),
    ("stream in: broke", None, FaultySandbox("restore", StreamBroken("kubectl exited 0 short")), X5),
    ("stream in: tar refused", None, FaultySandbox("restore", RestoreRefused("disk full")), X4),
    ("stream in: sandbox gone", None, FaultySandbox("restore", SandboxGone("pod deleted")), X5),
    ("stream in: an OS error", None, FaultySandbox("restore", OSError(5, "EIO")), X5),
    ("listing: a crash", None, FaultySandbox("list", ValueError("not enough values to unpack")), X5),
]


@pytest.mark.parametrize(("step", "store", "box", "code"), RESTORE_STEPS, ids=[s[0] for s in RESTORE_STEPS])
def test_X3_X4_X5_a_fault_at_any_step_of_the_restore_ends_with_its_record_hold_and_park(
    step: str, store: FaultyStore | None, box: FaultySandbox | None, code: str | None
) -> None:
    w = World()
    w.park()
    if store is not None:
        store.banks = w.store.banks
        w.store = store
    out, _ = w.resume(sandbox=box if box is not None else FakeSandbox({}))
    records = w.timeline.read("run-1")
    assert isinstance(records[-2], RunResumed)
    rec = records[-1]
    assert isinstance(rec, ScratchRestored) and not rec.restored and rec.reason
    assert out.restore is not None and out.restore.park is not None and out.restore.hold
    assert out.restore.park.code == code and not out.proceeds
    assert fold(records).hold is not None  # X3: the failed sandbox banks nothing over it


def test_X3_X4_a_host_directory_that_cannot_be_written_ends_with_its_record(tmp_path: Path) -> None:
    """X2/X4: like a sandbox's tar that cannot create the scratch, a host directory that
    cannot be created is a refusal by name (DESTINATION_REFUSED), not a read to retry."""
    w = World()
    w.park()
    (tmp_path / "a-file").write_text("not a directory")
    target = tmp_path / "a-file" / "scratch"
    out = resume("run-1", ResumeRequest(), timeline=w.timeline, store=w.store, host_directory=target)
    rec = w.last()
    assert isinstance(rec, ScratchRestored) and not rec.restored and not rec.host_backed
    assert (
        out.restore is not None
        and out.restore.park is not None
        and out.restore.park.code == SCRATCH_NOT_PORTABLE
    )
    assert fold(w.timeline.read("run-1")).hold is not None
