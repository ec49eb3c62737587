"""Rules R: the resume gate: refuse or go on, before anything moves. The pure tier's tests of R1, R2,
R3, R4, R5, R6, R7, R8, R9, R10, R13, R14, R15 (tests/tiers.py: a file of tests/rules/ has its tier
in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import pytest
from rigs.resume_decisions import ACCEPT, BOTH, decide, kinds

from scratchbank.application.resume import check_resume
from scratchbank.domain import (
    RESUME_INVALID,
    SCRATCH_NOT_PORTABLE,
    CauseKind,
    ResumeRequest,
    ScratchRestored,
    TimelineUnreadable,
    Verdict,
    Where,
    Workflow,
    decode_all,
    encode,
    remedy,
)
from scratchbank.domain.records import Record
from scratchbank.testing.builders import (
    banked,
    node,
    restored,
    resumed,
    rewound,
    started,
    unbanked,
    unknown,
    went_on_without,
)

# ---- from tests/test_rules_resume.py: The resume gate, rule by rule (R1-R15, S2-S4, C1-C2, C9-C10, A1-A12).


def test_R1_non_empty_scratch_that_could_not_be_banked_is_refused() -> None:
    """A teardown that saw files but stored nothing refuses the resume, naming why.
    Proves ``scratchbank.domain.decide_resume``."""
    d = decide(started(), node("a"), unbanked("over the 256 MiB cap"))
    assert d.verdict is Verdict.REFUSE
    assert d.code == SCRATCH_NOT_PORTABLE
    assert d.rule == "R1"
    assert "over the 256 MiB cap" in d.explanation
    assert [e.position for e in d.evidence] == [2]


def test_R1_unbanked_after_an_older_bank_still_refuses() -> None:
    """An older bank does not cover a later scratch that could not be banked.
    Proves ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), resumed(), restored(), node("a"), unbanked())
    assert d.code == SCRATCH_NOT_PORTABLE
    assert kinds(d) == [CauseKind.SCRATCH_UNBANKED]


def test_R2_in_sandbox_node_finished_after_bank_is_refused() -> None:
    """An agent that finished after the bank makes the bank stale: restoring would revert it.
    Proves ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), node("measure", "agent", in_sandbox=True))
    assert d.code == SCRATCH_NOT_PORTABLE
    assert d.rule == "R2"
    assert "measure" in d.explanation
    assert [e.type for e in d.evidence] == ["sandbox_scratch_banked", "node_finished"]


def test_R2_every_sandbox_kind_counts() -> None:
    """agent, judge, tool, subbot and llm_router all run in the sandbox.
    Proves ``scratchbank.domain.decide_resume``."""
    for kind in ("agent", "judge", "tool", "subbot", "llm_router", "brand_new_kind"):
        d = decide(started(), banked(), node("n", kind))
        assert d.code == SCRATCH_NOT_PORTABLE, kind


def test_R2_node_finished_before_bank_does_not_count() -> None:
    """A node that finished before the bank is in the bank. Proves ``scratchbank.domain.decide_resume``."""
    d = decide(started(), node("a"), banked())
    assert d.verdict is Verdict.RESTORE
    assert d.rule == "X1"


def test_R3_recorded_in_sandbox_wins_over_current_workflow() -> None:
    """Where the node ran is what its finish recorded, not what the source says now.
    Proves ``scratchbank.domain.decide_resume``."""
    wf = Workflow(kinds={"renamed": "human", "a": "human"})
    d = decide(started(), banked(), node("a", "human", in_sandbox=True), workflow=wf)
    assert d.code == SCRATCH_NOT_PORTABLE
    d = decide(started(), banked(), node("a", "agent", in_sandbox=False), workflow=wf)
    assert d.verdict is Verdict.RESTORE


def test_R3_falls_back_to_recorded_kind_then_workflow_then_counts() -> None:
    """Without _in_sandbox: the finish's kind, then the current workflow, then 'a writer'.
    Proves ``scratchbank.domain.decide_resume``."""
    wf = Workflow(kinds={"gate": "human"})
    assert decide(started(), banked(), node("gate", None), workflow=wf).verdict is Verdict.RESTORE
    assert decide(started(), banked(), node("x", None), workflow=wf).code == SCRATCH_NOT_PORTABLE
    assert decide(started(), banked(), node("gate", "tool"), workflow=wf).refused


def test_R4_failed_node_does_not_count() -> None:
    """A node that failed re-runs from the checkpoint: it does not make the bank stale.
    Proves ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), node("a", ok=False))
    assert d.verdict is Verdict.RESTORE


def test_R5_engine_side_kinds_never_count() -> None:
    """human, condition router, compute (and the other engine-side kinds) never wrote there.
    Proves ``scratchbank.domain.decide_resume``."""
    for kind in ("human", "condition_router", "compute", "emit", "wait", "done", "fail"):
        d = decide(started(), banked(), node("n", kind))
        assert d.verdict is Verdict.RESTORE, kind


def test_R5_answered_paused_node_does_not_count() -> None:
    """An agent that asked, finished by its answer on resume, does not count.
    Proves ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), node("asker", "agent", answered=True, in_sandbox=True))
    assert d.verdict is Verdict.RESTORE


def test_R6_rewind_takes_back_dropped_nodes_off_cycle() -> None:
    """A rewind that drops the stale node (not on a cycle) makes the bank exact again.
    Proves ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), node("a", on_cycle=False), rewound("a"))
    assert d.verdict is Verdict.RESTORE


def test_R6_rewind_does_not_take_back_a_node_on_a_cycle() -> None:
    """A node in a loop may have run passes the rewind does not replay: it still counts.
    Proves ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), node("loop", on_cycle=True), rewound("loop"))
    assert d.code == SCRATCH_NOT_PORTABLE
    d = decide(started(), banked(), node("a", on_cycle=False), rewound("a", on_cycle=("a",)))
    assert d.code == SCRATCH_NOT_PORTABLE


def test_R6_cycle_unknown_is_read_as_on_a_cycle() -> None:
    """Nobody said whether the node lies on a cycle: never take it back in silence.
    Proves ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), node("a", on_cycle=None), rewound("a"))
    assert d.code == SCRATCH_NOT_PORTABLE
    wf = Workflow(kinds={"a": "agent"}, on_cycle=frozenset())
    d = decide(started(), banked(), node("a", on_cycle=None), rewound("a"), workflow=wf)
    assert d.verdict is Verdict.RESTORE


def test_R6_rewind_does_not_take_back_nodes_it_did_not_drop_or_later_finishes() -> None:
    """Only dropped nodes, and only finishes before the rewind, are taken back.
    Proves ``scratchbank.domain.decide_resume``."""
    assert decide(started(), banked(), node("a"), rewound("b")).refused
    assert decide(started(), banked(), rewound("a"), node("a")).refused


def test_R6_accepting_the_loss_resumes_on_that_bank() -> None:
    """A rewind across a loop is refused, and accepting the loss restores the bank.
    Proves ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), node("loop", on_cycle=True), rewound("loop"), consents=ACCEPT)
    assert d.verdict is Verdict.RESTORE
    assert d.stale


def test_R7_going_on_without_the_bank_forsakes_it() -> None:
    """After a resume went on without the bank, loss accepted, nothing refuses or restores it.
    Proves ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), node("a"), resumed(), went_on_without(), node("b"))
    assert d.verdict is Verdict.GO_ON_WITHOUT
    assert d.rule == "R7"


def test_R7_restoring_a_stale_bank_makes_it_current_again() -> None:
    """A stale bank restored with the loss accepted is the run's scratch again (A2).
    Proves ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), node("a"), resumed(), restored(stale=True, accepted=True))
    assert d.verdict is Verdict.RESTORE
    assert not d.stale
    d = decide(started(), banked(), node("a"), resumed(), restored(stale=True, accepted=True), node("b"))
    assert d.refused
    assert "b" in d.explanation
    assert "a," not in d.explanation


def test_R8_scratch_refusal_comes_first_and_names_the_changed_source() -> None:
    """Both causes in one refusal, scratch first; the resume needs both consents.
    Proves ``scratchbank.domain.remedy``."""
    d = decide(started(), banked(), node("a"), source_changed=True)
    assert d.code == SCRATCH_NOT_PORTABLE
    assert kinds(d) == [CauseKind.SCRATCH_STALE, CauseKind.SOURCE_CHANGED]
    assert d.also_needs_force
    assert "add --force" in remedy(d)


def test_R8_scratch_consent_alone_is_refused_for_the_source_naming_force() -> None:
    """The scratch consent only: RESUME_INVALID naming --force, keep the consent.
    Proves ``scratchbank.domain.remedy``."""
    d = decide(started(), banked(), node("a"), source_changed=True, consents=ACCEPT)
    assert d.code == RESUME_INVALID
    assert d.keep_accept_scratch_loss
    assert "--force" in remedy(d)
    assert "keep --accept-scratch-loss" in remedy(d)


def test_R8_both_consents_run() -> None:
    """Both consents run: ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), node("a"), source_changed=True, consents=BOTH)
    assert d.verdict is Verdict.RESTORE
    assert d.stale


def test_R9_surface_judges_scratch_while_latest_execution_may_still_bank() -> None:
    """About to refuse for --force's reason, the surface shows the scratch's loss first.
    Proves ``scratchbank.domain.decide_resume``."""
    records = (started(), banked(), node("a"), resumed())
    d = decide(*records, source_changed=True, where=Where.SURFACE)
    assert d.code == SCRATCH_NOT_PORTABLE
    assert kinds(d) == [CauseKind.SCRATCH_STALE, CauseKind.SOURCE_CHANGED]
    d = decide(*records, artifact_changed=True, where=Where.SURFACE)
    assert kinds(d) == [CauseKind.SCRATCH_STALE, CauseKind.ARTIFACT_CONTRACT_CHANGED]


def test_R10_surface_defers_when_latest_execution_wrote_no_teardown_record() -> None:
    """The run reads paused while its teardown runs: the surface leaves it to the engine.
    Proves ``scratchbank.domain.decide_resume``."""
    records = (started(), banked(), node("a"), resumed())
    assert decide(*records, where=Where.SURFACE).verdict is Verdict.DEFER_TO_ENGINE
    assert decide(*records, where=Where.ENGINE).code == SCRATCH_NOT_PORTABLE


def test_R10_surface_refuses_from_a_record_the_latest_execution_wrote() -> None:
    """Surface refuses from a record the latest execution wrote: ``scratchbank.domain.decide_resume``."""
    d = decide(started(), banked(), node("a"), resumed(), unbanked(), where=Where.SURFACE)
    assert d.code == SCRATCH_NOT_PORTABLE


def test_R13_accepting_an_unbanked_loss_records_it() -> None:
    """Past a scratch its teardown could not bank, the resume records {accepted, reason}.
    Proves ``scratchbank.domain.decide_resume``."""
    d = decide(started(), unbanked("tar failed"), consents=ACCEPT)
    (record,) = d.records
    assert isinstance(record, ScratchRestored)
    assert record.accepted and not record.restored
    assert "tar failed" in record.reason


def test_R14_unknown_record_is_not_refused_and_a_bank_before_it_still_decides() -> None:
    """Unknown record is not refused and a bank before it still decides:
    ``scratchbank.domain.decide_resume``."""
    assert decide(started(), node("a"), unknown()).verdict is Verdict.GO_ON_WITHOUT
    d = decide(started(), banked(), resumed(), restored(), unknown())
    assert d.verdict is Verdict.RESTORE
    d = decide(started(), banked(), resumed(), node("a"), unknown())
    assert d.code == SCRATCH_NOT_PORTABLE


def test_R15_unreadable_timeline_refuses_without_a_code() -> None:
    """A timeline that cannot be read refuses; it never reads as 'nothing recorded'.
    Proves ``scratchbank.application.resume.check_resume``."""

    class Broken:
        def read(self, run_id: str) -> list[Record]:
            raise TimelineUnreadable("store down")

        def append(self, run_id: str, records: object, *, expected: int | None = None) -> int:
            raise AssertionError("never written")

    d = check_resume(Broken(), "run-1", ResumeRequest(consents=BOTH))
    assert d.verdict is Verdict.REFUSE
    assert d.code is None
    assert d.rule == "R15"
    assert "repair" in remedy(d)


# ---- from tests/test_wire.py: The wire codec: stable names, versions, strict reading of known records (A6, R15).


def test_R15_one_bad_record_makes_the_whole_timeline_unreadable_naming_it() -> None:
    """One bad record makes the whole timeline unreadable naming it: ``scratchbank.domain.decode_all``."""
    good = encode(node("a"))
    with pytest.raises(TimelineUnreadable, match="record 2"):
        decode_all([good, {"type": "node_finished"}, good])
