"""Rules X: restoring the bank into the new sandbox. The pure tier's tests of X1, X2, X3, X4, X5, X6,
X7 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import gzip

import pytest
from hostile import corpus, host_only_corpus, record_for
from rigs.checkpoint_stamps import C1, checkpoints_run
from rigs.hostile_banks import HOSTILE, bank_of
from rigs.restore_decisions import LOSES, READS, restore_plan
from rigs.resume_decisions import decide
from rigs.scripted_transport import (
    Failing,
    Scripted,
    drive,
    no_thread_left,  # noqa: F401 - a fixture
)
from rigs.tar_reader import check
from rigs.teardown_decisions import plan
from rigs.teardown_world import FILES, ClaimedDuringBanking, teardown

from scratchbank.adapters.exec_output import Bounded
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.bank_format.gunzip import GzipReader
from scratchbank.application.bank_format.reader import Limits
from scratchbank.application.cancellation import Deadline
from scratchbank.application.resume import resume
from scratchbank.domain import (
    SCRATCH_NOT_PORTABLE,
    RestoreAttempt,
    RestoreResult,
    ResumeRequest,
    TeardownAction,
    Verdict,
    after_restore,
    decide_resume,
    fold,
)
from scratchbank.domain.errors import HostileArchive, StreamBroken
from scratchbank.domain.orphans import orphan_may_bank
from scratchbank.domain.records import RunResumed, ScratchBanked, ScratchRestored
from scratchbank.testing.builders import banked, node, restore_failed, restored, resumed, started

# ---- from tests/rules/test_[TX]*.py: Hostile bytes never cost a record (issue 10 hole 3): a parse failure at bank time still writes ``sandbox_scratch_banked`` (T6), and at resume the run parks with its restore record (X4), whatever the bytes make the parser do.


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_X4_a_bank_the_parser_chokes_on_parks_the_run_with_its_record(case: str) -> None:
    """A bank the parser chokes on parks the run with its record:
    ``scratchbank.application.resume.resume``."""
    data = bank_of(HOSTILE[case])
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    record = record_for(data)
    assert isinstance(record, ScratchBanked)
    timeline.append("run-r", [started(), record])
    store.banks["run-r"] = data
    box = FakeSandbox({})
    out = resume("run-r", ResumeRequest(), timeline=timeline, store=store, sandbox=box)
    assert out.restore is not None and out.restore.park is not None
    assert out.restore.park.code == SCRATCH_NOT_PORTABLE and "refused_on_host" in out.restore.record.reason
    last = timeline.read("run-r")[-1]
    assert isinstance(last, ScratchRestored) and not last.restored
    assert box.files == {} and box.staged == {}  # nothing reached the scratch, nothing left staged


# ---- from tests/rules/test_[HLX]*.py: One exec pump for every transport (issue 25, build item 0; ADR 0008): the pump owns stdin's feeding, the bounded sinks, the deadline and the cut; a transport supplies only send/receive/cut. Driven here through a scripted transport (no engine): the engines' own runs are tests/test_deadlines.py, test_hostile_sandbox.py and test_sandboxes.py.


def test_X5_a_source_that_fails_cuts_the_exec_and_is_named(no_thread_left: None) -> None:
    """The bank's stream drops mid-restore: StreamBroken naming stdin, the exec cut at once."""
    exec_ = Scripted([], hold=True)
    with pytest.raises(StreamBroken, match="stdin stream broke"):
        drive(exec_, Failing(), Bounded(100, "t"), Deadline.after(3600.0))
    assert exec_.cuts >= 1


# ---- from tests/test_host_check.py: The host-side check: every bank is hostile input (X2, SECURITY.md).


@pytest.mark.parametrize(("name", "data", "says"), corpus(), ids=[c[0] for c in corpus()])
def test_X2_hostile_bank_is_refused_on_the_host_by_name(name: str, data: bytes, says: str) -> None:
    """Hostile bank is refused on the host by name:
    ``scratchbank.application.bank_format.reader.TarReader``."""
    with pytest.raises(HostileArchive, match=says.replace("(", r"\(")):
        check(data, Limits(uncompressed_bytes=1 << 30))


@pytest.mark.parametrize(("name", "data", "says"), host_only_corpus(), ids=[c[0] for c in host_only_corpus()])
def test_X6_links_out_are_refused_only_for_a_host_directory(name: str, data: bytes, says: str) -> None:
    """Links out are refused only for a host directory:
    ``scratchbank.application.bank_format.reader.TarReader``."""
    check(data)  # inert inside a sandbox
    with pytest.raises(HostileArchive, match=says):
        check(data, Limits(host_directory=True))


def test_X2_the_host_inflates_a_bank_with_isal_and_refuses_as_zlib_did() -> None:
    """Issue 24 item 2: the bank's gunzip is ISA-L's; a corrupt, truncated or trailing stream is still refused by name.
    Proves ``scratchbank.application.bank_format.gunzip.GzipReader``."""
    from isal import isal_zlib

    reader = GzipReader(lambda chunk: None, 1 << 20)
    assert type(reader._d) is type(isal_zlib.decompressobj(wbits=31))
    good = gzip.compress(b"x" * 5000)
    bad = bytearray(good)
    bad[-6] ^= 1  # the CRC
    for data, says in ((bytes(bad), "corrupt gzip stream"), (good + b"tail", "trailing data")):
        with pytest.raises(HostileArchive, match=says):
            GzipReader(lambda chunk: None, 1 << 20).feed(data)
    truncated = GzipReader(lambda chunk: None, 1 << 20)
    truncated.feed(good[:-3])
    with pytest.raises(HostileArchive, match="truncated"):
        truncated.close()


# ---- from tests/rules/test_[CSX]*.py: Adoption into a parent's sandbox (S1, S5) and the runner's delivery rules (C3-C6).


def test_X3_a_sandbox_cut_off_mid_restore_is_never_banked_over_the_bank() -> None:
    """A lapsed holder's sandbox: banked by the new holder only when its restore landed.
    Proves ``scratchbank.domain.orphans.orphan_may_bank``."""
    before = [started(), banked(), RunResumed(attempt="a2")]
    assert not orphan_may_bank(before)  # the restore never recorded: a part of the bank
    assert not orphan_may_bank([*before, restore_failed()])
    assert orphan_may_bank([*before, restored()])
    assert orphan_may_bank([started(), RunResumed(attempt="a1")])  # no bank: nothing to hold
    assert not orphan_may_bank([started(), RunResumed(attempt="a1"), banked()])  # banked already


# ---- from tests/test_rules_checkpoints.py: Checkpoint stamps (ADR 0013): staleness read from the checkpoint itself (N1, N2, K1-K5).


def test_X6_K8_a_rewind_to_before_a_host_hand_over_restores_no_bank() -> None:
    """The host directory holds the scratch for good: a rewind to c1 restores nothing.
    Proves ``scratchbank.domain.decide_resume``."""
    from scratchbank.domain.objects import needed_objects

    state = fold([*checkpoints_run(), restored(host_backed=True), resumed()])
    decision = decide_resume(state, ResumeRequest(checkpoint=C1))
    assert decision.verdict is Verdict.GO_ON_WITHOUT and decision.rule == "X6"
    assert state.history == () and needed_objects(state) == frozenset()


# ---- from tests/test_rules_restore.py: After a restore attempt (X1-X7).


def test_X1_restored_bank_is_recorded_with_its_members() -> None:
    """Restored bank is recorded with its members: ``scratchbank.domain.after_restore``."""
    out = after_restore(restore_plan(), RestoreAttempt(RestoreResult.RESTORED, bytes=1000))
    r = out.record
    assert (r.restored, r.bytes, r.stale, r.accepted, r.host_backed) == (True, 1000, False, False, False)
    assert out.proceed and out.park is None and not out.must_record and out.rule == "X1"


def test_X1_a_restore_of_a_raced_bank_says_so() -> None:
    """A restore of a raced bank says so: ``scratchbank.domain.decide_resume``."""
    d = decide_resume(fold((started(), banked(raced=("./a",)))), ResumeRequest())
    out = after_restore(d, RestoreAttempt(RestoreResult.RESTORED, bytes=1))
    assert out.record.raced == ("./a",) and "raced" in out.record.reason


@pytest.mark.parametrize("result", LOSES)
def test_X4_lost_bank_parks_scratch_not_portable_and_holds_it(result: RestoreResult) -> None:
    """Lost bank parks scratch not portable and holds it: ``scratchbank.domain.after_restore``."""
    out = after_restore(restore_plan(), RestoreAttempt(result, detail="x"))
    assert not out.proceed
    assert out.park is not None and out.park.code == SCRATCH_NOT_PORTABLE
    assert out.hold and out.rule == "X4"


@pytest.mark.parametrize("result", LOSES)
def test_X4_accepting_the_loss_goes_on_without_it(result: RestoreResult) -> None:
    """Accepting the loss goes on without it: ``scratchbank.domain.after_restore``."""
    out = after_restore(restore_plan(accept=True), RestoreAttempt(result))
    assert out.proceed and out.park is None
    assert out.record.accepted and not out.record.restored


@pytest.mark.parametrize("result", READS)
def test_X5_failed_read_parks_without_a_code_and_no_consent_skips_it(result: RestoreResult) -> None:
    """Failed read parks without a code and no consent skips it: ``scratchbank.domain.after_restore``."""
    for accept in (False, True):
        out = after_restore(restore_plan(accept=accept), RestoreAttempt(result))
        assert not out.proceed
        assert out.park is not None and out.park.code is None
        assert out.hold and out.rule == "X5"


def test_X3_every_failure_holds_the_bank_and_success_does_not() -> None:
    """Every failure holds the bank and success does not: ``scratchbank.domain.after_restore``."""
    for result in (*LOSES, *READS):
        assert after_restore(restore_plan(), RestoreAttempt(result)).hold
    assert not after_restore(restore_plan(), RestoreAttempt(RestoreResult.RESTORED)).hold


def test_X6_restore_into_a_host_directory_hands_the_scratch_over() -> None:
    """Restore into a host directory hands the scratch over: ``scratchbank.domain.after_restore``."""
    out = after_restore(restore_plan(), RestoreAttempt(RestoreResult.RESTORED, into_host_dir=True))
    assert out.record.host_backed and out.rule == "X6"


def test_X7_host_backed_and_stale_records_must_land_others_are_best_effort() -> None:
    """Host backed and stale records must land others are best effort:
    ``scratchbank.domain.after_restore``."""
    host = after_restore(restore_plan(), RestoreAttempt(RestoreResult.RESTORED, into_host_dir=True))
    assert host.must_record
    stale = restore_plan(started(), banked(), node("a"), accept=True)
    assert stale.stale
    assert after_restore(stale, RestoreAttempt(RestoreResult.RESTORED)).must_record
    assert not after_restore(restore_plan(), RestoreAttempt(RestoreResult.RESTORED)).must_record
    assert not after_restore(restore_plan(), RestoreAttempt(RestoreResult.GONE)).must_record


# ---- from tests/test_rules_resume.py: The resume gate, rule by rule (R1-R15, S2-S4, C1-C2, C9-C10, A1-A12).


def test_X6_host_backed_handover_means_no_bank_decides() -> None:
    """Host backed handover means no bank decides: ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), resumed(), restored(host_backed=True), node("a"))
    assert d.verdict is Verdict.GO_ON_WITHOUT
    assert d.rule == "X6"


# ---- from tests/rules/test_[ATX]*.py: Teardown decisions, rule by rule (T1, T4-T6, T9, T11, T13, T16, T19, T20, X3, A7).


def test_X3_a_failed_restore_holds_the_bank_until_that_sandbox_ends() -> None:
    """A failed restore holds the bank until that sandbox ends: ``scratchbank.domain.plan_teardown``."""
    held = (started(), banked(), resumed(), restore_failed())
    p = plan(held)
    assert p.action is TeardownAction.SKIP and p.rule == "X3"
    assert plan((*held, resumed())).action is TeardownAction.BANK


# ---- from tests/test_teardown_use_case.py: The teardown banking use case under faults, with fakes (T1-T20). Each test names the expected outcome and checks that nothing was lost.


def test_X3_a_held_bank_is_not_banked_over() -> None:
    """A held bank is not banked over: ``scratchbank.domain.decide_resume``."""
    store = InMemoryBankStore()
    store.banks["run-1"] = b"held"
    report, timeline, _ = teardown(
        FakeSandbox(dict(FILES)), store=store, history=(started(), banked(), resumed(), restore_failed())
    )
    assert report.plan.rule == "X3" and store.only("run-1") == b"held"
    assert decide_resume(fold(timeline.read("run-1")), ResumeRequest()).verdict is Verdict.RESTORE


def test_X3_T6_a_hold_recorded_while_banking_is_honoured_at_the_record() -> None:
    """A hold recorded while banking is honoured at the record:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    timeline = InMemoryTimeline()
    box = ClaimedDuringBanking(timeline, restore_failed())
    report, _, _ = teardown(box, timeline=timeline, history=(started(), banked(), resumed()))
    assert not report.recorded and "X3" in report.superseded
    assert timeline.read("run-1")[-1] == restore_failed()


# ---- The restore stream's form (issue 24, ADR 0003 addendum 2026-12-02, session 7).


@pytest.mark.parametrize(
    ("engine", "stored", "files", "level"),
    [
        ("docker", 60, 100, 1),  # at the engine's bound: gzip
        ("docker", 61, 100, None),  # past it: plain
        ("kubernetes", 80, 100, 1),
        ("kubernetes", 95, 100, None),  # an incompressible bank (the 1 GB tree)
        ("podman", 10, 100, None),  # plain whatever the bank
        ("local", 10, 100, None),
        ("", 10, 100, None),  # an engine that does not say
        ("docker", 10, 0, None),  # a record without its manifest's bytes: plain, as before
    ],
)
def test_X2_the_stream_form_follows_the_engine_and_the_banks_ratio(
    engine: str, stored: int, files: int, level: int | None
) -> None:
    """gzip level 1 only on an engine whose transport pays for it and a bank that compresses
    at least that well. Proves ``scratchbank.application.restore.stream_gzip_level``."""
    from scratchbank.application.restore import stream_gzip_level

    record = ScratchBanked(
        banked=True, empty=False, unknown=False, bytes=stored, manifest_bytes=files or None
    )
    assert stream_gzip_level(engine, record) == level
