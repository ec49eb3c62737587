"""The run's state as every decision reads it: its latest trusted snapshot and the records
after it, folded as a stream (issue 26, ADR 0010: no decision pays a full read)."""

from __future__ import annotations

from scratchbank.domain.fold import ScratchState, fold
from scratchbank.domain.kinds import NO_WORKFLOW, Workflow
from scratchbank.domain.snapshot import state_from_data, state_to_data

from .ports import SnapshotStore, Timeline

__all__ = ["SNAPSHOT_EVERY", "current_state"]

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
    ``records`` on the state is the version read (the timeline's length).
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
    state = fold(snapshots.read_after(run_id, since), start=start)  # streamed: memory stays flat
    if state.records - since >= SNAPSHOT_EVERY:
        snapshots.save_snapshot(run_id, state.records, state_to_data(state))
    return state
