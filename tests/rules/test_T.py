"""Rules T: teardown: banking the scratch when a sandbox stops. The pure tier's tests of T1, T4, T5,
T6, T7, T8, T9, T10, T11, T12, T13, T14, T16, T19, T20 (tests/tiers.py: a file of tests/rules/ has
its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from datetime import timedelta

import attrs
import pytest
from async_engine import bank_at_teardown_shielded
from rigs.checkpoint_stamps import C1, C2, _teardown, bank_at, checkpoints_run
from rigs.hostile_banks import HOSTILE, HostileSandbox, bank_of
from rigs.resume_decisions import decide
from rigs.teardown_decisions import CLEAN, QUIET, RACED, plan
from rigs.teardown_world import (
    FILES,
    FakeClock,
    FlakyStore,
    FlakyTimeline,
    OneCallSandbox,
    StuckContinue,
    last_record,
    teardown,
)
from waiting import eventually

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.cancellation import Deadline
from scratchbank.application.ports import QuiesceReport
from scratchbank.application.resume import resume
from scratchbank.application.retry import Budget, Pauses, retry_within
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import (
    Archive,
    Quiesce,
    ResumeRequest,
    Seen,
    TeardownAction,
    TryOutcome,
    Verdict,
    decide_resume,
    fold,
    merge_try,
    teardown_record,
)
from scratchbank.domain.errors import ArchiveFailed, ExecFailed, SandboxGone, StreamBroken
from scratchbank.domain.records import ScratchBanked
from scratchbank.domain.teardown import (
    CAP_BYTES,
    RACED_NAMES_KEPT,
    deletes_bank,
    finished_record,
    over_cap,
    should_retar,
)
from scratchbank.testing.builders import banked, empty, node, restored, resumed, started, unknown
from scratchbank.testing.clocks import ManualClock

# ---- from tests/rules/test_[HT]*.py: One cancellation scope (issue 25, build item 0): a scope owns its deadline, its cancel and its threads, and joins them on exit; nothing outlives it silently. And ``retry_within``, the one retry loop (its ``again`` and ``stop``).


def test_T8_retry_within_tries_again_while_the_result_asks_and_stops_when_told() -> None:
    """``again`` repeats a result; ``stop(pause)`` gives up before a pause; tries bound it."""
    clock = ManualClock()
    made: list[int] = []

    def call(_d: Deadline) -> int:
        made.append(len(made))
        return len(made)

    got = retry_within(Budget.start(clock, 100.0), call, retry_on=(), again=lambda n: n < 3)
    assert got == 3 and clock.slept == [1.0, 2.0]
    made.clear()
    got = retry_within(
        Budget.start(clock, 100.0), call, retry_on=(), again=lambda _n: True, stop=lambda p: p >= 4.0
    )
    assert got == 3 and clock.slept[2:] == [1.0, 2.0]
    made.clear()
    got = retry_within(Budget.start(clock, 100.0), call, retry_on=(), again=lambda _n: True, tries=2)
    assert got == 2


def test_T8_retry_within_does_not_sleep_a_pause_of_zero() -> None:
    """A retry with no pause (a teardown deciding again after a conflict) records no sleep.
    Proves ``scratchbank.application.retry.retry_within``."""
    clock = ManualClock()
    calls = iter([KeyError("a"), KeyError("b"), "ok"])

    def call(_d: Deadline) -> str:
        item = next(calls)
        if isinstance(item, BaseException):
            raise item
        return item

    got = retry_within(Budget.start(clock, 10.0), call, retry_on=(KeyError,), pauses=Pauses(0.0, 0.0))
    assert got == "ok" and clock.slept == []


# ---- from tests/rules/test_[TX]*.py: Hostile bytes never cost a record (issue 10 hole 3): a parse failure at bank time still writes ``sandbox_scratch_banked`` (T6), and at resume the run parks with its restore record (X4), whatever the bytes make the parser do.


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_T6_a_bank_the_parser_chokes_on_is_still_recorded(case: str) -> None:
    """A bank the parser chokes on is still recorded:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-t", [started(), node("clone", "tool")])
    sandbox = HostileSandbox(bank_of(HOSTILE[case]))
    report = bank_at_teardown(
        "run-t", timeline=timeline, store=store, sandbox=sandbox, run_finished=False, clock=ManualClock()
    )
    last = timeline.read("run-t")[-1]
    assert isinstance(last, ScratchBanked) and report.recorded
    assert not last.banked and "refused on the host" in last.reason, last
    assert store.banks == {}


# ---- from tests/test_rules_checkpoints.py: Checkpoint stamps (ADR 0013): staleness read from the checkpoint itself (N1, N2, K1-K5).


def test_T4_K8_an_empty_scratch_drops_the_current_bank_but_not_older_checkpoints() -> None:
    """Empty at c2: a resume from c2 goes on without (T4), a rewind to c1 gets c1's bank.
    Proves ``scratchbank.domain.decide_resume``."""
    run = [started(), bank_at(C1, "1"), resumed(), node("b"), attrs.evolve(empty(), checkpoint=C2), resumed()]
    state = fold(run)
    assert state.bank is None
    at_c2 = decide_resume(state, ResumeRequest(checkpoint=C2))
    assert at_c2.verdict is Verdict.GO_ON_WITHOUT and at_c2.rule == "R14"
    at_c1 = decide_resume(state, ResumeRequest(checkpoint=C1))
    assert at_c1.verdict is Verdict.RESTORE and at_c1.rule == "K6"
    assert at_c1.bank is not None and at_c1.bank.record == bank_at(C1, "1")
    legacy = fold([started(), banked(), resumed(), empty(), resumed()])
    assert legacy.history == () and decide_resume(legacy, ResumeRequest()).rule == "R14"


def test_T5_K8_a_finished_run_keeps_no_checkpoint_bank() -> None:
    """A finished teardown forgets every checkpoint's bank. Proves ``scratchbank.domain.fold``."""
    from scratchbank.testing.builders import finished_teardown

    assert fold([*checkpoints_run(), finished_teardown()]).history == ()


def test_T4_K8_use_case_an_empty_teardown_keeps_the_older_checkpoint_bank() -> None:
    """An empty scratch at c2 leaves c1's object in the store (retained), none of its own.
    Proves ``scratchbank.application.resume.resume``."""
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-1", [started()])
    _teardown(timeline, store, {"a.txt": b"one"}, C1)
    _teardown(timeline, store, {}, C2)
    assert isinstance(timeline.read("run-1")[-2], ScratchBanked) and timeline.read("run-1")[-2].empty  # type: ignore[union-attr]
    assert len([o for o in store.objects("run-1") if o.name]) == 1
    box = FakeSandbox({})
    out = resume(
        "run-1",
        ResumeRequest(checkpoint=C1),
        timeline=timeline,
        store=store,
        sandbox=box,
        clock=ManualClock(),
    )
    assert out.decision.rule == "K6" and box.files == {"a.txt": b"one"}


# ---- from tests/test_rules_resume.py: The resume gate, rule by rule (R1-R15, S2-S4, C1-C2, C9-C10, A1-A12).


def test_T4_empty_teardown_means_nothing_to_restore() -> None:
    """Empty teardown means nothing to restore: ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), resumed(), restored(), empty(), node("a"))
    assert d.verdict is Verdict.GO_ON_WITHOUT


# ---- from tests/rules/test_[ATX]*.py: Teardown decisions, rule by rule (T1, T4-T6, T9, T11, T13, T16, T19, T20, X3, A7).


def test_T1_container_local_scratch_banks_at_park_or_failure() -> None:
    """Container local scratch banks at park or failure: ``scratchbank.domain.plan_teardown``."""
    p = plan((started(),))
    assert p.action is TeardownAction.BANK and p.rule == "T1"


def test_T1_host_backed_scratch_is_never_banked() -> None:
    """Host backed scratch is never banked: ``scratchbank.domain.plan_teardown``."""
    p = plan((started(),), host_backed=True)
    assert p.action is TeardownAction.SKIP and p.rule == "T1"


def test_T11_quiesce_only_when_process_isolated() -> None:
    """Quiesce only when process isolated: ``scratchbank.domain.plan_teardown``."""
    assert plan((started(),), isolated=True).quiesce
    assert not plan((started(),), isolated=False).quiesce


def test_T13_not_isolated_is_recorded_unquiesced() -> None:
    """Not isolated is recorded unquiesced: ``scratchbank.domain.teardown_record``."""
    rec = teardown_record(TryOutcome(Seen.FILES, CLEAN, stored=True), Quiesce(False, "not isolated"))
    assert rec.banked and rec.unquiesced and rec.quiesce_reason == "not isolated"
    assert not teardown_record(TryOutcome(Seen.FILES, CLEAN, stored=True), QUIET).unquiesced


def test_T5_finished_run_drops_its_bank() -> None:
    """Finished run drops its bank: ``scratchbank.domain.teardown.finished_record``."""
    p = plan((started(), banked()), finished=True)
    assert p.action is TeardownAction.DROP and p.rule == "T5"
    state = fold((started(), banked(), finished_record()))
    assert state.bank is None and state.unbanked is None


def test_T4_empty_scratch_deletes_the_previous_bank_and_is_recorded_empty() -> None:
    """Empty scratch deletes the previous bank and is recorded empty:
    ``scratchbank.domain.teardown.deletes_bank``."""
    final = TryOutcome(Seen.EMPTY)
    assert deletes_bank(final)
    rec = teardown_record(final, QUIET)
    assert rec.empty and not rec.banked and rec.bytes == 0
    assert fold((started(), banked(), rec)).bank is None
    assert not deletes_bank(TryOutcome(Seen.FILES, CLEAN, stored=True))


def test_T6_every_outcome_yields_one_record_with_the_required_members() -> None:
    """Every outcome yields one record with the required members: ``scratchbank.domain.teardown_record``."""
    for final in (
        TryOutcome(Seen.FILES, CLEAN, stored=True),
        TryOutcome(Seen.FILES, None, reason="tar failed"),
        TryOutcome(Seen.EMPTY),
        TryOutcome(Seen.UNKNOWN, reason="sandbox gone"),
    ):
        rec = teardown_record(final, QUIET)
        assert rec.outcomes() <= 1
        assert isinstance(rec.bytes, int) and isinstance(rec.reason, str)


def test_T9_later_try_never_replaces_what_an_earlier_saw_with_less() -> None:
    """Later try never replaces what an earlier saw with less: ``scratchbank.domain.merge_try``."""
    files = TryOutcome(Seen.FILES, None, reason="upload failed")
    merged = merge_try(files, TryOutcome(Seen.UNKNOWN, reason="exec blip"))
    assert merged.best is files
    merged = merge_try(TryOutcome(Seen.EMPTY), TryOutcome(Seen.UNKNOWN))
    assert merged.best.seen is Seen.EMPTY


def test_T8_a_curable_failure_tries_again() -> None:
    """A curable failure tries again: ``scratchbank.domain.merge_try``."""
    merged = merge_try(None, TryOutcome(Seen.FILES, None, reason="tar failed"))
    assert not merged.stop and merged.rule == "T8"
    merged = merge_try(merged.best, TryOutcome(Seen.FILES, CLEAN, stored=True))
    assert merged.stop and merged.best.stored


def test_T16_last_complete_archive_is_kept_clean_over_raced() -> None:
    """Last complete archive is kept clean over raced: ``scratchbank.domain.merge_try``."""
    raced = TryOutcome(Seen.FILES, RACED, stored=True)
    failed = TryOutcome(Seen.FILES, None, reason="tar failed")
    assert merge_try(raced, failed).best is raced
    clean = TryOutcome(Seen.FILES, CLEAN, stored=True)
    assert merge_try(failed, clean).best is clean


def test_T16_tar_runs_again_while_it_races_and_budget_allows() -> None:
    """Tar runs again while it races and budget allows: ``scratchbank.domain.teardown.should_retar``."""
    assert should_retar(raced=True, passes=1, last_pass_seconds=1.0, seconds_left=3.0)
    assert not should_retar(raced=True, passes=1, last_pass_seconds=1.0, seconds_left=2.9)
    assert not should_retar(raced=True, passes=3, last_pass_seconds=0.1, seconds_left=100)
    assert not should_retar(raced=False, passes=1, last_pass_seconds=0.1, seconds_left=100)


def test_T16_raced_members_are_named_on_the_record_capped_with_a_count() -> None:
    """Raced members are named on the record capped with a count: ``scratchbank.domain.teardown_record``."""
    names = tuple(f"./f{i}" for i in range(30))
    arch = Archive(bytes=9, sha256="c" * 64, raced=names)
    rec = teardown_record(TryOutcome(Seen.FILES, arch, stored=True), QUIET)
    assert rec.raced == names[:RACED_NAMES_KEPT] and rec.raced_count == 30


def test_T19_unknown_does_not_replace_an_earlier_bank() -> None:
    """Unknown does not replace an earlier bank: ``scratchbank.domain.teardown_record``."""
    rec = teardown_record(TryOutcome(Seen.UNKNOWN, reason="sandbox gone"), QUIET)
    assert rec.unknown
    state = fold((started(), banked(), resumed(), unknown()))
    assert state.bank is not None
    assert decide_resume(state, ResumeRequest()).verdict is Verdict.RESTORE


def test_T20_over_the_cap_nothing_is_stored_and_the_record_names_why() -> None:
    """Over the cap nothing is stored and the record names why: ``scratchbank.domain.teardown.over_cap``."""
    assert over_cap(CAP_BYTES + 1) and not over_cap(CAP_BYTES)
    big = Archive(bytes=CAP_BYTES + 1, sha256="d" * 64)
    rec = teardown_record(TryOutcome(Seen.FILES, big, stored=False, reason="over the cap"), QUIET)
    assert not rec.banked and rec.files_unbanked and "cap" in rec.reason
    assert rec.bytes == CAP_BYTES + 1


# ---- from tests/test_teardown_use_case.py: The teardown banking use case under faults, with fakes (T1-T20). Each test names the expected outcome and checks that nothing was lost.


def test_T1_T6_a_park_banks_the_scratch_and_records_it_with_digest_and_manifest() -> None:
    """A park banks the scratch and records it with digest and manifest:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    box = FakeSandbox(dict(FILES))
    report, timeline, store = teardown(box)
    rec = last_record(timeline)
    assert report.recorded and rec.banked and rec.bytes == len(store.only("run-1"))
    assert rec.sha256 == hashlib.sha256(store.only("run-1")).hexdigest()
    assert rec.manifest_entries == 2 and rec.manifest_bytes == sum(map(len, FILES.values()))
    assert not rec.unquiesced
    assert box.quiesces == 1 and box.continued == 1 and not box.stopped


def test_T5_a_finished_run_drops_its_bank() -> None:
    """A finished run drops its bank: ``scratchbank.application.teardown.bank_at_teardown``."""
    store = InMemoryBankStore()
    store.banks["run-1"] = b"old"
    report, timeline, _ = teardown(FakeSandbox(dict(FILES)), store=store, finished=True)
    assert report.plan.action is TeardownAction.DROP
    assert store.stored == {} and last_record(timeline).finished


def test_T4_an_empty_scratch_deletes_the_previous_bank() -> None:
    """An empty scratch deletes the previous bank: ``scratchbank.application.teardown.bank_at_teardown``."""
    store = InMemoryBankStore()
    store.banks["run-1"] = b"old"
    _, timeline, _ = teardown(FakeSandbox({}), store=store, history=(started(), banked()))
    assert store.stored == {} and last_record(timeline).empty
    assert fold(timeline.read("run-1")).bank is None


def test_T11_T13_a_sandbox_not_isolated_is_not_quiesced_and_recorded_unquiesced() -> None:
    """A sandbox not isolated is not quiesced and recorded unquiesced:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    box = FakeSandbox(dict(FILES), isolated=False)
    _, timeline, _ = teardown(box)
    rec = last_record(timeline)
    assert rec.banked and rec.unquiesced and rec.quiesce_reason == "fake"
    assert box.quiesces == 0


def test_T8_an_exec_blip_on_the_first_try_is_tried_again() -> None:
    """An exec blip on the first try is tried again: ``scratchbank.application.teardown.bank_at_teardown``."""
    box = FakeSandbox(dict(FILES))
    box.faults["archive"] = [ExecFailed("blip"), None]
    report, timeline, _ = teardown(box)
    assert [t.seen.name for t in report.tries] == ["UNKNOWN", "FILES"]
    assert last_record(timeline).banked
    assert box.continued == 2  # continued after each try


def test_T8_a_failed_tar_then_success_banks() -> None:
    """A failed tar then success banks: ``scratchbank.application.teardown.bank_at_teardown``."""
    box = FakeSandbox(dict(FILES))
    box.faults["archive"] = [ArchiveFailed("tar: ./x: Cannot open"), None]
    report, timeline, _ = teardown(box)
    assert last_record(timeline).banked and len(report.tries) == 2


def test_T8_failures_past_the_tries_record_files_not_banked_with_the_reason() -> None:
    """Failures past the tries record files not banked with the reason:
    ``scratchbank.domain.decide_resume``."""
    box = FakeSandbox(dict(FILES))
    box.faults["archive"] = [ArchiveFailed("tar broke")] * 3
    _, timeline, store = teardown(box)
    rec = last_record(timeline)
    assert rec.files_unbanked and "tar broke" in rec.reason
    assert store.stored == {}
    assert decide_resume(fold(timeline.read("run-1")), ResumeRequest()).refused  # R1


def test_T10_an_upload_is_retried_on_the_same_archive() -> None:
    """An upload is retried on the same archive: ``scratchbank.application.teardown.bank_at_teardown``."""
    box = FakeSandbox(dict(FILES))
    store = FlakyStore(fail_puts=2)
    report, timeline, _ = teardown(box, store=store)
    assert box.archives == 1 and report.uploads == 3
    assert len(set(store.put_digests)) == 1  # the same bytes every time
    assert last_record(timeline).sha256 == store.put_digests[0]


def test_T8_record_retried_through_an_outage_shorter_than_its_budget() -> None:
    """Record retried through an outage shorter than its budget:
    ``scratchbank.application.teardown.bank_at_teardown``."""
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
    """Record outage longer than its budget is reported and the bank kept:
    ``scratchbank.application.teardown.bank_at_teardown``."""
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
    """A sandbox gone before listing is unknown and keeps the earlier bank:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    box = FakeSandbox(dict(FILES))
    box.gone = True
    store = InMemoryBankStore()
    store.banks["run-1"] = b"earlier"
    _, timeline, _ = teardown(box, store=store, history=(started(), banked(), resumed()))
    assert last_record(timeline).unknown
    assert store.only("run-1") == b"earlier"
    assert fold(timeline.read("run-1")).bank is not None


def test_T20_an_archive_over_the_cap_stores_nothing_and_names_why() -> None:
    """An archive over the cap stores nothing and names why:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    box = FakeSandbox({"big": bytes(range(256)) * 4000})
    store = InMemoryBankStore()
    store.banks["run-1"] = b"earlier"
    report, timeline, _ = teardown(box, store=store, cap_bytes=1000)
    rec = last_record(timeline)
    assert not rec.banked and "cap" in rec.reason and rec.bytes > 1000
    assert [o.name for o in store.objects("run-1") if o.name is not None] == [] and len(report.tries) == 1
    assert store.only("run-1") is None  # A17: the legacy bank no record names is pruned once recorded


def test_T20_a_store_that_keeps_no_bank_names_it() -> None:
    """A store that keeps no bank names it: ``scratchbank.application.teardown.bank_at_teardown``."""
    _, timeline, _ = teardown(FakeSandbox(dict(FILES)), store=InMemoryBankStore(keeps_banks=False))
    assert "keeps no bank" in last_record(timeline).reason


def test_T16_a_writer_racing_until_the_budget_ends_banks_the_last_raced_archive() -> None:
    """A writer racing until the budget ends banks the last raced archive:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    box = FakeSandbox(dict(FILES))
    box.races = [("./log",), ("./log",), ("./log", "./b")]
    report, timeline, _ = teardown(box)
    rec = last_record(timeline)
    assert report.tar_passes == 3 and rec.banked
    assert rec.raced == ("./log", "./b") and rec.raced_count == 2


def test_T16_a_clean_pass_after_a_race_is_banked_clean() -> None:
    """A clean pass after a race is banked clean: ``scratchbank.application.teardown.bank_at_teardown``."""
    box = FakeSandbox(dict(FILES))
    box.races = [("./log",), ()]
    report, timeline, _ = teardown(box)
    assert report.tar_passes == 2 and last_record(timeline).raced == ()


def test_T16_a_later_pass_that_fails_keeps_the_last_complete_archive() -> None:
    """A later pass that fails keeps the last complete archive:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    box = FakeSandbox(dict(FILES))
    box.races = [("./log",)]
    box.faults["archive"] = [None, ArchiveFailed("tar: ./x: short read")]
    _, timeline, _ = teardown(box)
    rec = last_record(timeline)
    assert rec.banked and rec.raced == ("./log",)


def test_T9_A7_a_later_try_that_knows_less_stops_and_records_what_the_earlier_saw() -> None:
    """A later try that knows less stops and records what the earlier saw:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    box = FakeSandbox(dict(FILES))
    box.faults["archive"] = [ArchiveFailed("tar broke"), SandboxGone("gone")]
    report, timeline, _ = teardown(box)
    rec = last_record(timeline)
    assert rec.files_unbanked and "tar broke" in rec.reason
    assert len(report.tries) == 2


def test_T14_processes_are_continued_whatever_happens() -> None:
    """Processes are continued whatever happens: ``scratchbank.application.teardown.bank_at_teardown``."""
    box = FakeSandbox(dict(FILES))
    box.faults["archive"] = [RuntimeError("bug")]
    with pytest.raises(RuntimeError):
        teardown(box)
    assert box.continued == 1 and not box.stopped


def test_T7_banking_lands_even_when_the_run_is_cancelled_mid_banking() -> None:
    """Banking lands even when the run is cancelled mid banking:
    ``scratchbank.application.teardown.bank_at_teardown``."""
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
    """A raced pass is banked when the next pass fails for any reason:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    box = FakeSandbox(dict(FILES))
    box.races = [("./log",)]
    box.faults["archive"] = [None, fault, fault, fault, fault, fault]
    _, timeline, store = teardown(box)
    rec = last_record(timeline)
    assert rec.banked and rec.raced == ("./log",) and store.only("run-1") is not None
    assert rec.sha256 == hashlib.sha256(store.only("run-1")).hexdigest()
    assert fold(timeline.read("run-1")).bank is not None  # R14 never reverts to an older bank


def test_T16_a_complete_archive_whose_upload_failed_is_banked_when_the_next_try_cannot_archive() -> None:
    """A complete archive whose upload failed is banked when the next try cannot archive:
    ``scratchbank.application.teardown.bank_at_teardown``."""
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
    complete archive is banked, with its raced members named.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
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


def test_T6_the_record_carries_the_clock_time() -> None:
    """The record carries the clock time: ``scratchbank.application.teardown.bank_at_teardown``."""
    clock = FakeClock()
    clock.advance(42)
    _, timeline, _ = teardown(FakeSandbox(dict(FILES)), clock=clock)
    assert last_record(timeline).at == ManualClock.EPOCH + timedelta(seconds=42)


def test_T16_a_clean_archive_is_banked_before_a_later_one_that_raced() -> None:
    """Try 1 archives clean but cannot upload; try 2 races, then cannot archive again:
    the clean archive of try 1 is the one banked (a clean one, else the last that raced).
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""

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
    """Try 1 archives clean but cannot upload; try 2 races on every pass: the clean one.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""

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


def test_T11_T14_a_clean_quiesced_bank_is_one_call_the_sandbox_continues_itself() -> None:
    """A clean quiesced bank is one call the sandbox continues itself:
    ``scratchbank.application.teardown.bank_at_teardown``."""
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
    everything is stopped) plain pass; the host continues them once the passes end.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    box = OneCallSandbox(dict(FILES))
    box.races = [("./log",), ()]
    report, timeline, _ = teardown(box)
    assert box.calls == ["bank", "archive", "continue"]
    assert box.verified == [False]
    assert report.tar_passes == 2
    assert last_record(timeline).raced == ()
    assert not box.stopped


def test_T14_a_failed_archive_after_the_quiesce_is_recorded_quiesced_and_continued_by_the_host() -> None:
    """A failed archive after the quiesce is recorded quiesced and continued by the host:
    ``scratchbank.application.teardown.bank_at_teardown``."""
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
    """Refused before any signal (exit 3): nothing is continued either (RULES facts).
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    box = make(dict(FILES))
    box.quiesce_report = QuiesceReport(False, True, ("this is the host's initial PID namespace",))
    _, timeline, _ = teardown(box)
    rec = last_record(timeline)
    assert rec.banked
    assert rec.unquiesced
    assert "initial PID namespace" in rec.quiesce_reason
    assert box.continued == 0
    assert not box.stopped


def test_T14_a_continue_step_cut_at_its_budget_leaves_no_thread_behind() -> None:
    """The continue runs in a cancellation scope: cut at its budget, nothing it started
    outlives the teardown; the note says the continue failed.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    box = StuckContinue(dict(FILES))
    box.races = [("./log",), ()]
    before = set(threading.enumerate())
    report, timeline, _ = teardown(box, continue_seconds=0.2)
    assert set(threading.enumerate()) <= before, "a thread outlived the teardown"
    assert box.calls[-1] == "continue"
    assert any("continuing processes failed" in note for note in report.notes)
    assert last_record(timeline).banked


def test_T16_T13_an_archive_banked_from_an_earlier_try_carries_that_try_s_quiesce() -> None:
    """Try 1 quiesces partially (a writer ran) and archives clean, its uploads fail; try 2
    quiesces fully, then cannot archive: try 1's archive is banked, so the record says
    unquiesced, with try 1's reason (found by attack: it said quiesced, try 2's verdict).
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""

    class SecondQuiesceStopsAll(FakeSandbox):
        def quiesce(self, *, budget_seconds, wait_seconds, deadline=None):  # type: ignore[no-untyped-def]
            if self.quiesces == 0:
                self.quiesce_report = QuiesceReport(False, False, ("process 7:R still running",), 1)
            else:
                self.quiesce_report = QuiesceReport(True, False, (), 2)
            return super().quiesce(
                budget_seconds=budget_seconds, wait_seconds=wait_seconds, deadline=deadline
            )

    box = SecondQuiesceStopsAll(dict(FILES))
    box.faults["archive"] = [None, ExecFailed("blip"), ExecFailed("blip")]
    _, timeline, store = teardown(box, store=FlakyStore(fail_puts=3))
    rec = last_record(timeline)
    assert rec.banked and store.only("run-1") and box.archives == 1 and box.quiesces >= 2
    assert rec.unquiesced and "7:R" in (rec.quiesce_reason or "")
