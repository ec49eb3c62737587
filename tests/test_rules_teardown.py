"""Teardown decisions, rule by rule (T1, T4-T6, T9, T11, T13, T16, T19, T20, X3, A7)."""

from __future__ import annotations

from scratchbank.domain import (
    Archive,
    Quiesce,
    Seen,
    TeardownAction,
    TryOutcome,
    Verdict,
    decide_resume,
    fold,
    merge_try,
    plan_teardown,
    teardown_record,
)
from scratchbank.domain.resume_gate import ResumeRequest
from scratchbank.domain.teardown import (
    CAP_BYTES,
    RACED_NAMES_KEPT,
    deletes_bank,
    finished_record,
    over_cap,
    should_retar,
)
from scratchbank.testing.builders import banked, restore_failed, resumed, started, unknown

CLEAN = Archive(bytes=500, sha256="a" * 64)
RACED = Archive(bytes=600, sha256="b" * 64, raced=("./log.txt",))
QUIET = Quiesce(quiesced=True)


def plan(records=(), *, host_backed=False, isolated=True, finished=False):  # type: ignore[no-untyped-def]
    return plan_teardown(
        fold(records), scratch_host_backed=host_backed, process_isolated=isolated, run_finished=finished
    )


def test_T1_container_local_scratch_banks_at_park_or_failure() -> None:
    p = plan((started(),))
    assert p.action is TeardownAction.BANK and p.rule == "T1"


def test_T1_host_backed_scratch_is_never_banked() -> None:
    p = plan((started(),), host_backed=True)
    assert p.action is TeardownAction.SKIP and p.rule == "T1"


def test_T11_quiesce_only_when_process_isolated() -> None:
    assert plan((started(),), isolated=True).quiesce
    assert not plan((started(),), isolated=False).quiesce


def test_T13_not_isolated_is_recorded_unquiesced() -> None:
    rec = teardown_record(TryOutcome(Seen.FILES, CLEAN, stored=True), Quiesce(False, "not isolated"))
    assert rec.banked and rec.unquiesced and rec.quiesce_reason == "not isolated"
    assert not teardown_record(TryOutcome(Seen.FILES, CLEAN, stored=True), QUIET).unquiesced


def test_T5_finished_run_drops_its_bank() -> None:
    p = plan((started(), banked()), finished=True)
    assert p.action is TeardownAction.DROP and p.rule == "T5"
    state = fold((started(), banked(), finished_record()))
    assert state.bank is None and state.unbanked is None


def test_T4_empty_scratch_deletes_the_previous_bank_and_is_recorded_empty() -> None:
    final = TryOutcome(Seen.EMPTY)
    assert deletes_bank(final)
    rec = teardown_record(final, QUIET)
    assert rec.empty and not rec.banked and rec.bytes == 0
    assert fold((started(), banked(), rec)).bank is None
    assert not deletes_bank(TryOutcome(Seen.FILES, CLEAN, stored=True))


def test_T6_every_outcome_yields_one_record_with_the_required_members() -> None:
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
    files = TryOutcome(Seen.FILES, None, reason="upload failed")
    merged = merge_try(files, TryOutcome(Seen.UNKNOWN, reason="exec blip"))
    assert merged.best is files
    merged = merge_try(TryOutcome(Seen.EMPTY), TryOutcome(Seen.UNKNOWN))
    assert merged.best.seen is Seen.EMPTY


def test_A7_a_try_that_knows_less_stops_the_tries() -> None:
    merged = merge_try(TryOutcome(Seen.FILES, None, reason="tar failed"), TryOutcome(Seen.EMPTY))
    assert merged.stop and merged.rule == "A7" and merged.best.seen is Seen.FILES


def test_T8_a_curable_failure_tries_again() -> None:
    merged = merge_try(None, TryOutcome(Seen.FILES, None, reason="tar failed"))
    assert not merged.stop and merged.rule == "T8"
    merged = merge_try(merged.best, TryOutcome(Seen.FILES, CLEAN, stored=True))
    assert merged.stop and merged.best.stored


def test_T16_last_complete_archive_is_kept_clean_over_raced() -> None:
    raced = TryOutcome(Seen.FILES, RACED, stored=True)
    failed = TryOutcome(Seen.FILES, None, reason="tar failed")
    assert merge_try(raced, failed).best is raced
    clean = TryOutcome(Seen.FILES, CLEAN, stored=True)
    assert merge_try(failed, clean).best is clean


def test_T16_tar_runs_again_while_it_races_and_budget_allows() -> None:
    assert should_retar(raced=True, passes=1, last_pass_seconds=1.0, seconds_left=3.0)
    assert not should_retar(raced=True, passes=1, last_pass_seconds=1.0, seconds_left=2.9)
    assert not should_retar(raced=True, passes=3, last_pass_seconds=0.1, seconds_left=100)
    assert not should_retar(raced=False, passes=1, last_pass_seconds=0.1, seconds_left=100)


def test_T16_raced_members_are_named_on_the_record_capped_with_a_count() -> None:
    names = tuple(f"./f{i}" for i in range(30))
    arch = Archive(bytes=9, sha256="c" * 64, raced=names)
    rec = teardown_record(TryOutcome(Seen.FILES, arch, stored=True), QUIET)
    assert rec.raced == names[:RACED_NAMES_KEPT] and rec.raced_count == 30


def test_T19_unknown_does_not_replace_an_earlier_bank() -> None:
    rec = teardown_record(TryOutcome(Seen.UNKNOWN, reason="sandbox gone"), QUIET)
    assert rec.unknown
    state = fold((started(), banked(), resumed(), unknown()))
    assert state.bank is not None
    assert decide_resume(state, ResumeRequest()).verdict is Verdict.RESTORE


def test_T20_over_the_cap_nothing_is_stored_and_the_record_names_why() -> None:
    assert over_cap(CAP_BYTES + 1) and not over_cap(CAP_BYTES)
    big = Archive(bytes=CAP_BYTES + 1, sha256="d" * 64)
    rec = teardown_record(TryOutcome(Seen.FILES, big, stored=False, reason="over the cap"), QUIET)
    assert not rec.banked and rec.files_unbanked and "cap" in rec.reason
    assert rec.bytes == CAP_BYTES + 1


def test_X3_a_failed_restore_holds_the_bank_until_that_sandbox_ends() -> None:
    held = (started(), banked(), resumed(), restore_failed())
    p = plan(held)
    assert p.action is TeardownAction.SKIP and p.rule == "X3"
    assert plan((*held, resumed())).action is TeardownAction.BANK
