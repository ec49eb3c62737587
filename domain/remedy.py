"""The one remedy function: every surface and record reads its hint from here (C10).

A generic "--force" advice sent operators round again, each turn a claim and a pod;
so the hint is derived from the refusal itself, never written by a surface.
"""

from __future__ import annotations

from .errors import BankUnrecorded, CheckpointBankSwept, TimelineUnreadable
from .resume_gate import RESUME_INVALID, SCRATCH_NOT_PORTABLE, CauseKind, ResumeDecision

_LOSS = (
    "relaunch the run fresh; or resume it accepting the scratch's loss "
    "(--accept-scratch-loss) to continue as it stands"
)

_FORCE_WHAT = {
    CauseKind.SOURCE_CHANGED: "the source changed",
    CauseKind.ARTIFACT_CONTRACT_CHANGED: "the artifact contract changed",
    CauseKind.COPY_BASED_DIVERGENCE: "the parent's copy-based sandbox diverged",
}


def _force_phrase(decision: ResumeDecision) -> str:
    return " and ".join(_FORCE_WHAT[c.kind] for c in decision.force_causes)


def remedy(decision: ResumeDecision) -> str:
    """The hint an operator sees for this decision ('' when nothing needs doing)."""
    if decision.code == SCRATCH_NOT_PORTABLE:
        hint = _LOSS
        if decision.also_needs_force:
            hint += f"; {_force_phrase(decision)} too: add --force to accept that"
        elif decision.keep_force:
            hint += f"; {_force_phrase(decision)} too: keep --force"
        return hint
    if decision.code == RESUME_INVALID:
        hint = f"{_force_phrase(decision)}: resume with --force to accept that"
        if decision.keep_accept_scratch_loss:
            hint += "; keep --accept-scratch-loss"
        return hint
    if decision.code == CheckpointBankSwept.code:
        hint = CheckpointBankSwept.remedy  # K7, ADR 0013
        if decision.also_needs_force:
            hint += f"; {_force_phrase(decision)} too: add --force to accept that"
        return hint
    if decision.code == BankUnrecorded.code:
        return BankUnrecorded.remedy  # N3, ADR 0006
    if decision.refused:
        return TimelineUnreadable.remedy
    return ""
