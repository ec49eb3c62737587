"""The resume use case (R1-R15, X1-X7, C7): the gate, the claim, the restore, its record,
and ``Target``, where a resume restores (a sandbox, a host directory's RestoreTarget, or
nowhere on purpose: A15).

The gate reads the timeline with its version, folds it and asks the domain. A resume
that goes on claims the run: it appends its ``run_resumed`` and the decision's
records at the version it read (C7: from the very state it read). A conflict is read,
not retried: if another execution started since, this resume lost the run and raises
ResumeSuperseded having written nothing; otherwise it decides again on what the
timeline now holds. Once claimed, every later write appends at the position the
resume last wrote (fencing by position), and any failure of the restore becomes a
named restore outcome with its record, hold and park (X4 or X5): no path ends
without its record.
"""

from __future__ import annotations

import os

import attrs

from scratchbank.domain.errors import (
    BankUnrecorded,
    NoRestoreTarget,
    ResumeSuperseded,
    RunNotFound,
    TimelineConflict,
    TimelineUnreadable,
)
from scratchbank.domain.executions import label_of
from scratchbank.domain.kinds import NO_WORKFLOW, Workflow
from scratchbank.domain.records import Record, RunResumed
from scratchbank.domain.restore import RestoreAttempt, RestoreOutcome, after_restore
from scratchbank.domain.resume_gate import (
    ResumeDecision,
    ResumeRequest,
    Verdict,
    Where,
    decide_resume,
    refuse_unreadable,
)

from . import cancellation
from .bank_objects import reconcile_before_resume
from .folded import SNAPSHOT_EVERY as SNAPSHOT_EVERY  # where the tests have long found it
from .folded import current_state as current_state  # the service reads it here
from .ports import (
    BankStore,
    Clock,
    LockGrant,
    Progress,
    RestoreTarget,
    RunLock,
    Sandbox,
    SnapshotStore,
    SystemClock,
    Timeline,
)
from .recording import RETRYABLE, Claim, append_at, landed
from .restore import SandboxTarget, attempt_of, restore_bank
from .retry import Budget
from .run_lock import LOCAL, LOCK_TTL, LOCK_WAIT, new_execution, take

RECORD_BUDGET = 30.0
#: How many times a resume decides again after a conflict that did not take its run.
DECIDE_AGAIN = 5


def check_resume(
    timeline: Timeline,
    run_id: str,
    request: ResumeRequest,
    workflow: Workflow = NO_WORKFLOW,
    snapshots: SnapshotStore | None = None,
) -> ResumeDecision:
    """May this resume go on, and how? A timeline that cannot be read refuses it (R15)."""
    return _gate(timeline, run_id, request, workflow, snapshots).decision


@attrs.frozen
class Gate:
    """A decision, the version of the timeline it was made on (-1: unreadable), and the
    position of the latest execution's start it saw (None: none)."""

    decision: ResumeDecision
    version: int
    latest_execution: int | None = None
    #: the latest execution when it wrote no teardown record yet (A16: ``without_teardown``)
    unended: str | None = None

    def started_since(self, version: int) -> bool:
        """Did another execution start at or after ``version`` (a claim by someone else)?"""
        return self.latest_execution is not None and self.latest_execution >= version


def _gate(
    timeline: Timeline,
    run_id: str,
    request: ResumeRequest,
    workflow: Workflow,
    snapshots: SnapshotStore | None,
) -> Gate:
    try:
        state = current_state(timeline, run_id, workflow, snapshots)
    except TimelineUnreadable as error:
        return Gate(refuse_unreadable(error.message), -1)
    latest = state.latest_execution.position if state.latest_execution is not None else None
    unended = label_of(latest, state.latest_execution_id) if state.may_still_be_banking else None
    return Gate(decide_resume(state, request), state.records, latest, unended)


@attrs.frozen
class ResumeOutcome:
    """What a resume did. ``claim`` is where its next write must land (None: it wrote nothing).

    ``recorded``: the restore's record is known to have landed (re-read when its append
    failed); False when it did not or nobody can tell, whatever X7 lets the run do.
    """

    decision: ResumeDecision
    restore: RestoreOutcome | None = None
    recorded: bool = True
    claim: Claim | None = None
    #: the execution this resume started (its id is on its ``run_resumed``), None when none
    execution: str | None = None
    #: the run's lock, handed to that execution (A16): kept until its teardown recorded;
    #: None when the resume started nothing (it let the lock go) or the grant was the caller's
    grant: LockGrant | None = None

    @property
    def proceeds(self) -> bool:
        """X7: a record that must land and did not stops the run; a best-effort one does not."""
        if self.decision.verdict in (Verdict.REFUSE, Verdict.DEFER_TO_ENGINE):
            return False
        r = self.restore
        return r is None or (r.proceed and (self.recorded or not r.must_record))


@attrs.frozen
class Target:
    """Where a resume restores: a sandbox, a host directory, or (an engine's explicit
    choice only, A15) nowhere on purpose. ``host_directory`` is a RestoreTarget, the
    port object and never a Path: ``HostDirectory(path)`` (adapters/host_directory.py)."""

    sandbox: Sandbox | None = None
    host_directory: RestoreTarget | None = None
    without_sandbox: bool = False

    def __attrs_post_init__(self) -> None:
        """A Path where the port belongs: refused at once, naming the adapter."""
        if isinstance(self.host_directory, str | os.PathLike):
            raise TypeError(
                f"host_directory={self.host_directory!r} is a path: pass the restore target, "
                "HostDirectory(path) from scratchbank.adapters.host_directory (or scratchbank.HostDirectory)"
            )

    @property
    def exists(self) -> bool:
        return self.sandbox is not None or self.host_directory is not None or self.without_sandbox

    @property
    def restore_target(self) -> RestoreTarget | None:
        """The port the restore goes through: the host directory first (X6), else the sandbox's."""
        if self.host_directory is not None:
            return self.host_directory
        return SandboxTarget(self.sandbox) if self.sandbox is not None else None

    def check(self, decision: ResumeDecision) -> None:
        """A15: a restore with no target at all is refused before anything is written."""
        named = self.sandbox is not None or self.host_directory is not None
        if decision.verdict is Verdict.RESTORE and not named and not self.without_sandbox:
            raise NoRestoreTarget("the resume would restore the bank but names no sandbox or host directory")


def resume(
    run_id: str,
    request: ResumeRequest,
    *,
    timeline: Timeline,
    store: BankStore,
    sandbox: Sandbox | None = None,
    host_directory: RestoreTarget | None = None,
    workflow: Workflow = NO_WORKFLOW,
    attempt: str | None = None,
    clock: Clock | None = None,
    progress: Progress | None = None,
    cancel: cancellation.Cancel | None = None,  # L5: a lease's run context; once cut, the restore stops
    snapshots: SnapshotStore | None = None,
    without_sandbox: bool = False,
    record_budget: float = RECORD_BUDGET,
    lock: RunLock | None = None,
    grant: LockGrant | None = None,
    execution: str | None = None,
    lock_wait: float = LOCK_WAIT,
    lock_ttl: float = LOCK_TTL,
) -> ResumeOutcome:
    """The whole resume as an engine runs it: lock, gate, claim, then (if it restores)
    restore, record (A16: it decides only as the run's sole live holder).

    ``grant``: the run's lock the caller already holds (the runner's lease, handed in:
    used as is, never released here). Else the resume takes ``lock`` for ``execution`` (a
    fresh id when None) and hands it to the execution it starts (``ResumeOutcome.grant``),
    or lets it go when it starts none. A lock-less caller gets this process's ``LOCAL``
    lock for the call alone (its threads are excluded; nothing is handed on).

    Raises RunLocked (retryable) while another holder is live, RunNotFound (an empty
    timeline) and NoRestoreTarget (A15) before writing anything; ResumeSuperseded when
    another execution took the run before this resume's claim or after it (nothing more
    is written).
    """
    clock = clock or SystemClock()
    execution = execution or new_execution()
    target = Target(sandbox, host_directory, without_sandbox)
    first = _refuse_early(run_id, request, timeline, workflow, snapshots, target)
    own = grant is None
    hand_on = own and lock is not None  # a lock-less caller's lock lasts the call only
    lock = lock or LOCAL
    held = grant or take(lock, run_id, execution, ttl=lock_ttl, wait=lock_wait, clock=clock)
    outcome: ResumeOutcome | None = None
    try:
        outcome = _resume_held(
            run_id,
            request,
            timeline,
            store,
            target,
            workflow,
            attempt,
            clock,
            progress,
            snapshots,
            record_budget,
            execution,
            cancel,
            first,
        )
    finally:
        started = outcome is not None and outcome.claim is not None and outcome.proceeds
        if own and not (started and hand_on):
            lock.release(held)
    assert outcome is not None
    kept = held if hand_on and started else None
    return attrs.evolve(outcome, execution=execution if outcome.claim else None, grant=kept)


def _refuse_early(
    run_id: str,
    request: ResumeRequest,
    timeline: Timeline,
    workflow: Workflow,
    snapshots: SnapshotStore | None,
    target: Target,
) -> int:
    """RUN_NOT_FOUND and A15's NO_RESTORE_TARGET before the lock is even taken: a refusal
    that names the caller's mistake changes nothing, not even the lock's row. (Under the
    lock the resume decides again; these two cannot turn into a go.) Answers the version
    read: an execution that starts after it took the run from this resume (C7)."""
    gate = _gate(timeline, run_id, request, workflow, snapshots)
    if gate.version == 0:
        raise RunNotFound(f"the timeline holds no record of run {run_id}; nothing was written")
    target.check(gate.decision)
    return gate.version


def _resume_held(
    run_id: str,
    request: ResumeRequest,
    timeline: Timeline,
    store: BankStore,
    target: Target,
    workflow: Workflow,
    attempt: str | None,
    clock: Clock,
    progress: Progress | None,
    snapshots: SnapshotStore | None,
    record_budget: float,
    execution: str,
    cancel: cancellation.Cancel | None,
    first: int,
) -> ResumeOutcome:
    unrecorded, reconciled = _reconcile(run_id, request, timeline, store, clock, record_budget, snapshots)
    if unrecorded is not None:
        return unrecorded
    origin = first if reconciled is None else min(first, reconciled)
    claimed = _claim(
        run_id,
        request,
        timeline,
        workflow,
        snapshots,
        target,
        attempt,
        clock,
        record_budget,
        origin=origin,
        execution=execution,
    )
    if isinstance(claimed, ResumeOutcome):
        return claimed
    decision, claim = claimed
    if decision.verdict is not Verdict.RESTORE:
        return ResumeOutcome(decision, claim=claim)
    tried = _restore_guarded(run_id, decision, store, target, progress, cancel)
    outcome = after_restore(decision, tried)
    if request.checkpoint is not None:  # ADR 0013: the restored scratch is now this checkpoint's
        named = decision.bank.evidence.position if decision.bank is not None else None  # K6: which bank
        record = attrs.evolve(outcome.record, checkpoint=request.checkpoint, bank=named)
        outcome = attrs.evolve(outcome, record=record)
    return _record_restore(timeline, claim, decision, outcome, clock, record_budget)


def _reconcile(
    run_id: str,
    request: ResumeRequest,
    timeline: Timeline,
    store: BankStore,
    clock: Clock,
    budget: float,
    snapshots: SnapshotStore | None = None,
) -> tuple[ResumeOutcome | None, int | None]:
    """N3 (ADR 0006), engine-side only: record the unrecorded bank provably the latest
    execution's own teardown; refuse by name (BANK_UNRECORDED) on one that may be but
    cannot be proved, unless this call accepts the scratch's loss. A conflict on the
    record means the run moved: the gate reads it again. Also returns the version this
    first read saw: an execution that starts after it took the run from this resume (C7)."""
    if request.where is not Where.ENGINE:
        return None, None
    try:
        done = reconcile_before_resume(store, timeline, run_id, clock, budget, snapshots)
    except (TimelineConflict, *RETRYABLE):  # a busy store too (issue 26): the gate reads again
        return None, None
    if done is None:
        return None, None
    if not done.found.unproven or request.consents.accept_scratch_loss:
        return None, done.version
    named = ", ".join(o.name or "(the legacy key)" for o in done.found.unproven)
    why = (
        f"bank object(s) {named} are stored but no record names them, and they cannot be proved to be "
        f"the latest execution's ({done.found.latest_execution}) own teardown; resuming would ignore them"
    )
    refused = ResumeDecision(Verdict.REFUSE, "N3", why, code=BankUnrecorded.code)
    return ResumeOutcome(refused, recorded=False), done.version


def _claim(
    run_id: str,
    request: ResumeRequest,
    timeline: Timeline,
    workflow: Workflow,
    snapshots: SnapshotStore | None,
    target: Target,
    attempt: str | None,
    clock: Clock,
    budget: float,
    *,
    origin: int | None = None,
    execution: str | None = None,
) -> ResumeOutcome | tuple[ResumeDecision, Claim]:
    """Read, decide, claim at the version read; after a conflict read and decide again.

    Deciding again is never a blind retry: an execution that started since the first
    read (another resume's claim) means this resume lost the run (ResumeSuperseded);
    anything else (a teardown's record, an unrelated record) is decided on afresh.
    """
    for _ in range(DECIDE_AGAIN):
        gate = _gate(timeline, run_id, request, workflow, snapshots)
        if gate.version == 0:
            raise RunNotFound(f"the timeline holds no record of run {run_id}; nothing was written")
        if origin is not None and gate.started_since(origin):
            raise ResumeSuperseded(
                f"run {run_id}: another execution claimed it after this resume read it (record "
                f"{(gate.latest_execution or 0) + 1}); nothing was written"
            )
        if gate.decision.verdict in (Verdict.REFUSE, Verdict.DEFER_TO_ENGINE):
            return ResumeOutcome(gate.decision)
        target.check(gate.decision)
        origin = gate.version if origin is None else origin
        claim = Claim(run_id, gate.version)
        records = _claim_records(gate, request, attempt, clock, execution)
        try:
            return gate.decision, append_at(timeline, claim, records, budget=Budget.start(clock, budget))
        except TimelineConflict:
            continue  # read what was appended, and decide again
    raise ResumeSuperseded(f"run {run_id}: the timeline kept moving under {DECIDE_AGAIN} claims")


def _claim_records(
    gate: Gate, request: ResumeRequest, attempt: str | None, clock: Clock, execution: str | None
) -> list[Record]:
    now = clock.now()
    consents = request.consents
    started = RunResumed(
        at=now,
        attempt=attempt,
        force=consents.force,
        accept_scratch_loss=consents.accept_scratch_loss,
        execution=execution,
        without_teardown=gate.unended,
    )
    return [started, *(attrs.evolve(r, at=r.at or now) for r in gate.decision.records)]


def _restore_guarded(
    run_id: str,
    decision: ResumeDecision,
    store: BankStore,
    target: Target,
    progress: Progress | None,
    cancel: cancellation.Cancel | None = None,
) -> RestoreAttempt:
    """The restore, with every failure it can meet turned into a named attempt (X4, X5)."""
    try:
        return restore_bank(
            run_id,
            decision,
            store=store,
            into=target.restore_target,
            progress=progress,
            cancel=cancel,  # L5: a holder that lost its lease stops its restore at once
        )
    except Exception as error:  # once claimed, no path ends without its record
        return attempt_of(error)


def _record_restore(
    timeline: Timeline,
    claim: Claim,
    decision: ResumeDecision,
    outcome: RestoreOutcome,
    clock: Clock,
    budget: float,
) -> ResumeOutcome:
    """X7: the host_backed and stale records within their budget; any other once. Fenced."""
    record = attrs.evolve(outcome.record, at=clock.now())
    tries = None if outcome.must_record else 1  # once: one try, its line bounded by the budget
    try:
        after = append_at(timeline, claim, [record], budget=Budget.start(clock, budget), tries=tries)
    except TimelineConflict:
        raise ResumeSuperseded(
            f"run {claim.run_id}: another writer appended after this resume's claim "
            f"(record {claim.position + 1}); its restore record was not written"
        ) from None
    except RETRYABLE:
        # Recorded only when it is known to have landed: re-read (issue 26).
        if not landed(timeline, claim, [record]):
            return ResumeOutcome(decision, attrs.evolve(outcome, record=record), False, claim)
        after = claim.after([record])
    return ResumeOutcome(decision, attrs.evolve(outcome, record=record), True, after)
