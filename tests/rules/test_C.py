"""Rules C: consents and the runner's deliveries. The pure tier's tests of C1, C2, C3, C4, C5, C6, C7,
C9, C10 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import pytest
from rigs.adoption_and_delivery import ACCEPT
from rigs.resume_decisions import FORCE, decide
from rigs.teardown_world import ClaimedDuringBanking, last_record, teardown

from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.domain import (
    RESUME_INVALID,
    SCRATCH_NOT_PORTABLE,
    Consents,
    Delivery,
    Verdict,
    fold,
    judge_delivery,
    remedy,
)
from scratchbank.domain.admission import admit, attempt_ended
from scratchbank.domain.records import AttemptClaimed, AttemptQueued, Record, UnknownRecord
from scratchbank.domain.resume_gate import ResumeRequest, decide_resume
from scratchbank.testing.builders import banked, node, resumed, started, unbanked

# ---- from tests/rules/test_[CSX]*.py: Adoption into a parent's sandbox (S1, S5) and the runner's delivery rules (C3-C6).


def test_C3_consent_belongs_to_one_call_and_is_not_in_the_state() -> None:
    """A consent given to one call is not read by the next: the fold keeps none.
    Proves ``scratchbank.domain.resume_gate.decide_resume``."""
    records = (started(), unbanked())
    first = decide_resume(fold(records), ResumeRequest(consents=ACCEPT))
    assert not first.refused
    assert decide_resume(fold(records), ResumeRequest()).refused


def test_C4_redelivery_after_the_claim_lends_no_consent() -> None:
    """Redelivery after the claim lends no consent: ``scratchbank.domain.judge_delivery``."""
    state = fold((AttemptQueued(attempt="a1", accept_scratch_loss=True), AttemptClaimed(attempt="a1")))
    v = judge_delivery(state, "a1", ACCEPT)
    assert v.delivery is Delivery.REDELIVERED and v.consents == Consents() and v.rule == "C4"


def test_C5_delivery_claims_only_its_own_attempt_with_its_consents() -> None:
    """Delivery claims only its own attempt with its consents: ``scratchbank.domain.judge_delivery``."""
    state = fold((AttemptQueued(attempt="a1"),))
    v = judge_delivery(state, "a1", ACCEPT)
    assert v.delivery is Delivery.CLAIM and v.consents == ACCEPT


def test_C6_delivery_published_before_the_last_queue_is_superseded() -> None:
    """Delivery published before the last queue is superseded: ``scratchbank.domain.judge_delivery``."""
    state = fold((AttemptQueued(attempt="a1", accept_scratch_loss=True), AttemptQueued(attempt="a2")))
    v = judge_delivery(state, "a1", ACCEPT)
    assert v.delivery is Delivery.SUPERSEDED and v.consents == Consents() and v.rule == "C6"


def test_C4_a_redelivery_of_an_attempt_whose_execution_ended_applies_nothing() -> None:
    """Claimed, then its teardown recorded: the same delivery again is DONE, not run twice.
    Proves ``scratchbank.domain.admission.attempt_ended``."""
    records = (AttemptQueued(attempt="a1"), AttemptClaimed(attempt="a1"), banked())
    assert attempt_ended(records, "a1")
    verdict = admit(records, fold(records), "a1", ACCEPT)
    assert verdict.delivery is Delivery.DONE and verdict.consents == Consents()
    mid_run = records[:2]
    assert admit(mid_run, fold(mid_run), "a1", ACCEPT).delivery is Delivery.REDELIVERED


# ---- from tests/test_rules_resume.py: The resume gate, rule by rule (R1-R15, S2-S4, C1-C2, C9-C10, A1-A12).


def test_C1_A9_force_never_accepts_the_scratch_loss() -> None:
    """--force alone still refuses the scratch, and tells the caller to keep --force (A9).
    Proves ``scratchbank.domain.remedy``."""
    d = decide(started(), banked(), node("a"), source_changed=True, consents=FORCE)
    assert d.code == SCRATCH_NOT_PORTABLE
    assert not d.also_needs_force
    assert d.keep_force
    assert "keep --force" in remedy(d)
    d = decide(started(), unbanked(), consents=FORCE)
    assert d.code == SCRATCH_NOT_PORTABLE


def test_C2_accept_scratch_loss_is_what_lets_the_loss_go() -> None:
    """Accept scratch loss is what lets the loss go: ``scratchbank.domain.decide_resume``."""
    d = decide(started(), unbanked(), consents=ACCEPT)
    assert d.verdict is Verdict.GO_ON_WITHOUT
    assert d.rule == "R13"


def test_C9_also_needs_force_only_when_the_call_lacked_force() -> None:
    """HTTP's also_needs_force: set when a --force cause is named and --force was absent."""
    d = decide(started(), unbanked(), source_changed=True)
    assert d.also_needs_force and not d.keep_force
    d = decide(started(), unbanked(), source_changed=True, consents=FORCE)
    assert not d.also_needs_force and d.keep_force
    d = decide(started(), unbanked())
    assert not d.also_needs_force and not d.keep_force


def test_C10_every_refusal_has_a_specific_hint_from_the_refusal() -> None:
    """The hint is derived from the refusal, never a generic '--force' advice.
    Proves ``scratchbank.domain.remedy``."""
    d = decide(started(), unbanked())
    assert remedy(d).startswith("relaunch the run fresh; or resume it accepting the scratch's loss")
    assert "--force" not in remedy(d)
    d = decide(started(), banked(), source_changed=True)
    assert d.code == RESUME_INVALID
    assert "--accept-scratch-loss" not in remedy(d)


# ---- from tests/test_teardown_use_case.py: The teardown banking use case under faults, with fakes (T1-T20). Each test names the expected outcome and checks that nothing was lost.


@pytest.mark.parametrize("claim", [resumed("newer"), banked()], ids=["a resume", "another teardown"])
def test_C7_T6_a_teardown_that_lost_the_run_writes_and_uploads_nothing(claim: Record) -> None:
    """A teardown that lost the run writes and uploads nothing:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    store.banks["run-1"] = b"the bank the newer record names"
    report, _, _ = teardown(ClaimedDuringBanking(timeline, claim), timeline=timeline, store=store)
    assert report.superseded.startswith("superseded") and not report.recorded
    assert timeline.read("run-1")[-1] == claim  # nothing after the winner's record
    assert store.only("run-1") == b"the bank the newer record names"


def test_C7_T6_a_conflict_that_took_nothing_is_planned_again_and_recorded() -> None:
    """A conflict that took nothing is planned again and recorded:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    timeline = InMemoryTimeline()
    box = ClaimedDuringBanking(timeline, UnknownRecord(type="llm_usage", data={"tokens": 3}))
    report, _, store = teardown(box, timeline=timeline)
    assert report.recorded and not report.superseded
    assert last_record(timeline).banked and store.only("run-1") is not None
