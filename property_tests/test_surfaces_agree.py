"""The operator surfaces against RULES.md A15 and issue 12's "one function decides both":
for any timeline and any request, ``status`` says what ``resume`` then does, and a resume
with no target never restores into nothing: it writes nothing when it would restore, and
otherwise only its claim and its decision's own records, never a restore's outcome (X4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.application.resume import Target
from scratchbank.application.service import ScratchService
from scratchbank.domain.errors import NoRestoreTarget, RunNotFound
from scratchbank.domain.records import Record, RunResumed
from scratchbank.domain.resume_gate import ResumeRequest, Verdict
from scratchbank.testing.strategies import requests, timelines


def service_over(records: list[Record]) -> ScratchService:
    timeline = InMemoryTimeline()
    if records:
        timeline.append("run-1", records)
    return ScratchService(timeline, InMemoryBankStore())


@given(records=timelines.filter(bool), request=requests)
def test_status_says_what_a_resume_without_a_target_then_does(
    records: list[Record], request: ResumeRequest
) -> None:
    """status's decision is resume's; with no target a restore is refused and nothing written."""
    service = service_over(records)
    said = service.status("run-1", request).assessment
    if said.decision.verdict is Verdict.RESTORE:  # A15: refused by name, nothing written
        with pytest.raises(NoRestoreTarget):
            service.resume("run-1", request, Target())
        assert list(service.timeline.read("run-1")) == records
        return
    out = service.resume("run-1", request, Target())
    assert out.decision == said.decision
    written = list(service.timeline.read("run-1"))[len(records) :]
    # a refusal writes nothing (R); else its claim and its decision's own records (R13's,
    # S2's forsake), never a restore's outcome
    claimed = [RunResumed, *(type(r) for r in said.decision.records)]
    assert [type(r) for r in written] == ([] if said.decision.refused else claimed)


@given(request=requests, run_id=st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True))
def test_a_run_the_timeline_never_saw_is_not_found_and_stays_unseen(
    request: ResumeRequest, run_id: str
) -> None:
    """An unseen run is RUN_NOT_FOUND for status and resume, and stays unseen."""
    service = service_over([])
    for call in (lambda: service.status(run_id, request), lambda: service.resume(run_id, request, Target())):
        with pytest.raises(RunNotFound):
            call()
    assert list(service.timeline.read(run_id)) == []
