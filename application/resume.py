"""The resume use case (R1-R15, X1-X7): the gate, then the restore and its record.

The gate reads the timeline, folds it and asks the domain; a resume that goes on
writes its ``run_resumed`` and, when it restores, hands the bank to ``restore.py``
and records what happened within the budget X7 gives it.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from scratchbank.domain.errors import TimelineUnreadable
from scratchbank.domain.fold import ScratchState, fold
from scratchbank.domain.kinds import NO_WORKFLOW, Workflow
from scratchbank.domain.records import RunResumed
from scratchbank.domain.restore import RestoreOutcome, after_restore
from scratchbank.domain.resume_gate import (
    ResumeDecision,
    ResumeRequest,
    Verdict,
    decide_resume,
    refuse_unreadable,
)
from scratchbank.domain.snapshot import state_from_data, state_to_data

from .clock import Clock, SystemClock
from .ports import BankStore, Sandbox, SnapshotStore, Timeline
from .recording import append_within_budget
from .restore import Progress, restore_bank

RECORD_BUDGET = 30.0

#: Save a new snapshot once this many records came after the last one.
SNAPSHOT_EVERY = 1000


def current_state(
    timeline: Timeline,
    run_id: str,
    workflow: Workflow = NO_WORKFLOW,
    snapshots: SnapshotStore | None = None,
) -> ScratchState:
    """Fold the run's timeline, from its latest snapshot when there is one it can trust.

    Snapshots are used only without a workflow fallback (the fold depends on it).
    Raises TimelineUnreadable as reading the timeline does.
    """
    if snapshots is None or workflow != NO_WORKFLOW:
        return fold(timeline.read(run_id), workflow)
    start: ScratchState | None = None
    snap = snapshots.load_snapshot(run_id)
    if snap is not None:
        start = state_from_data(snap[1])
        if start is not None and start.records != snap[0]:
            start = None
    since = start.records if start is not None else 0
    tail = snapshots.read_after(run_id, since) if start is not None else timeline.read(run_id)
    state = fold(tail, start=start)
    if state.records - since >= SNAPSHOT_EVERY:
        snapshots.save_snapshot(run_id, state.records, state_to_data(state))
    return state


def check_resume(
    timeline: Timeline,
    run_id: str,
    request: ResumeRequest,
    workflow: Workflow = NO_WORKFLOW,
    snapshots: SnapshotStore | None = None,
) -> ResumeDecision:
    """May this resume go on, and how? A timeline that cannot be read refuses it (R15)."""
    try:
        state = current_state(timeline, run_id, workflow, snapshots)
    except TimelineUnreadable as error:
        return refuse_unreadable(error.message)
    return decide_resume(state, request)


@attrs.frozen
class ResumeOutcome:
    decision: ResumeDecision
    restore: RestoreOutcome | None = None
    recorded: bool = True

    @property
    def proceeds(self) -> bool:
        if self.decision.verdict in (Verdict.REFUSE, Verdict.DEFER_TO_ENGINE):
            return False
        return self.restore is None or (self.restore.proceed and self.recorded)


def resume(
    run_id: str,
    request: ResumeRequest,
    *,
    timeline: Timeline,
    store: BankStore,
    sandbox: Sandbox | None,
    host_directory: Path | None = None,
    workflow: Workflow = NO_WORKFLOW,
    attempt: str | None = None,
    clock: Clock | None = None,
    progress: Progress | None = None,
    snapshots: SnapshotStore | None = None,
) -> ResumeOutcome:
    """The whole resume as an engine runs it: gate, then (if it goes on) restore, record."""
    clock = clock or SystemClock()
    decision = check_resume(timeline, run_id, request, workflow, snapshots)
    if decision.verdict in (Verdict.REFUSE, Verdict.DEFER_TO_ENGINE):
        return ResumeOutcome(decision)  # R: refused before anything moves the run
    consents = request.consents
    started = RunResumed(
        attempt=attempt, force=consents.force, accept_scratch_loss=consents.accept_scratch_loss
    )
    timeline.append(run_id, [started, *decision.records])
    if decision.verdict is not Verdict.RESTORE:
        return ResumeOutcome(decision)
    attempt_ = restore_bank(
        run_id,
        decision,
        store=store,
        sandbox=sandbox,
        host_directory=host_directory,
        progress=progress,
    )
    outcome = after_restore(decision, attempt_)
    # X7: the host_backed and stale records within their budget; any other once.
    budget = RECORD_BUDGET if outcome.must_record else 0.0
    why = append_within_budget(timeline, run_id, [outcome.record], clock=clock, budget=budget)
    recorded = why is None or not outcome.must_record
    return ResumeOutcome(decision, outcome, recorded)
