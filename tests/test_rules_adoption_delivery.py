"""Adoption into a parent's sandbox (S1, S5) and the runner's delivery rules (C3-C6)."""

from __future__ import annotations

from scratchbank.domain import ChildNode, Consents, Delivery, decide_adoption, fold, judge_delivery
from scratchbank.domain.records import AttemptClaimed, AttemptQueued
from scratchbank.domain.resume_gate import ResumeRequest, decide_resume
from scratchbank.testing.builders import started, unbanked

TOOL = ChildNode("build", "tool")
ACCEPT = Consents(accept_scratch_loss=True)


def test_S1_child_that_can_park_is_refused_under_container_local_scratch() -> None:
    for parker in (
        ChildNode("gate", "human"),
        ChildNode("chat", "agent", interactive=True),
        ChildNode("llm", "agent", permission_mode="ask"),
        ChildNode("llm", "agent", has_ask_rules=True, gate_on=True),
    ):
        d = decide_adoption([TOOL, parker], scratch_container_local=True, parent_copy_based=False)
        assert not d.adopt and d.rule == "S1", parker
        assert d.record is None


def test_S1_ask_rules_under_a_gate_that_is_off_do_not_park() -> None:
    child = [ChildNode("llm", "agent", has_ask_rules=True, gate_on=False)]
    assert decide_adoption(child, scratch_container_local=True, parent_copy_based=False).adopt


def test_S1_parking_child_may_share_a_host_backed_scratch() -> None:
    d = decide_adoption([ChildNode("gate", "human")], scratch_container_local=False, parent_copy_based=True)
    assert d.adopt


def test_S5_adoption_carries_the_record_that_must_be_written_first() -> None:
    d = decide_adoption([TOOL], scratch_container_local=True, parent_copy_based=True)
    assert d.adopt and d.record_required and d.rule == "S5"
    assert d.record is not None
    assert d.record.scratch_container_local and d.record.parent_copy_based


def test_C3_consent_belongs_to_one_call_and_is_not_in_the_state() -> None:
    """A consent given to one call is not read by the next: the fold keeps none."""
    records = (started(), unbanked())
    first = decide_resume(fold(records), ResumeRequest(consents=ACCEPT))
    assert not first.refused
    assert decide_resume(fold(records), ResumeRequest()).refused


def test_C4_redelivery_after_the_claim_lends_no_consent() -> None:
    state = fold((AttemptQueued(attempt="a1", accept_scratch_loss=True), AttemptClaimed(attempt="a1")))
    v = judge_delivery(state, "a1", ACCEPT)
    assert v.delivery is Delivery.REDELIVERED and v.consents == Consents() and v.rule == "C4"


def test_C5_delivery_claims_only_its_own_attempt_with_its_consents() -> None:
    state = fold((AttemptQueued(attempt="a1"),))
    v = judge_delivery(state, "a1", ACCEPT)
    assert v.delivery is Delivery.CLAIM and v.consents == ACCEPT


def test_C6_delivery_published_before_the_last_queue_is_superseded() -> None:
    state = fold((AttemptQueued(attempt="a1", accept_scratch_loss=True), AttemptQueued(attempt="a2")))
    v = judge_delivery(state, "a1", ACCEPT)
    assert v.delivery is Delivery.SUPERSEDED and v.consents == Consents() and v.rule == "C6"
