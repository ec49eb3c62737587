"""The teardown banking use case under faults, with fakes (T1-T20). Each test names the
expected outcome and checks that nothing was lost."""

from __future__ import annotations

import asyncio
import hashlib
import io
import threading
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from async_engine import bank_at_teardown_shielded
from waiting import eventually

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.cancellation import Deadline
from scratchbank.application.ports import QuiescedArchive, QuiesceReport, StoredBank
from scratchbank.application.teardown import (
    Budgets,
    NothingRecorded,
    bank_at_teardown,
)
from scratchbank.domain import ResumeRequest, Verdict, decide_resume, fold
from scratchbank.domain.errors import (
    ArchiveFailed,
    BankWriteFailed,
    ExecFailed,
    SandboxGone,
    StreamBroken,
    TimelineWriteFailed,
)
from scratchbank.domain.objects import BankStamp
from scratchbank.domain.records import Record, ScratchBanked, UnknownRecord
from scratchbank.domain.teardown import TeardownAction
from scratchbank.testing.builders import banked, restore_failed, resumed, started
from scratchbank.testing.clocks import ManualClock

FILES = {"verify.sh": b"#!/bin/sh\nexit 0\n", "measure.json": b'{"floor": 12}'}


FakeClock = ManualClock


class FlakyStore(InMemoryBankStore):
    def __init__(self, fail_puts: int = 0) -> None:
        super().__init__()
        self.fail_puts = fail_puts
        self.put_digests: list[str] = []

    def put(
        self,
        run_id: str,
        archive: Path,
        *,
        sha256: str,
        stamp: BankStamp | None = None,
        deadline: Deadline | None = None,
    ) -> str:
        self.put_digests.append(hashlib.sha256(archive.read_bytes()).hexdigest())
        if self.fail_puts:
            self.fail_puts -= 1
            raise BankWriteFailed("store blip")
        return super().put(run_id, archive, sha256=sha256, stamp=stamp, deadline=deadline)


class FlakyTimeline(InMemoryTimeline):
    def __init__(self, clock: FakeClock, fail_appends: int = 0) -> None:
        super().__init__()
        self.clock, self.fail_appends = clock, fail_appends

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        if self.fail_appends:
            self.fail_appends -= 1
            raise TimelineWriteFailed("store failing over")
        return super().append(run_id, records, expected=expected)


def teardown(
    sandbox: FakeSandbox,
    *,
    history: Sequence[Record] = (started(),),
    store: InMemoryBankStore | None = None,
    timeline: InMemoryTimeline | None = None,
    clock: FakeClock | None = None,
    finished: bool = False,
    **budgets: object,
):  # type: ignore[no-untyped-def]
    clock = clock or FakeClock()
    timeline = timeline if timeline is not None else InMemoryTimeline()
    store = store if store is not None else InMemoryBankStore()
    timeline.append("run-1", list(history))
    report = bank_at_teardown(
        "run-1",
        timeline=timeline,
        store=store,
        sandbox=sandbox,
        run_finished=finished,
        budgets=Budgets(**budgets),
        clock=clock,  # type: ignore[arg-type]
    )
    return report, timeline, store


def last_record(timeline: InMemoryTimeline) -> ScratchBanked:
    rec = timeline.read("run-1")[-1]
    assert isinstance(rec, ScratchBanked)
    return rec


def test_T1_T6_a_park_banks_the_scratch_and_records_it_with_digest_and_manifest() -> None:
    box = FakeSandbox(dict(FILES))
    report, timeline, store = teardown(box)
    rec = last_record(timeline)
    assert report.recorded and rec.banked and rec.bytes == len(store.only("run-1"))
    assert rec.sha256 == hashlib.sha256(store.only("run-1")).hexdigest()
    assert rec.manifest_entries == 2 and rec.manifest_bytes == sum(map(len, FILES.values()))
    assert not rec.unquiesced
    assert box.quiesces == 1 and box.continued == 1 and not box.stopped


def test_T1_host_backed_scratch_is_never_banked() -> None:
    report, timeline, store = teardown(FakeSandbox(dict(FILES), host_backed=True))
    assert report.plan.action is TeardownAction.SKIP and not report.record.banked
    assert report.record == NothingRecorded("skipped", report.plan.reason)  # named, never None
    assert store.stored == {} and len(timeline.read("run-1")) == 1


def test_T5_a_finished_run_drops_its_bank() -> None:
    store = InMemoryBankStore()
    store.banks["run-1"] = b"old"
    report, timeline, _ = teardown(FakeSandbox(dict(FILES)), store=store, finished=True)
    assert report.plan.action is TeardownAction.DROP
    assert store.stored == {} and last_record(timeline).finished


def test_T4_an_empty_scratch_deletes_the_previous_bank() -> None:
    store = InMemoryBankStore()
    store.banks["run-1"] = b"old"
    _, timeline, _ = teardown(FakeSandbox({}), store=store, history=(started(), banked()))
    assert store.stored == {} and last_record(timeline).empty
    assert fold(timeline.read("run-1")).bank is None


def test_T11_T13_a_sandbox_not_isolated_is_not_quiesced_and_recorded_unquiesced() -> None:
    box = FakeSandbox(dict(FILES), isolated=False)
    _, timeline, _ = teardown(box)
    rec = last_record(timeline)
    assert rec.banked and rec.unquiesced and rec.quiesce_reason == "fake"
    assert box.quiesces == 0


def test_T8_an_exec_blip_on_the_first_try_is_tried_again() -> None:
    box = FakeSandbox(dict(FILES))
    box.faults["archive"] = [ExecFailed("blip"), None]
    report, timeline, _ = teardown(box)
    assert [t.seen.name for t in report.tries] == ["UNKNOWN", "FILES"]
    assert last_record(timeline).banked
    assert box.continued == 2  # continued after each try


def test_T8_a_failed_tar_then_success_banks() -> None:
    box = FakeSandbox(dict(FILES))
    box.faults["archive"] = [ArchiveFailed("tar: ./x: Cannot open"), None]
    report, timeline, _ = teardown(box)
    assert last_record(timeline).banked and len(report.tries) == 2


def test_T8_failures_past_the_tries_record_files_not_banked_with_the_reason() -> None:
    box = FakeSandbox(dict(FILES))
    box.faults["archive"] = [ArchiveFailed("tar broke")] * 3
    _, timeline, store = teardown(box)
    rec = last_record(timeline)
    assert rec.files_unbanked and "tar broke" in rec.reason
    assert store.stored == {}
    assert decide_resume(fold(timeline.read("run-1")), ResumeRequest()).refused  # R1


def test_T10_an_upload_is_retried_on_the_same_archive() -> None:
    box = FakeSandbox(dict(FILES))
    store = FlakyStore(fail_puts=2)
    report, timeline, _ = teardown(box, store=store)
    assert box.archives == 1 and report.uploads == 3
    assert len(set(store.put_digests)) == 1  # the same bytes every time
    assert last_record(timeline).sha256 == store.put_digests[0]


def test_T8_record_retried_through_an_outage_shorter_than_its_budget() -> None:
    clock = FakeClock()
    timeline = FlakyTimeline(clock, fail_appends=0)
    timeline.append("run-1", [started()])
    timeline.fail_appends = 3
    report = bank_at_teardown(
        "run-1",
        timeline=timeline,
        store=InMemoryBankStore(),
        sandbox=FakeSandbox(dict(FILES)),
        run_finished=False,
        clock=clock,
    )
    assert report.recorded and last_record(timeline).banked
    assert clock.slept[-3:] == [1.0, 2.0, 4.0]


def test_T8_record_outage_longer_than_its_budget_is_reported_and_the_bank_kept() -> None:
    clock = FakeClock()
    timeline = FlakyTimeline(clock)
    timeline.append("run-1", [started()])
    timeline.fail_appends = 1000
    store = InMemoryBankStore()
    report = bank_at_teardown(
        "run-1",
        timeline=timeline,
        store=store,
        sandbox=FakeSandbox(dict(FILES)),
        run_finished=False,
        clock=clock,
    )
    assert not report.recorded and "not written within its budget" in report.notes[-1]
    assert store.only("run-1") is not None  # N3: stored but not recorded; never restored as recorded
    assert max(clock.slept) <= 8.0


def test_T19_a_sandbox_gone_before_listing_is_unknown_and_keeps_the_earlier_bank() -> None:
    box = FakeSandbox(dict(FILES))
    box.gone = True
    store = InMemoryBankStore()
    store.banks["run-1"] = b"earlier"
    _, timeline, _ = teardown(box, store=store, history=(started(), banked(), resumed()))
    assert last_record(timeline).unknown
    assert store.only("run-1") == b"earlier"
    assert fold(timeline.read("run-1")).bank is not None


def test_T20_an_archive_over_the_cap_stores_nothing_and_names_why() -> None:
    box = FakeSandbox({"big": bytes(range(256)) * 4000})
    store = InMemoryBankStore()
    store.banks["run-1"] = b"earlier"
    report, timeline, _ = teardown(box, store=store, cap_bytes=1000)
    rec = last_record(timeline)
    assert not rec.banked and "cap" in rec.reason and rec.bytes > 1000
    assert [o.name for o in store.objects("run-1") if o.name is not None] == [] and len(report.tries) == 1
    assert store.only("run-1") is None  # A17: the legacy bank no record names is pruned once recorded


def test_T20_a_store_that_keeps_no_bank_names_it() -> None:
    _, timeline, _ = teardown(FakeSandbox(dict(FILES)), store=InMemoryBankStore(keeps_banks=False))
    assert "keeps no bank" in last_record(timeline).reason


def test_T16_a_writer_racing_until_the_budget_ends_banks_the_last_raced_archive() -> None:
    box = FakeSandbox(dict(FILES))
    box.races = [("./log",), ("./log",), ("./log", "./b")]
    report, timeline, _ = teardown(box)
    rec = last_record(timeline)
    assert report.tar_passes == 3 and rec.banked
    assert rec.raced == ("./log", "./b") and rec.raced_count == 2


def test_T16_a_clean_pass_after_a_race_is_banked_clean() -> None:
    box = FakeSandbox(dict(FILES))
    box.races = [("./log",), ()]
    report, timeline, _ = teardown(box)
    assert report.tar_passes == 2 and last_record(timeline).raced == ()


def test_T16_a_later_pass_that_fails_keeps_the_last_complete_archive() -> None:
    box = FakeSandbox(dict(FILES))
    box.races = [("./log",)]
    box.faults["archive"] = [None, ArchiveFailed("tar: ./x: short read")]
    _, timeline, _ = teardown(box)
    rec = last_record(timeline)
    assert rec.banked and rec.raced == ("./log",)


def test_T9_A7_a_later_try_that_knows_less_stops_and_records_what_the_earlier_saw() -> None:
    box = FakeSandbox(dict(FILES))
    box.faults["archive"] = [ArchiveFailed("tar broke"), SandboxGone("gone")]
    report, timeline, _ = teardown(box)
    rec = last_record(timeline)
    assert rec.files_unbanked and "tar broke" in rec.reason
    assert len(report.tries) == 2


def test_T14_processes_are_continued_whatever_happens() -> None:
    box = FakeSandbox(dict(FILES))
    box.faults["archive"] = [RuntimeError("bug")]
    with pytest.raises(RuntimeError):
        teardown(box)
    assert box.continued == 1 and not box.stopped


def test_X3_a_held_bank_is_not_banked_over() -> None:
    store = InMemoryBankStore()
    store.banks["run-1"] = b"held"
    report, timeline, _ = teardown(
        FakeSandbox(dict(FILES)), store=store, history=(started(), banked(), resumed(), restore_failed())
    )
    assert report.plan.rule == "X3" and store.only("run-1") == b"held"
    assert decide_resume(fold(timeline.read("run-1")), ResumeRequest()).verdict is Verdict.RESTORE


def test_T7_banking_lands_even_when_the_run_is_cancelled_mid_banking() -> None:
    gate, archiving = threading.Event(), threading.Event()

    class SlowSandbox(FakeSandbox):
        def archive(self, dest, *, compress, verify, deadline=None):  # type: ignore[no-untyped-def]
            archiving.set()
            gate.wait(60)
            return super().archive(dest, compress=compress, verify=verify, deadline=deadline)

    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-1", [started()])

    async def run() -> None:
        task = asyncio.ensure_future(
            bank_at_teardown_shielded(
                run_id="run-1",
                timeline=timeline,
                store=store,
                sandbox=SlowSandbox(dict(FILES)),
                run_finished=False,
            )
        )
        await asyncio.get_running_loop().run_in_executor(None, archiving.wait, 60)  # banking is under way
        task.cancel()  # the run's own cancellation (a drain, a lost lease)
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    eventually(lambda: len(timeline.read("run-1")) >= 2, what="the bank's record", interval=0.01)
    assert last_record(timeline).banked and store.only("run-1") is not None


def test_A18_a_timeline_unreadable_for_the_whole_record_budget_writes_nothing_blind() -> None:
    """Unnamed and never readable, the teardown cannot tell which execution it banks: it
    retries its first read within the record budget, then stores and records nothing (A18)."""

    class Unreadable(InMemoryTimeline):
        def read(self, run_id: str):  # type: ignore[no-untyped-def]
            from scratchbank.domain.errors import TimelineUnreadable

            raise TimelineUnreadable("down")

    timeline, store, clock = Unreadable(), InMemoryBankStore(), FakeClock()
    report = bank_at_teardown(
        "run-1",
        timeline=timeline,
        store=store,
        sandbox=FakeSandbox(dict(FILES)),
        run_finished=False,
        clock=clock,
    )
    assert store.only("run-1") is None and not report.recorded
    assert InMemoryTimeline.read(timeline, "run-1") == ()  # nothing written blind
    assert "cannot tell which execution it banks" in report.superseded
    assert sum(clock.slept) <= Budgets().record_seconds and len(clock.slept) >= 2  # retried within budget


def test_the_fake_store_round_trips() -> None:
    store = InMemoryBankStore()
    store.banks["r"] = b"abc"
    out = io.BytesIO()
    assert store.fetch("r", out, max_bytes=10) == StoredBank(3, hashlib.sha256(b"abc").hexdigest())


# ---- T16 whatever fails: the best complete archive seen so far is banked ------------


@pytest.mark.parametrize(
    "fault",
    [
        ExecFailed("exec blip"),
        StreamBroken("stream broke mid-archive"),
        SandboxGone("the pod was deleted"),
        ArchiveFailed("tar: ./x: short read"),
    ],
    ids=["exec blip", "broken stream", "sandbox gone", "tar failure"],
)
def test_T16_a_raced_pass_is_banked_when_the_next_pass_fails_for_any_reason(fault: Exception) -> None:
    box = FakeSandbox(dict(FILES))
    box.races = [("./log",)]
    box.faults["archive"] = [None, fault, fault, fault, fault, fault]
    _, timeline, store = teardown(box)
    rec = last_record(timeline)
    assert rec.banked and rec.raced == ("./log",) and store.only("run-1") is not None
    assert rec.sha256 == hashlib.sha256(store.only("run-1")).hexdigest()
    assert fold(timeline.read("run-1")).bank is not None  # R14 never reverts to an older bank


def test_T16_a_complete_archive_whose_upload_failed_is_banked_when_the_next_try_cannot_archive() -> None:
    box = FakeSandbox(dict(FILES))
    box.faults["archive"] = [None, ExecFailed("blip"), ExecFailed("blip")]
    store = FlakyStore(fail_puts=3)  # the first try's three uploads fail
    _, timeline, _ = teardown(box, store=store)
    rec = last_record(timeline)
    assert rec.banked and store.only("run-1")
    assert len(set(store.put_digests)) == 1  # T10: the same archive, never a new tar for it
    assert box.archives == 1


def test_T16_T20_budget_spent_after_a_raced_pass_still_banks_it() -> None:
    """The banking budget runs out during the second pass (the clock jumps): the first
    complete archive is banked, with its raced members named."""
    clock = FakeClock()

    class SlowSecondPass(FakeSandbox):
        def archive(self, dest, *, compress, verify, deadline=None):  # type: ignore[no-untyped-def]
            if self.archives == 1:
                clock.advance(400)  # past the 300 s banking budget
                raise StreamBroken("cut at its deadline")
            return super().archive(dest, compress=compress, verify=verify, deadline=deadline)

    box = SlowSecondPass(dict(FILES))
    box.races = [("./log",)]
    _, timeline, store = teardown(box, clock=clock)
    rec = last_record(timeline)
    assert rec.banked and rec.raced == ("./log",) and store.only("run-1") is not None


# ---- Claims: a teardown that lost the run writes nothing ----------------------------


class ClaimedDuringBanking(FakeSandbox):
    """While tar reads, another execution claims the run (a resume the engine allowed)."""

    def __init__(self, timeline: InMemoryTimeline, claim: Record) -> None:
        super().__init__(dict(FILES))
        self.timeline, self.claim = timeline, claim

    def archive(self, dest, *, compress, verify, deadline=None):  # type: ignore[no-untyped-def]
        self.timeline.append("run-1", [self.claim])
        return super().archive(dest, compress=compress, verify=verify, deadline=deadline)


@pytest.mark.parametrize("claim", [resumed("newer"), banked()], ids=["a resume", "another teardown"])
def test_C7_T6_a_teardown_that_lost_the_run_writes_and_uploads_nothing(claim: Record) -> None:
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    store.banks["run-1"] = b"the bank the newer record names"
    report, _, _ = teardown(ClaimedDuringBanking(timeline, claim), timeline=timeline, store=store)
    assert report.superseded.startswith("superseded") and not report.recorded
    assert timeline.read("run-1")[-1] == claim  # nothing after the winner's record
    assert store.only("run-1") == b"the bank the newer record names"


def test_C7_T6_a_conflict_that_took_nothing_is_planned_again_and_recorded() -> None:
    timeline = InMemoryTimeline()
    box = ClaimedDuringBanking(timeline, UnknownRecord(type="llm_usage", data={"tokens": 3}))
    report, _, store = teardown(box, timeline=timeline)
    assert report.recorded and not report.superseded
    assert last_record(timeline).banked and store.only("run-1") is not None


def test_X3_T6_a_hold_recorded_while_banking_is_honoured_at_the_record() -> None:
    timeline = InMemoryTimeline()
    box = ClaimedDuringBanking(timeline, restore_failed())
    report, _, _ = teardown(box, timeline=timeline, history=(started(), banked(), resumed()))
    assert not report.recorded and "X3" in report.superseded
    assert timeline.read("run-1")[-1] == restore_failed()


def test_T6_the_record_carries_the_clock_time() -> None:
    clock = FakeClock()
    clock.advance(42)
    _, timeline, _ = teardown(FakeSandbox(dict(FILES)), clock=clock)
    assert last_record(timeline).at == ManualClock.EPOCH + timedelta(seconds=42)


def test_T16_a_clean_archive_is_banked_before_a_later_one_that_raced() -> None:
    """Try 1 archives clean but cannot upload; try 2 races, then cannot archive again:
    the clean archive of try 1 is the one banked (a clean one, else the last that raced)."""

    class Growing(FakeSandbox):
        def archive(self, dest, *, compress, verify, deadline=None):  # type: ignore[no-untyped-def]
            assert self.files is not None
            self.files[f"log{self.archives}"] = b"more"
            return super().archive(dest, compress=compress, verify=verify, deadline=deadline)

    box = Growing(dict(FILES))
    box.races = [(), ("./log1",)]
    box.faults["archive"] = [None, None, ExecFailed("blip"), ExecFailed("blip")]
    store = FlakyStore(fail_puts=3)
    _, timeline, _ = teardown(box, store=store)
    rec = last_record(timeline)
    assert rec.banked and rec.raced == () and rec.manifest_entries == 3  # try 1: FILES + log0
    assert store.put_digests[-1] == store.put_digests[0] == rec.sha256


def test_T16_a_try_that_races_to_its_last_pass_banks_an_earlier_clean_archive() -> None:
    """Try 1 archives clean but cannot upload; try 2 races on every pass: the clean one."""

    class Growing(FakeSandbox):
        def archive(self, dest, *, compress, verify, deadline=None):  # type: ignore[no-untyped-def]
            assert self.files is not None
            self.files[f"log{self.archives}"] = b"more"
            return super().archive(dest, compress=compress, verify=verify, deadline=deadline)

    box = Growing(dict(FILES))
    box.races = [(), ("./log1",), ("./log2",), ("./log3",)]
    _, timeline, _ = teardown(box, store=FlakyStore(fail_puts=3))
    rec = last_record(timeline)
    assert box.archives == 4 and rec.banked and rec.raced == ()
    assert rec.manifest_entries == 3  # try 1's archive: FILES + log0


# ---- One call: quiesce, archive and continue (the scripted sandboxes' one exec) --------


class OneCallSandbox(FakeSandbox):
    """A fake with its own ``quiesce_and_archive``, as bank.sh behaves: it continues the
    processes itself after a pass that did not race; ``calls`` logs what the host asked."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(files)
        self.calls: list[str] = []
        self.verified: list[bool] = []

    def quiesce_and_archive(self, dest, *, budget_seconds, wait_seconds, compress, deadline=None):  # type: ignore[no-untyped-def]
        self.calls.append("bank")
        report = FakeSandbox.quiesce(self, budget_seconds=budget_seconds, wait_seconds=wait_seconds)
        try:
            archived = FakeSandbox.archive(self, dest, compress=compress, verify=not report.quiesced)
        except ArchiveFailed as error:
            return QuiescedArchive(report, None, report.refused, error)
        if report.refused or archived.raced:
            return QuiescedArchive(report, archived, report.refused)
        self.stopped = False
        return QuiescedArchive(report, archived, True)

    def archive(self, dest, *, compress, verify, deadline=None):  # type: ignore[no-untyped-def]
        self.calls.append("archive")
        self.verified.append(verify)
        return super().archive(dest, compress=compress, verify=verify, deadline=deadline)

    def continue_processes(self, *, deadline: Deadline | None = None) -> None:
        self.calls.append("continue")
        super().continue_processes(deadline=deadline)


def test_T11_T14_a_clean_quiesced_bank_is_one_call_the_sandbox_continues_itself() -> None:
    box = OneCallSandbox(dict(FILES))
    report, timeline, _ = teardown(box)
    rec = last_record(timeline)
    assert box.calls == ["bank"]
    assert rec.banked
    assert not rec.unquiesced
    assert report.quiesce is not None
    assert report.quiesce.quiesced
    assert not box.stopped


def test_T16_T14_a_quiesced_pass_that_raced_is_tarred_again_while_stopped_then_continued() -> None:
    """The first pass raced: the processes stay stopped for the next (unverified, since
    everything is stopped) plain pass; the host continues them once the passes end."""
    box = OneCallSandbox(dict(FILES))
    box.races = [("./log",), ()]
    report, timeline, _ = teardown(box)
    assert box.calls == ["bank", "archive", "continue"]
    assert box.verified == [False]
    assert report.tar_passes == 2
    assert last_record(timeline).raced == ()
    assert not box.stopped


def test_T14_a_failed_archive_after_the_quiesce_is_recorded_quiesced_and_continued_by_the_host() -> None:
    box = OneCallSandbox(dict(FILES))
    box.faults["archive"] = [ArchiveFailed("tar: ./x: Cannot open: Permission denied")]
    report, timeline, _ = teardown(box, bank_tries=1)
    assert box.calls == ["bank", "continue"]
    assert report.quiesce is not None
    assert report.quiesce.quiesced
    rec = last_record(timeline)
    assert rec.files_unbanked
    assert not rec.unquiesced
    assert not box.stopped


@pytest.mark.parametrize("make", [FakeSandbox, OneCallSandbox], ids=["three calls", "one call"])
def test_T12_a_refused_quiesce_stopped_nothing_and_nothing_is_continued(make: type[FakeSandbox]) -> None:
    """Refused before any signal (exit 3): nothing is continued either (RULES facts)."""
    box = make(dict(FILES))
    box.quiesce_report = QuiesceReport(False, True, ("this is the host's initial PID namespace",))
    _, timeline, _ = teardown(box)
    rec = last_record(timeline)
    assert rec.banked
    assert rec.unquiesced
    assert "initial PID namespace" in rec.quiesce_reason
    assert box.continued == 0
    assert not box.stopped


class StuckContinue(OneCallSandbox):
    """A continue that hangs until its deadline cuts it (a transport honouring it)."""

    def continue_processes(self, *, deadline: Deadline | None = None) -> None:
        self.calls.append("continue")
        assert deadline is not None and deadline.cancel is not None
        deadline.cancel.wait(30.0)  # the scope's cut; 30 s is a safety net only
        raise ExecFailed("the exec did not end within its deadline: cut")


def test_T14_a_continue_step_cut_at_its_budget_leaves_no_thread_behind() -> None:
    """The continue runs in a cancellation scope: cut at its budget, nothing it started
    outlives the teardown; the note says the continue failed."""
    box = StuckContinue(dict(FILES))
    box.races = [("./log",), ()]
    before = set(threading.enumerate())
    report, timeline, _ = teardown(box, continue_seconds=0.2)
    assert set(threading.enumerate()) <= before, "a thread outlived the teardown"
    assert box.calls[-1] == "continue"
    assert any("continuing processes failed" in note for note in report.notes)
    assert last_record(timeline).banked
