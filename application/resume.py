"""The resume gate use case: read the timeline, fold it, ask the domain (R1-R15)."""

from __future__ import annotations

from scratchbank.domain.errors import TimelineUnreadable
from scratchbank.domain.fold import fold
from scratchbank.domain.kinds import NO_WORKFLOW, Workflow
from scratchbank.domain.resume_gate import (
    ResumeDecision,
    ResumeRequest,
    decide_resume,
    refuse_unreadable,
)

from .ports import Timeline


def check_resume(
    timeline: Timeline, run_id: str, request: ResumeRequest, workflow: Workflow = NO_WORKFLOW
) -> ResumeDecision:
    """May this resume go on, and how? A timeline that cannot be read refuses it (R15)."""
    try:
        records = timeline.read(run_id)
    except TimelineUnreadable as error:
        return refuse_unreadable(error.message)
    return decide_resume(fold(records, workflow), request)
