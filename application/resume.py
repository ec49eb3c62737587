"""The resume gate use case: read the timeline, fold it, ask the domain (R1-R15)."""

from __future__ import annotations

from scratchbank.domain.errors import TimelineUnreadable
from scratchbank.domain.fold import ScratchState, fold
from scratchbank.domain.kinds import NO_WORKFLOW, Workflow
from scratchbank.domain.resume_gate import (
    ResumeDecision,
    ResumeRequest,
    decide_resume,
    refuse_unreadable,
)
from scratchbank.domain.snapshot import state_from_data, state_to_data

from .ports import SnapshotStore, Timeline

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
