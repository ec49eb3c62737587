"""Adoption into a parent's sandbox (S1, S5) and the runner's delivery rules (C3-C6)."""

from __future__ import annotations

from collections.abc import Sequence

from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.adoption import adopt_child
from scratchbank.application.ports import SandboxFacts, SystemClock
from scratchbank.domain import ChildNode, Consents, Delivery, decide_adoption, fold, judge_delivery
from scratchbank.domain.admission import admit, attempt_ended
from scratchbank.domain.errors import TimelineWriteFailed
from scratchbank.domain.orphans import orphan_may_bank
from scratchbank.domain.records import AttemptClaimed, AttemptQueued, Record, RunResumed, SandboxShared
from scratchbank.domain.resume_gate import ResumeRequest, decide_resume
from scratchbank.testing.builders import banked, restore_failed, restored, started, unbanked

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


# --- the adoption use case (S1, S5), the takeover and redelivery rules --------------------

CONTAINER = SandboxFacts("/tmp/iterion-scratch", False, True, "own PID namespace")
HOST = SandboxFacts("/tmp/iterion-scratch", True, True, "own PID namespace")


class _StoreDown(InMemoryTimeline):
    """A timeline whose store refuses every write (an outage longer than any budget)."""

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        raise TimelineWriteFailed("the store is down")


def test_S1_use_case_refuses_a_parking_child_and_writes_nothing() -> None:
    """A child with a human gate under a container-local scratch: refused, no record."""
    tl = InMemoryTimeline()
    child = [TOOL, ChildNode("gate", "human")]
    got = adopt_child(
        "run-1.c", child, parent_run="run-1", parent=CONTAINER, parent_copy_based=False, timeline=tl
    )
    assert not got.adopted and got.rule == "S1"
    assert list(tl.read("run-1.c")) == []


def test_S1_use_case_adopts_a_parking_child_into_a_host_backed_scratch() -> None:
    tl = InMemoryTimeline()
    got = adopt_child(
        "run-1.c",
        [ChildNode("gate", "human")],
        parent_run="run-1",
        parent=HOST,
        parent_copy_based=False,
        timeline=tl,
    )
    assert got.adopted
    (rec,) = tl.read("run-1.c")
    assert (
        isinstance(rec, SandboxShared) and rec.scratch_container_local is False and rec.parent_run == "run-1"
    )


def test_S5_the_adoption_record_lands_before_the_child_runs() -> None:
    tl = InMemoryTimeline()
    got = adopt_child(
        "run-1.c", [TOOL], parent_run="run-1", parent=CONTAINER, parent_copy_based=True, timeline=tl
    )
    assert got.adopted and got.rule == "S5"
    (rec,) = tl.read("run-1.c")
    assert isinstance(rec, SandboxShared) and rec.scratch_container_local and rec.parent_copy_based


def test_S5_a_record_that_does_not_land_within_its_budget_keeps_the_child_out() -> None:
    """The store refuses the record past its budget: the child does not run there."""
    got = adopt_child(
        "run-1.c",
        [TOOL],
        parent_run="run-1",
        parent=CONTAINER,
        parent_copy_based=False,
        timeline=_StoreDown(),
        budget=0.0,
        clock=SystemClock(),
    )
    assert not got.adopted and got.rule == "S5" and "budget" in got.reason


def test_C4_a_redelivery_of_an_attempt_whose_execution_ended_applies_nothing() -> None:
    """Claimed, then its teardown recorded: the same delivery again is DONE, not run twice."""
    records = (AttemptQueued(attempt="a1"), AttemptClaimed(attempt="a1"), banked())
    assert attempt_ended(records, "a1")
    verdict = admit(records, fold(records), "a1", ACCEPT)
    assert verdict.delivery is Delivery.DONE and verdict.consents == Consents()
    mid_run = records[:2]
    assert admit(mid_run, fold(mid_run), "a1", ACCEPT).delivery is Delivery.REDELIVERED


def test_X3_a_sandbox_cut_off_mid_restore_is_never_banked_over_the_bank() -> None:
    """A lapsed holder's sandbox: banked by the new holder only when its restore landed."""
    before = [started(), banked(), RunResumed(attempt="a2")]
    assert not orphan_may_bank(before)  # the restore never recorded: a part of the bank
    assert not orphan_may_bank([*before, restore_failed()])
    assert orphan_may_bank([*before, restored()])
    assert orphan_may_bank([started(), RunResumed(attempt="a1")])  # no bank: nothing to hold
    assert not orphan_may_bank([started(), RunResumed(attempt="a1"), banked()])  # banked already
