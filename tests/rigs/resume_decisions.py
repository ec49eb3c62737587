"""The resume gate's decision from records (``decide_resume``) and the consents it is asked with.

First written for tests/test_rules_resume.py: The resume gate, rule by rule (R1-R15, S2-S4, C1-C2,
C9-C10, A1-A12)."""

from __future__ import annotations

from scratchbank.domain import (
    CauseKind,
    Consents,
    ResumeDecision,
    ResumeRequest,
    Where,
    Workflow,
    decide_resume,
    fold,
)
from scratchbank.domain.records import Record

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
