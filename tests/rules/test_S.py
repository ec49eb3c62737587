"""Rules S: subbot children that share their parent's sandbox. The pure tier's tests of S1, S2, S3, S4,
S5 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

from collections.abc import Sequence

from rigs.adoption_and_delivery import CONTAINER, HOST, TOOL, _StoreDown
from rigs.resume_decisions import ACCEPT, BOTH, FORCE, decide, kinds

from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.adoption import adopt_child
from scratchbank.application.ports import SystemClock
from scratchbank.domain import (
    RESUME_INVALID,
    SCRATCH_NOT_PORTABLE,
    CauseKind,
    ChildNode,
    ScratchForsaken,
    Verdict,
    decide_adoption,
    remedy,
)
from scratchbank.domain.records import Record, SandboxShared
from scratchbank.testing.builders import forsaken, node, shared, started

# ---- from tests/rules/test_[CSX]*.py: Adoption into a parent's sandbox (S1, S5) and the runner's delivery rules (C3-C6).


def test_S1_child_that_can_park_is_refused_under_container_local_scratch() -> None:
    """Child that can park is refused under container local scratch:
    ``scratchbank.domain.decide_adoption``."""
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
    """Ask rules under a gate that is off do not park: ``scratchbank.domain.decide_adoption``."""
    child = [ChildNode("llm", "agent", has_ask_rules=True, gate_on=False)]
    assert decide_adoption(child, scratch_container_local=True, parent_copy_based=False).adopt


def test_S1_parking_child_may_share_a_host_backed_scratch() -> None:
    """Parking child may share a host backed scratch: ``scratchbank.domain.decide_adoption``."""
    d = decide_adoption([ChildNode("gate", "human")], scratch_container_local=False, parent_copy_based=True)
    assert d.adopt


def test_S5_adoption_carries_the_record_that_must_be_written_first() -> None:
    """Adoption carries the record that must be written first: ``scratchbank.domain.decide_adoption``."""
    d = decide_adoption([TOOL], scratch_container_local=True, parent_copy_based=True)
    assert d.adopt and d.record_required and d.rule == "S5"
    assert d.record is not None
    assert d.record.scratch_container_local and d.record.parent_copy_based


def test_S1_use_case_refuses_a_parking_child_and_writes_nothing() -> None:
    """A child with a human gate under a container-local scratch: refused, no record.
    Proves ``scratchbank.application.adoption.adopt_child``."""
    tl = InMemoryTimeline()
    child = [TOOL, ChildNode("gate", "human")]
    got = adopt_child(
        "run-1.c", child, parent_run="run-1", parent=CONTAINER, parent_copy_based=False, timeline=tl
    )
    assert not got.adopted and got.rule == "S1"
    assert list(tl.read("run-1.c")) == []


def test_S1_use_case_adopts_a_parking_child_into_a_host_backed_scratch() -> None:
    """Use case adopts a parking child into a host backed scratch:
    ``scratchbank.application.adoption.adopt_child``."""
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
    """The adoption record lands before the child runs: ``scratchbank.application.adoption.adopt_child``."""
    tl = InMemoryTimeline()
    got = adopt_child(
        "run-1.c", [TOOL], parent_run="run-1", parent=CONTAINER, parent_copy_based=True, timeline=tl
    )
    assert got.adopted and got.rule == "S5"
    (rec,) = tl.read("run-1.c")
    assert isinstance(rec, SandboxShared) and rec.scratch_container_local and rec.parent_copy_based


def test_S5_a_record_that_does_not_land_within_its_budget_keeps_the_child_out() -> None:
    """The store refuses the record past its budget: the child does not run there.
    Proves ``scratchbank.application.adoption.adopt_child``."""
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


def test_S5_an_adoption_record_whose_reply_was_lost_is_settled_by_reading_never_written_twice() -> None:
    """The first append lands but its reply is lost (TIMELINE_WRITE_FAILED): the retry reads
    that it landed and writes nothing more; the child is adopted, its record there once.
    Proves ``scratchbank.application.adoption.adopt_child``."""
    from scratchbank.domain.errors import TimelineWriteFailed
    from scratchbank.testing.clocks import ManualClock

    class LostReply(InMemoryTimeline):
        lost = 1

        def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
            end = super().append(run_id, records, expected=expected)
            if self.lost:
                self.lost -= 1
                raise TimelineWriteFailed("committed, but the reply was lost")
            return end

    timeline = LostReply()
    got = adopt_child(
        "run-1.c",
        [TOOL],
        parent_run="run-1",
        parent=CONTAINER,
        parent_copy_based=False,
        timeline=timeline,
        budget=60.0,
        clock=ManualClock(),
    )
    assert got.adopted, got
    assert len(timeline.read("run-1.c")) == 1


# ---- from tests/test_rules_resume.py: The resume gate, rule by rule (R1-R15, S2-S4, C1-C2, C9-C10, A1-A12).


def test_S2_lone_child_resume_is_refused_from_the_adoption_record() -> None:
    """Lone child resume is refused from the adoption record: ``scratchbank.domain.decide_resume``."""
    d = decide(started(), shared(container_local=True), node("a"))
    assert d.code == SCRATCH_NOT_PORTABLE
    assert d.rule == "S2"


def test_S2_accepting_the_loss_goes_on_without_and_writes_the_forsake() -> None:
    """Accepting the loss goes on without and writes the forsake: ``scratchbank.domain.decide_resume``."""
    d = decide(started(), shared(container_local=True), consents=ACCEPT)
    assert d.verdict is Verdict.GO_ON_WITHOUT
    assert d.records == (ScratchForsaken(forced=False, accepted=True),)


def test_S2_adoption_without_lineage_is_not_refused() -> None:
    """An engine without the lineage record (scratch_container_local absent): not refused.
    Proves ``scratchbank.domain.decide_resume``."""
    assert decide(started(), shared(container_local=None)).verdict is Verdict.GO_ON_WITHOUT


def test_S3_A11_copy_based_parent_needs_force_too_and_the_scratch_refusal_comes_first() -> None:
    """Copy based parent needs force too and the scratch refusal comes first:
    ``scratchbank.domain.remedy``."""
    records = (started(), shared(container_local=True, copy_based=True))
    d = decide(*records)
    assert d.code == SCRATCH_NOT_PORTABLE
    assert kinds(d) == [CauseKind.LONE_CHILD, CauseKind.COPY_BASED_DIVERGENCE]
    assert d.also_needs_force
    d = decide(*records, consents=FORCE)
    assert d.code == SCRATCH_NOT_PORTABLE and d.keep_force and "keep --force" in remedy(d)
    d = decide(*records, consents=ACCEPT)
    assert d.code == RESUME_INVALID and "keep --accept-scratch-loss" in remedy(d)
    d = decide(*records, consents=BOTH)
    assert d.verdict is Verdict.GO_ON_WITHOUT
    assert d.records == (ScratchForsaken(forced=True, accepted=True),)


def test_S4_forsake_record_ends_the_refusal_and_its_absence_keeps_it() -> None:
    """Forsake record ends the refusal and its absence keeps it: ``scratchbank.domain.decide_resume``."""
    assert decide(started(), shared(), forsaken()).verdict is Verdict.GO_ON_WITHOUT
    assert decide(started(), shared()).refused
