"""The resume gate, rule by rule (R1-R15, S2-S4, C1-C2, C9-C10, A1-A12)."""

from __future__ import annotations

from scratchbank.application.resume import check_resume
from scratchbank.domain import (
    RESUME_INVALID,
    SCRATCH_NOT_PORTABLE,
    CauseKind,
    Consents,
    ResumeDecision,
    ResumeRequest,
    ScratchForsaken,
    ScratchRestored,
    TimelineUnreadable,
    Verdict,
    Where,
    Workflow,
    decide_resume,
    fold,
    remedy,
)
from scratchbank.domain.records import NodeFinished, Record
from scratchbank.testing.builders import (
    banked,
    empty,
    forsaken,
    node,
    restored,
    resumed,
    rewound,
    shared,
    started,
    unbanked,
    unknown,
    went_on_without,
)

NONE = Consents()
FORCE = Consents(force=True)
ACCEPT = Consents(accept_scratch_loss=True)
BOTH = Consents(force=True, accept_scratch_loss=True)


def decide(
    *records: Record,
    consents: Consents = NONE,
    source_changed: bool = False,
    artifact_changed: bool = False,
    where: Where = Where.ENGINE,
    workflow: Workflow | None = None,
) -> ResumeDecision:
    request = ResumeRequest(
        consents=consents,
        source_changed=source_changed,
        artifact_contract_changed=artifact_changed,
        where=where,
    )
    state = fold(records, workflow) if workflow else fold(records)
    return decide_resume(state, request)


def kinds(decision: ResumeDecision) -> list[CauseKind]:
    return [c.kind for c in decision.causes]


# R1 -----------------------------------------------------------------------------------


def test_R1_non_empty_scratch_that_could_not_be_banked_is_refused() -> None:
    """A teardown that saw files but stored nothing refuses the resume, naming why."""
    d = decide(started(), node("a"), unbanked("over the 256 MiB cap"))
    assert d.verdict is Verdict.REFUSE
    assert d.code == SCRATCH_NOT_PORTABLE
    assert d.rule == "R1"
    assert "over the 256 MiB cap" in d.explanation
    assert [e.position for e in d.evidence] == [2]


def test_R1_unbanked_after_an_older_bank_still_refuses() -> None:
    """An older bank does not cover a later scratch that could not be banked."""
    d = decide(started(), banked(), resumed(), restored(), node("a"), unbanked())
    assert d.code == SCRATCH_NOT_PORTABLE
    assert kinds(d) == [CauseKind.SCRATCH_UNBANKED]


# R2-R5 --------------------------------------------------------------------------------


def test_R2_in_sandbox_node_finished_after_bank_is_refused() -> None:
    """An agent that finished after the bank makes the bank stale: restoring would revert it."""
    d = decide(started(), banked(), node("measure", "agent", in_sandbox=True))
    assert d.code == SCRATCH_NOT_PORTABLE
    assert d.rule == "R2"
    assert "measure" in d.explanation
    assert [e.type for e in d.evidence] == ["sandbox_scratch_banked", "node_finished"]


def test_R2_every_sandbox_kind_counts() -> None:
    """agent, judge, tool, subbot and llm_router all run in the sandbox."""
    for kind in ("agent", "judge", "tool", "subbot", "llm_router", "brand_new_kind"):
        d = decide(started(), banked(), node("n", kind))
        assert d.code == SCRATCH_NOT_PORTABLE, kind


def test_R2_node_finished_before_bank_does_not_count() -> None:
    """A node that finished before the bank is in the bank."""
    d = decide(started(), node("a"), banked())
    assert d.verdict is Verdict.RESTORE
    assert d.rule == "X1"


def test_R3_recorded_in_sandbox_wins_over_current_workflow() -> None:
    """Where the node ran is what its finish recorded, not what the source says now."""
    wf = Workflow(kinds={"renamed": "human", "a": "human"})
    d = decide(started(), banked(), node("a", "human", in_sandbox=True), workflow=wf)
    assert d.code == SCRATCH_NOT_PORTABLE
    d = decide(started(), banked(), node("a", "agent", in_sandbox=False), workflow=wf)
    assert d.verdict is Verdict.RESTORE


def test_R3_falls_back_to_recorded_kind_then_workflow_then_counts() -> None:
    """Without _in_sandbox: the finish's kind, then the current workflow, then 'a writer'."""
    wf = Workflow(kinds={"gate": "human"})
    assert decide(started(), banked(), node("gate", None), workflow=wf).verdict is Verdict.RESTORE
    assert decide(started(), banked(), node("x", None), workflow=wf).code == SCRATCH_NOT_PORTABLE
    assert decide(started(), banked(), node("gate", "tool"), workflow=wf).refused


def test_R4_failed_node_does_not_count() -> None:
    """A node that failed re-runs from the checkpoint: it does not make the bank stale."""
    d = decide(started(), banked(), node("a", ok=False))
    assert d.verdict is Verdict.RESTORE


def test_R5_engine_side_kinds_never_count() -> None:
    """human, condition router, compute (and the other engine-side kinds) never wrote there."""
    for kind in ("human", "condition_router", "compute", "emit", "wait", "done", "fail"):
        d = decide(started(), banked(), node("n", kind))
        assert d.verdict is Verdict.RESTORE, kind


def test_R5_answered_paused_node_does_not_count() -> None:
    """An agent that asked, finished by its answer on resume, does not count."""
    d = decide(started(), banked(), node("asker", "agent", answered=True, in_sandbox=True))
    assert d.verdict is Verdict.RESTORE


# R6 -----------------------------------------------------------------------------------


def test_R6_rewind_takes_back_dropped_nodes_off_cycle() -> None:
    """A rewind that drops the stale node (not on a cycle) makes the bank exact again."""
    d = decide(started(), banked(), node("a", on_cycle=False), rewound("a"))
    assert d.verdict is Verdict.RESTORE


def test_R6_rewind_does_not_take_back_a_node_on_a_cycle() -> None:
    """A node in a loop may have run passes the rewind does not replay: it still counts."""
    d = decide(started(), banked(), node("loop", on_cycle=True), rewound("loop"))
    assert d.code == SCRATCH_NOT_PORTABLE
    d = decide(started(), banked(), node("a", on_cycle=False), rewound("a", on_cycle=("a",)))
    assert d.code == SCRATCH_NOT_PORTABLE


def test_R6_cycle_unknown_is_read_as_on_a_cycle() -> None:
    """Nobody said whether the node lies on a cycle: never take it back in silence."""
    d = decide(started(), banked(), node("a", on_cycle=None), rewound("a"))
    assert d.code == SCRATCH_NOT_PORTABLE
    wf = Workflow(kinds={"a": "agent"}, on_cycle=frozenset())
    d = decide(started(), banked(), node("a", on_cycle=None), rewound("a"), workflow=wf)
    assert d.verdict is Verdict.RESTORE


def test_R6_rewind_does_not_take_back_nodes_it_did_not_drop_or_later_finishes() -> None:
    """Only dropped nodes, and only finishes before the rewind, are taken back."""
    assert decide(started(), banked(), node("a"), rewound("b")).refused
    assert decide(started(), banked(), rewound("a"), node("a")).refused


def test_R6_accepting_the_loss_resumes_on_that_bank() -> None:
    """A rewind across a loop is refused, and accepting the loss restores the bank."""
    d = decide(started(), banked(), node("loop", on_cycle=True), rewound("loop"), consents=ACCEPT)
    assert d.verdict is Verdict.RESTORE
    assert d.stale


# R7 -----------------------------------------------------------------------------------


def test_R7_going_on_without_the_bank_forsakes_it() -> None:
    """After a resume went on without the bank, loss accepted, nothing refuses or restores it."""
    d = decide(started(), banked(), node("a"), resumed(), went_on_without(), node("b"))
    assert d.verdict is Verdict.GO_ON_WITHOUT
    assert d.rule == "R7"


def test_R7_restoring_a_stale_bank_makes_it_current_again() -> None:
    """A stale bank restored with the loss accepted is the run's scratch again (A2)."""
    d = decide(started(), banked(), node("a"), resumed(), restored(stale=True, accepted=True))
    assert d.verdict is Verdict.RESTORE
    assert not d.stale
    d = decide(started(), banked(), node("a"), resumed(), restored(stale=True, accepted=True), node("b"))
    assert d.refused
    assert "b" in d.explanation
    assert "a," not in d.explanation


# R8, R9, C1, C2, C9 -------------------------------------------------------------------


def test_R8_scratch_refusal_comes_first_and_names_the_changed_source() -> None:
    """Both causes in one refusal, scratch first; the resume needs both consents."""
    d = decide(started(), banked(), node("a"), source_changed=True)
    assert d.code == SCRATCH_NOT_PORTABLE
    assert kinds(d) == [CauseKind.SCRATCH_STALE, CauseKind.SOURCE_CHANGED]
    assert d.also_needs_force
    assert "add --force" in remedy(d)


def test_R8_scratch_consent_alone_is_refused_for_the_source_naming_force() -> None:
    """The scratch consent only: RESUME_INVALID naming --force, keep the consent."""
    d = decide(started(), banked(), node("a"), source_changed=True, consents=ACCEPT)
    assert d.code == RESUME_INVALID
    assert d.keep_accept_scratch_loss
    assert "--force" in remedy(d)
    assert "keep --accept-scratch-loss" in remedy(d)


def test_R8_both_consents_run() -> None:
    d = decide(started(), banked(), node("a"), source_changed=True, consents=BOTH)
    assert d.verdict is Verdict.RESTORE
    assert d.stale


def test_R9_surface_judges_scratch_while_latest_execution_may_still_bank() -> None:
    """About to refuse for --force's reason, the surface shows the scratch's loss first."""
    records = (started(), banked(), node("a"), resumed())
    d = decide(*records, source_changed=True, where=Where.SURFACE)
    assert d.code == SCRATCH_NOT_PORTABLE
    assert kinds(d) == [CauseKind.SCRATCH_STALE, CauseKind.SOURCE_CHANGED]
    d = decide(*records, artifact_changed=True, where=Where.SURFACE)
    assert kinds(d) == [CauseKind.SCRATCH_STALE, CauseKind.ARTIFACT_CONTRACT_CHANGED]


def test_C1_A9_force_never_accepts_the_scratch_loss() -> None:
    """--force alone still refuses the scratch, and tells the caller to keep --force (A9)."""
    d = decide(started(), banked(), node("a"), source_changed=True, consents=FORCE)
    assert d.code == SCRATCH_NOT_PORTABLE
    assert not d.also_needs_force
    assert d.keep_force
    assert "keep --force" in remedy(d)
    d = decide(started(), unbanked(), consents=FORCE)
    assert d.code == SCRATCH_NOT_PORTABLE


def test_C2_accept_scratch_loss_is_what_lets_the_loss_go() -> None:
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
    """The hint is derived from the refusal, never a generic '--force' advice."""
    d = decide(started(), unbanked())
    assert remedy(d).startswith("relaunch the run fresh; or resume it accepting the scratch's loss")
    assert "--force" not in remedy(d)
    d = decide(started(), banked(), source_changed=True)
    assert d.code == RESUME_INVALID
    assert "--accept-scratch-loss" not in remedy(d)


def test_A4_changed_source_without_scratch_loss_is_resume_invalid() -> None:
    d = decide(started(), banked(), source_changed=True)
    assert d.code == RESUME_INVALID
    assert d.rule == "R8"
    assert decide(started(), banked(), source_changed=True, consents=FORCE).verdict is Verdict.RESTORE


# R10 ----------------------------------------------------------------------------------


def test_R10_surface_defers_when_latest_execution_wrote_no_teardown_record() -> None:
    """The run reads paused while its teardown runs: the surface leaves it to the engine."""
    records = (started(), banked(), node("a"), resumed())
    assert decide(*records, where=Where.SURFACE).verdict is Verdict.DEFER_TO_ENGINE
    assert decide(*records, where=Where.ENGINE).code == SCRATCH_NOT_PORTABLE


def test_R10_surface_refuses_from_a_record_the_latest_execution_wrote() -> None:
    d = decide(started(), banked(), node("a"), resumed(), unbanked(), where=Where.SURFACE)
    assert d.code == SCRATCH_NOT_PORTABLE


def test_A1_first_execution_without_a_teardown_record_may_still_be_banking() -> None:
    assert decide(started(), node("a"), where=Where.SURFACE).verdict is Verdict.DEFER_TO_ENGINE
    assert decide(started(), node("a")).verdict is Verdict.GO_ON_WITHOUT


# R13, R14, R15 ------------------------------------------------------------------------


def test_R13_accepting_an_unbanked_loss_records_it() -> None:
    """Past a scratch its teardown could not bank, the resume records {accepted, reason}."""
    d = decide(started(), unbanked("tar failed"), consents=ACCEPT)
    (record,) = d.records
    assert isinstance(record, ScratchRestored)
    assert record.accepted and not record.restored
    assert "tar failed" in record.reason


def test_R14_unknown_record_is_not_refused_and_a_bank_before_it_still_decides() -> None:
    assert decide(started(), node("a"), unknown()).verdict is Verdict.GO_ON_WITHOUT
    d = decide(started(), banked(), resumed(), restored(), unknown())
    assert d.verdict is Verdict.RESTORE
    d = decide(started(), banked(), resumed(), node("a"), unknown())
    assert d.code == SCRATCH_NOT_PORTABLE


def test_R15_unreadable_timeline_refuses_without_a_code() -> None:
    """A timeline that cannot be read refuses; it never reads as 'nothing recorded'."""

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


# S2-S4, A5 ----------------------------------------------------------------------------


def test_S2_lone_child_resume_is_refused_from_the_adoption_record() -> None:
    d = decide(started(), shared(container_local=True), node("a"))
    assert d.code == SCRATCH_NOT_PORTABLE
    assert d.rule == "S2"


def test_S2_accepting_the_loss_goes_on_without_and_writes_the_forsake() -> None:
    d = decide(started(), shared(container_local=True), consents=ACCEPT)
    assert d.verdict is Verdict.GO_ON_WITHOUT
    assert d.records == (ScratchForsaken(forced=False, accepted=True),)


def test_S2_adoption_without_lineage_is_not_refused() -> None:
    """An engine without the lineage record (scratch_container_local absent): not refused."""
    assert decide(started(), shared(container_local=None)).verdict is Verdict.GO_ON_WITHOUT


def test_S3_A11_copy_based_parent_needs_force_too_and_the_scratch_refusal_comes_first() -> None:
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
    assert decide(started(), shared(), forsaken()).verdict is Verdict.GO_ON_WITHOUT
    assert decide(started(), shared()).refused


def test_A5_copy_based_parent_not_container_local_needs_force_only() -> None:
    d = decide(started(), shared(container_local=False, copy_based=True))
    assert d.code == RESUME_INVALID
    assert d.rule == "A5"


def test_A3_accepted_loss_is_final_for_the_record_it_accepted() -> None:
    """After accepting an unbanked loss, the older bank is not restored over the run."""
    records = (started(), banked(), resumed(), restored(), node("a"), unbanked())
    records += (resumed(accept_scratch_loss=True), went_on_without("tar failed"))
    d = decide(*records)
    assert d.verdict is Verdict.GO_ON_WITHOUT
    assert d.rule == "R7"


def test_A10_several_causes_are_named_in_one_refusal() -> None:
    records = (started(), shared(copy_based=True), banked(), node("a"))
    d = decide(*records, source_changed=True)
    assert set(kinds(d)) == {
        CauseKind.LONE_CHILD,
        CauseKind.SCRATCH_STALE,
        CauseKind.SOURCE_CHANGED,
        CauseKind.COPY_BASED_DIVERGENCE,
    }


def test_A12_consent_counts_without_an_earlier_refusal() -> None:
    assert decide(started(), unbanked(), consents=ACCEPT).verdict is Verdict.GO_ON_WITHOUT


def test_X6_host_backed_handover_means_no_bank_decides() -> None:
    d = decide(started(), banked(), resumed(), restored(host_backed=True), node("a"))
    assert d.verdict is Verdict.GO_ON_WITHOUT
    assert d.rule == "X6"


def test_T4_empty_teardown_means_nothing_to_restore() -> None:
    d = decide(started(), banked(), resumed(), restored(), empty(), node("a"))
    assert d.verdict is Verdict.GO_ON_WITHOUT


def test_unknown_record_types_are_passed_over() -> None:
    from scratchbank.domain import UnknownRecord

    d = decide(started(), banked(), UnknownRecord(type="llm_usage", data={"t": 1}))
    assert d.verdict is Verdict.RESTORE
    assert fold([UnknownRecord(type="x")]).unknown_records == 1


def test_node_finished_record_is_what_the_fold_reads() -> None:
    """Sanity: the builder writes the metadata fields the rules read."""
    rec = node("a", "agent", in_sandbox=True, on_cycle=True)
    assert isinstance(rec, NodeFinished) and rec.in_sandbox and rec.on_cycle


# A13, A14 -----------------------------------------------------------------------------


def test_A13_an_unknown_record_after_an_unbanked_one_is_not_refused() -> None:
    """R14 reads the latest unknown record as 'not refused', exactly as after no record."""
    d = decide(started(), node("a"), unbanked("tar failed"), resumed(), unknown())
    assert d.verdict is Verdict.GO_ON_WITHOUT and d.rule == "R14"
    assert d.code is None and not d.records  # nothing forsaken, nothing to accept


def test_A13_an_unbanked_record_replaces_an_older_bank() -> None:
    """R1 reads the last teardown: the older bank is no longer the run's scratch."""
    state = fold([started(), banked(), resumed(), node("a"), unbanked("over the cap")])
    assert state.bank is None and state.unbanked is not None
    d = decide(started(), banked(), resumed(), node("a"), unbanked(), consents=ACCEPT)
    assert d.verdict is Verdict.GO_ON_WITHOUT and d.rule == "R13"
    # ...and an unknown record after it does not bring the older bank back either
    d = decide(started(), banked(), resumed(), unbanked(), resumed(), unknown())
    assert d.verdict is Verdict.GO_ON_WITHOUT and d.bank is None


def test_A14_a_host_backed_restore_ends_the_may_still_be_banking_window() -> None:
    """The latest execution restored into a host directory: it will never bank (X6)."""
    records = (started(), banked(), resumed(), restored(host_backed=True))
    assert not fold(records).may_still_be_banking
    d = decide(*records, where=Where.SURFACE)
    assert d.verdict is Verdict.GO_ON_WITHOUT and d.rule == "X6"
    # a later execution opens the window again
    assert fold([*records, resumed()]).may_still_be_banking
    assert decide(*records, resumed(), where=Where.SURFACE).verdict is Verdict.DEFER_TO_ENGINE
