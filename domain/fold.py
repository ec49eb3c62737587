"""The fold: a run's timeline -> the state of its scratch. Every decision reads this.

One pass over the records, in order, with no I/O and no clock. The state keeps the
position (0-based index in the timeline) of each record it rests on, so that every
decision can name the events behind it.

Why a single fold: teardown, the resume gate, the restore and the operators' status
all ask the same questions (is there a bank, is it stale, was it forsaken...). One
function answering them means no surface can disagree with another.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from .checkpoints import Checkpoint
from .kinds import NO_WORKFLOW, Workflow, kind_writes_scratch
from .records import (
    AttemptClaimed,
    AttemptQueued,
    NodeFinished,
    Record,
    RunResumed,
    RunRewound,
    RunStarted,
    RunStatus,
    RunStatusChanged,
    SandboxShared,
    ScratchBanked,
    ScratchForsaken,
    ScratchRestored,
    UnknownRecord,
)
from .retention import Kept, forget, remember


@attrs.frozen
class Evidence:
    """One record a decision rests on: its position in the timeline and its wire name."""

    position: int
    type: str

    def __str__(self) -> str:
        return f"#{self.position + 1} {self.type}"


def _ev(position: int, record: Record) -> Evidence:
    return Evidence(position, record.type if isinstance(record, UnknownRecord) else record.WIRE)


@attrs.frozen
class Bank:
    """The bank a resume would restore: its record, and since when writes make it stale.

    ``current_since`` is the bank's own record, or a later restore that made it the
    run's scratch again (A2, R7).
    """

    evidence: Evidence
    record: ScratchBanked
    current_since: int
    #: the checkpoint this bank is the scratch of (ADR 0013): its record's stamp, or the
    #: checkpoint a later restore named; None: unstamped, the events decide (K5)
    checkpoint: Checkpoint | None = None


@attrs.frozen
class StaleWrite:
    """A counted finish after the bank: restoring would revert what it wrote (R2).

    ``on_cycle`` is what the finish (or, failing that, the workflow) said; None when
    nobody said, which a rewind reads as "on a cycle" (it may have run passes the
    rewind does not replay).
    """

    evidence: Evidence
    node: str
    on_cycle: bool | None
    #: K9: the pass its finish named (None: it named none)
    pass_: int | None = None
    #: K9: the rewind that named this node's replayed passes and kept this one (a pass
    #: before the one it returns to, or an in-flight branch the run lets finish)
    kept_by: Evidence | None = None


@attrs.frozen
class Adoption:
    """This run is a child adopted into its parent's sandbox (S2, S3, A5)."""

    evidence: Evidence
    scratch_container_local: bool
    parent_copy_based: bool


@attrs.frozen
class ScratchState:
    """What the timeline says of the run's scratch. Built only by ``fold``."""

    records: int = 0
    bank: Bank | None = None
    stale_writes: tuple[StaleWrite, ...] = ()
    unbanked: Evidence | None = None
    unbanked_reason: str = ""
    forsaken: Evidence | None = None
    host_backed: Evidence | None = None
    last_teardown: Evidence | None = None
    banking_ended: Evidence | None = None
    latest_execution: Evidence | None = None
    #: the id the latest execution's start record gave it (A18), None when it gave none
    latest_execution_id: str | None = None
    #: every bank object a banked teardown record named (None: the legacy key), so that
    #: N3 sorts a listing from the fold alone, never from the whole timeline (issue 26)
    named_objects: frozenset[str | None] = frozenset()
    adoption: Adoption | None = None
    hold: Evidence | None = None
    queued_attempt: AttemptQueued | None = None
    claimed_attempt: str | None = None
    status: RunStatus | None = None
    unknown_records: int = 0
    #: the banks stamped teardowns took, one per checkpoint, newest last (ADR 0013, K6-K8)
    history: tuple[Kept, ...] = ()
    #: K9: the latest rewind that took back, by pass, a write after the current bank
    replayed: Evidence | None = None

    @property
    def stale(self) -> bool:
        return bool(self.bank and self.stale_writes)

    @property
    def may_still_be_banking(self) -> bool:
        """The latest execution wrote no teardown record yet (R10, A1).

        A host-backed restore (X6) ends the window as a teardown record does (A14): that
        execution's scratch is a host directory, which is never banked.
        """
        ended = self.banking_ended
        if ended is None:
            return True
        execution = self.latest_execution
        return execution is not None and execution.position > ended.position

    @property
    def lone_child(self) -> Adoption | None:
        """The adoption that refuses this child's lone resume, if any (S2)."""
        adoption = self.adoption
        return adoption if adoption and adoption.scratch_container_local else None


def counts_as_write(record: NodeFinished, workflow: Workflow) -> bool:
    """Does this finish make an earlier bank stale? (R2-R5)."""
    if not record.succeeded or record.answered:
        return False
    if record.in_sandbox is not None:
        return record.in_sandbox
    if record.kind is not None:
        return kind_writes_scratch(record.kind)
    if workflow.knows(record.node):
        return kind_writes_scratch(workflow.kinds[record.node])
    return True


def _on_cycle(record: NodeFinished, workflow: Workflow) -> bool | None:
    if record.on_cycle is not None:
        return record.on_cycle
    if workflow.knows(record.node):
        return record.node in workflow.on_cycle
    return None


def _taken_back(write: StaleWrite, rewind: RunRewound) -> bool:
    """A rewind takes back a dropped node's write unless the node lies on a cycle (R6),
    or, when it names the node's replayed passes and the finish its pass, exactly the
    passes it replays (K9)."""
    if not rewind.drops(write.node):
        return False
    replays = rewind.replays(write.node, write.pass_)
    if replays is not None:
        return replays
    cycles = rewind.cycles(write.node)
    if cycles is not None:
        return not cycles
    return write.on_cycle is False


def _clear_bank(state: ScratchState, **changes: Any) -> ScratchState:
    cleared: dict[str, Any] = {"bank": None, "stale_writes": (), "unbanked": None, "replayed": None}
    return attrs.evolve(state, **{**cleared, **changes})


def _on_banked(state: ScratchState, ev: Evidence, rec: ScratchBanked) -> ScratchState:
    state = attrs.evolve(state, last_teardown=ev, banking_ended=ev)
    if rec.banked:
        bank = Bank(ev, rec, ev.position, rec.checkpoint)
        history = state.history
        if rec.checkpoint is not None:  # K8: this checkpoint's bank, kept while retention says
            history = remember(history, Kept(rec.checkpoint, rec, ev.position))
        return _clear_bank(state, bank=bank, forsaken=None, host_backed=None, history=history)
    if rec.finished:
        return _clear_bank(state, host_backed=None, history=())  # T5: a finished run keeps none
    if rec.empty:  # T4: the current bank goes; older checkpoints' banks stay (K8)
        return _clear_bank(state, host_backed=None, history=forget(state.history, rec.checkpoint))
    if rec.unknown:
        # T19 / R14: nobody knows; an earlier bank still decides. An earlier *unbanked*
        # record decides nothing more (A13): not refused, as after no record.
        return attrs.evolve(state, unbanked=None, unbanked_reason="")
    # R1 reads the last teardown: files it could not bank replace any older bank (A13).
    return _clear_bank(state, unbanked=ev, unbanked_reason=rec.reason, host_backed=None)


def _on_restored(state: ScratchState, ev: Evidence, rec: ScratchRestored) -> ScratchState:
    if rec.restored and rec.host_backed:
        return _clear_bank(state, host_backed=ev, banking_ended=ev, history=())  # X6, A14, K8
    own = _own_bank(state, rec)
    if rec.restored and own is not None:  # K6: a rewind restored its checkpoint's own bank
        bank = Bank(Evidence(own.position, ScratchBanked.WIRE), own.record, ev.position, own.checkpoint)
        return attrs.evolve(state, bank=bank, stale_writes=(), unbanked=None, replayed=None)
    if rec.restored:
        if state.bank is None:
            return state
        stamp = _restamp(state.bank.checkpoint, rec)
        bank = attrs.evolve(state.bank, current_since=ev.position, checkpoint=stamp)  # A2
        return attrs.evolve(state, bank=bank, stale_writes=(), unbanked=None, replayed=None)
    if rec.accepted:
        return _clear_bank(state, forsaken=ev, history=())  # R7, R13, A3 (K8: final for older banks too)
    return attrs.evolve(state, hold=ev)  # X3: a failed restore holds the bank


def _own_bank(state: ScratchState, rec: ScratchRestored) -> Kept | None:
    """The retained bank a restore names (K6): taken at its checkpoint, holding its object,
    and not the current bank already."""
    if rec.checkpoint is None or rec.bank is None:
        return None
    for kept in reversed(state.history):
        if kept.checkpoint == rec.checkpoint and kept.position == rec.bank:
            current = state.bank
            if current is not None and current.evidence.position == kept.position:
                return None
            return kept
    return None


def _restamp(stamp: Checkpoint | None, rec: ScratchRestored) -> Checkpoint | None:
    """ADR 0013: a restore that names its checkpoint makes the scratch that checkpoint's; one
    that names none keeps an exact bank's stamp and drops a stale one's (the events decide)."""
    if rec.checkpoint is not None:
        return rec.checkpoint
    return None if rec.stale else stamp


def _on_finished(state: ScratchState, ev: Evidence, rec: NodeFinished, wf: Workflow) -> ScratchState:
    if state.bank is None or not counts_as_write(rec, wf):
        return state
    write = StaleWrite(ev, rec.node, _on_cycle(rec, wf), rec.pass_)
    return attrs.evolve(state, stale_writes=(*state.stale_writes, write))


def _on_rewound(state: ScratchState, ev: Evidence, rec: RunRewound) -> ScratchState:
    """R6, and K9 when the rewind names its replayed passes: a write after the bank by a
    pass it replays is taken back; one by a pass it keeps still counts, and says so."""
    kept: list[StaleWrite] = []
    replayed = state.replayed
    for write in state.stale_writes:
        by_pass = rec.replays(write.node, write.pass_)
        if by_pass is True:
            replayed = ev
        elif by_pass is False:
            kept.append(attrs.evolve(write, kept_by=ev))
        elif not _taken_back(write, rec):
            kept.append(write)
    return attrs.evolve(state, stale_writes=tuple(kept), replayed=replayed)


def _naming(state: ScratchState, rec: ScratchBanked) -> ScratchState:
    """A banked record names its object for good (N3 reads the names from the fold)."""
    if not rec.banked or rec.object in state.named_objects:
        return state
    return attrs.evolve(state, named_objects=state.named_objects | {rec.object})


def step(state: ScratchState, record: Record, workflow: Workflow = NO_WORKFLOW) -> ScratchState:
    """Fold one more record into the state."""
    ev = _ev(state.records, record)
    state = attrs.evolve(state, records=state.records + 1)
    match record:
        case RunStarted() | RunResumed():
            return attrs.evolve(state, latest_execution=ev, latest_execution_id=record.execution, hold=None)
        case NodeFinished():
            return _on_finished(state, ev, record, workflow)
        case RunRewound():
            return _on_rewound(state, ev, record)
        case ScratchBanked():
            return _on_banked(_naming(state, record), ev, record)
        case ScratchRestored():
            return _on_restored(state, ev, record)
        case SandboxShared():
            local = bool(record.scratch_container_local)
            adoption = Adoption(ev, local, record.parent_copy_based)
            return attrs.evolve(state, adoption=adoption)
        case ScratchForsaken():
            return attrs.evolve(state, adoption=None)  # S4
        case AttemptQueued():
            return attrs.evolve(state, queued_attempt=record, claimed_attempt=None)
        case AttemptClaimed():
            return attrs.evolve(state, claimed_attempt=record.attempt)
        case RunStatusChanged():
            return attrs.evolve(state, status=record.status)
        case _:
            return attrs.evolve(state, unknown_records=state.unknown_records + 1)


def fold(
    records: Iterable[Record], workflow: Workflow = NO_WORKFLOW, start: ScratchState | None = None
) -> ScratchState:
    """The run's scratch state after every record, in order (from ``start``: a snapshot)."""
    state = start or ScratchState()
    for record in records:
        state = step(state, record, workflow)
    return state
