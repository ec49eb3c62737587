"""After a restore attempt (X1-X7)."""

from __future__ import annotations

import pytest

from scratchbank.domain import (
    SCRATCH_NOT_PORTABLE,
    Consents,
    RestoreAttempt,
    RestoreResult,
    ResumeDecision,
    ResumeRequest,
    Verdict,
    after_restore,
    decide_resume,
    fold,
)
from scratchbank.domain.records import Record
from scratchbank.testing.builders import banked, node, started

LOSES = (
    RestoreResult.GONE,
    RestoreResult.REFUSED_ON_HOST,
    RestoreResult.REFUSED_IN_SANDBOX,
    RestoreResult.NO_SANDBOX,
)
READS = (RestoreResult.READ_FAILED, RestoreResult.STREAM_BROKEN)


def restore_plan(*records: Record, accept: bool = False) -> ResumeDecision:
    consents = Consents(accept_scratch_loss=accept)
    d = decide_resume(fold(records or (started(), banked())), ResumeRequest(consents=consents))
    assert d.verdict is Verdict.RESTORE
    return d


def test_X1_restored_bank_is_recorded_with_its_members() -> None:
    out = after_restore(restore_plan(), RestoreAttempt(RestoreResult.RESTORED, bytes=1000))
    r = out.record
    assert (r.restored, r.bytes, r.stale, r.accepted, r.host_backed) == (True, 1000, False, False, False)
    assert out.proceed and out.park is None and not out.must_record and out.rule == "X1"


def test_X1_a_restore_of_a_raced_bank_says_so() -> None:
    d = decide_resume(fold((started(), banked(raced=("./a",)))), ResumeRequest())
    out = after_restore(d, RestoreAttempt(RestoreResult.RESTORED, bytes=1))
    assert out.record.raced == ("./a",) and "raced" in out.record.reason


@pytest.mark.parametrize("result", LOSES)
def test_X4_lost_bank_parks_scratch_not_portable_and_holds_it(result: RestoreResult) -> None:
    out = after_restore(restore_plan(), RestoreAttempt(result, detail="x"))
    assert not out.proceed
    assert out.park is not None and out.park.code == SCRATCH_NOT_PORTABLE
    assert out.hold and out.rule == "X4"


@pytest.mark.parametrize("result", LOSES)
def test_X4_accepting_the_loss_goes_on_without_it(result: RestoreResult) -> None:
    out = after_restore(restore_plan(accept=True), RestoreAttempt(result))
    assert out.proceed and out.park is None
    assert out.record.accepted and not out.record.restored


@pytest.mark.parametrize("result", READS)
def test_X5_failed_read_parks_without_a_code_and_no_consent_skips_it(result: RestoreResult) -> None:
    for accept in (False, True):
        out = after_restore(restore_plan(accept=accept), RestoreAttempt(result))
        assert not out.proceed
        assert out.park is not None and out.park.code is None
        assert out.hold and out.rule == "X5"


def test_X3_every_failure_holds_the_bank_and_success_does_not() -> None:
    for result in (*LOSES, *READS):
        assert after_restore(restore_plan(), RestoreAttempt(result)).hold
    assert not after_restore(restore_plan(), RestoreAttempt(RestoreResult.RESTORED)).hold


def test_X6_restore_into_a_host_directory_hands_the_scratch_over() -> None:
    out = after_restore(restore_plan(), RestoreAttempt(RestoreResult.RESTORED, into_host_dir=True))
    assert out.record.host_backed and out.rule == "X6"


def test_X7_host_backed_and_stale_records_must_land_others_are_best_effort() -> None:
    host = after_restore(restore_plan(), RestoreAttempt(RestoreResult.RESTORED, into_host_dir=True))
    assert host.must_record
    stale = restore_plan(started(), banked(), node("a"), accept=True)
    assert stale.stale
    assert after_restore(stale, RestoreAttempt(RestoreResult.RESTORED)).must_record
    assert not after_restore(restore_plan(), RestoreAttempt(RestoreResult.RESTORED)).must_record
    assert not after_restore(restore_plan(), RestoreAttempt(RestoreResult.GONE)).must_record


def test_after_restore_needs_a_restore_decision() -> None:
    d = decide_resume(fold((started(),)), ResumeRequest())
    with pytest.raises(ValueError):
        after_restore(d, RestoreAttempt(RestoreResult.RESTORED))
