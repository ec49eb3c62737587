"""The service the CLI, the HTTP API and an embedding engine all call: one object, the use cases.

``ScratchService`` holds the ports (timeline, bank store, snapshots, clocks) and offers
``status``, ``resume``, ``bank_at_teardown`` and ``explain``. One function,
``assess``, decides for both ``status`` and ``resume``, so what ``status`` says a resume
would do is what ``resume`` does. A run the timeline has never seen is RUN_NOT_FOUND and
a restore with nowhere to go is NO_RESTORE_TARGET (A15), both before anything is written.

Without a queue the CLI and the HTTP API resume in this process (R11: the operator hears
the engine's verdict as the surface's own), so the service decides as the engine does
(``where`` ENGINE) for ``status`` and ``resume`` alike.

With a queue (``queue``: the runner's DeliveryQueue), ``queue_resume`` judges as a
surface (R9, R10: it refuses from a record the latest execution wrote, defers to the
engine while that execution may still be banking), and only past its own refusals
writes ``attempt_queued`` (at the position it judged) and publishes a delivery
carrying this call's consents (C2, C3, C5). With ``verdicts`` (a runner in this very
process) it then waits for the engine's verdict, so a refusal is heard as its own
(R11); without, the runner is detached and writes any refusal to the run's log (R12),
where ``status`` shows it with its hint (C10).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import attrs

from scratchbank.domain.checkpoints import Checkpoint
from scratchbank.domain.errors import AttemptReused, BankReadFailed, LockUnavailable, RunNotFound
from scratchbank.domain.fold import ScratchState, fold
from scratchbank.domain.objects import Reconciliation
from scratchbank.domain.records import AttemptQueued, Record, ResumeRefused
from scratchbank.domain.resume_gate import ResumeDecision, ResumeRequest, Verdict, Where, decide_resume
from scratchbank.domain.retention import RETAIN_CHECKPOINTS, check_retain
from scratchbank.domain.teardown import TeardownPlan, plan_teardown

from . import fencing
from . import resume as resume_use_case
from . import teardown as teardown_use_case
from .bank_objects import unreferenced_objects
from .ports import (
    BankStore,
    Clock,
    DeliveryQueue,
    LockGrant,
    LockHolder,
    Progress,
    ResumeDelivery,
    RunLock,
    Sandbox,
    SnapshotStore,
    StoredBank,
    SystemClock,
    Timeline,
)
from .resume import Target
from .run_lock import LOCAL, LOCK_TTL, HeldLock, new_execution, take
from .runner import Verdicts

log = logging.getLogger("scratchbank")


@attrs.frozen
class Assessment:
    """The run's state and the one decision both ``status`` and ``resume`` act on."""

    run_id: str
    state: ScratchState
    decision: ResumeDecision
    #: K8: the retention the decision read (status lists the checkpoints' banks it keeps)
    retain: int = RETAIN_CHECKPOINTS

    @property
    def needs_target(self) -> bool:
        return self.decision.verdict is Verdict.RESTORE


@attrs.frozen
class StoreCheck:
    """Is the bank the timeline names in the store, as recorded (size and SHA-256)?"""

    verdict: str  # "no bank" | "matches" | "missing" | "differs" | "unreadable"
    stored: StoredBank | None = None
    detail: str = ""


@attrs.frozen
class StatusReport:
    assessment: Assessment
    store: StoreCheck
    age_seconds: float | None
    refusal: ResumeRefused | None = None  # a runner's refusal of the latest queued attempt (R12)
    #: the run's objects no record names, sorted by N3 (None: the store could not list them)
    unreferenced: Reconciliation | None = None
    #: who holds the run's lock, since when, with which token (A16); None: nobody
    lock: LockHolder | None = None
    #: why the lock could not be read ("" when it could)
    lock_unreadable: str = ""


@attrs.frozen
class Queued:
    """What a queued resume came to: the surface's own refusal (nothing written, nothing
    published), or the attempt it queued and published; ``heard`` when ``decision`` is the
    engine's verdict, waited for from a runner in this process (R11)."""

    run_id: str
    decision: ResumeDecision
    attempt: str | None = None
    heard: bool = False

    @property
    def refused(self) -> bool:
        return self.decision.refused


def latest_refusal(records: Sequence[Record]) -> ResumeRefused | None:
    """The runner's refusal written after the run was last queued, if any (pure)."""
    for record in reversed(records):
        if isinstance(record, ResumeRefused):
            return record
        if isinstance(record, AttemptQueued):
            return None
    return None


def _check_fresh(records: Sequence[Record], run_id: str, attempt: str) -> None:
    """C5: a caller-supplied attempt id the run was already queued for is refused by name."""
    if any(isinstance(r, AttemptQueued) and r.attempt == attempt for r in records):
        raise AttemptReused(f"run {run_id} was already queued for attempt {attempt!r}; nothing was queued")


def new_attempt() -> str:
    """A fresh attempt id for a resume this surface queues (C5)."""
    return f"op-{uuid.uuid4().hex[:16]}"


@attrs.frozen
class Explanation:
    state: ScratchState
    plan: TeardownPlan
    decision: ResumeDecision


def check_stored(state: ScratchState, stored: StoredBank | None) -> StoreCheck:
    """Compare what the store holds with the bank record (pure)."""
    if state.bank is None:
        return StoreCheck("no bank", stored)
    record = state.bank.record
    if stored is None:
        return StoreCheck("missing", None, "the store holds no bank for this run")
    if stored.bytes != record.bytes or (record.sha256 and stored.sha256 != record.sha256):
        why = f"the store holds {stored.bytes} bytes, sha256 {stored.sha256[:12]}; recorded {record.bytes}"
        return StoreCheck("differs", stored, why)
    return StoreCheck("matches", stored)


def age_of(state: ScratchState, now: datetime) -> float | None:
    """Seconds since the bank was written, when its record says when (pure)."""
    at = state.bank.record.at if state.bank else None
    if at is None:
        return None
    return (now - (at if at.tzinfo else at.replace(tzinfo=UTC))).total_seconds()


def explain(
    records: Sequence[Record], request: ResumeRequest, *, host_backed: bool, isolated: bool, finished: bool
) -> Explanation:
    """Fold a timeline the caller holds and decide both questions (no ports, no writes)."""
    state = fold(records)
    plan = plan_teardown(
        state, scratch_host_backed=host_backed, process_isolated=isolated, run_finished=finished
    )
    return Explanation(state, plan, decide_resume(state, request))


def _check_setting(retain: object) -> None:
    """K8: a service's retention setting is None (each request's own) or 1..64."""
    if retain is not None:
        check_retain(retain)  # type: ignore[arg-type]  # check_retain names any other value


@attrs.frozen
class ScratchService:
    """The use cases over one timeline and one bank store."""

    timeline: Timeline
    store: BankStore
    snapshots: SnapshotStore | None = None
    clock: Clock = attrs.field(factory=SystemClock)
    where: Where = Where.ENGINE
    queue: DeliveryQueue | None = None
    verdicts: Verdicts | None = None  # set when a runner runs in this process (R11)
    verdict_wait: float = 300.0
    #: the run's lock (A16, ADR 0007); None: this process's threads only, for each call
    lock: RunLock | None = None
    lock_wait: float = 0.0
    lock_ttl: float = LOCK_TTL
    #: K8: the retention setting (SCRATCHBANK_RETAIN) every request of this service decides
    #: with and its teardowns prune by; None: each request's own (default 5)
    retain: int | None = attrs.field(default=None, validator=lambda _, __, v: _check_setting(v))
    #: the executions this service started and holds the lock for, by run (A16)
    _held: dict[str, tuple[str, HeldLock]] = attrs.field(factory=dict, init=False, eq=False, repr=False)

    def _request(self, request: ResumeRequest, where: Where) -> ResumeRequest:
        """The request as this service decides it: from ``where``, with its retention (K8)."""
        if self.retain is None:
            return attrs.evolve(request, where=where)
        return attrs.evolve(request, where=where, retain=self.retain)

    def assess(self, run_id: str, request: ResumeRequest = ResumeRequest()) -> Assessment:
        """The one decision (raises RunNotFound, TimelineUnreadable; writes nothing)."""
        state = resume_use_case.current_state(self.timeline, run_id, snapshots=self.snapshots)
        if state.records == 0:
            raise RunNotFound(f"the timeline has no run {run_id!r}")
        request = self._request(request, self.where)
        decision = decide_resume(state, request)
        log.info("run %s: %s (%s)", run_id, decision.verdict.value, decision.rule)
        return Assessment(run_id, state, decision, request.retain)

    def status(self, run_id: str, request: ResumeRequest = ResumeRequest()) -> StatusReport:
        """What a resume with ``request`` would do, and is the bank there as recorded."""
        assessment = self.assess(run_id, request)
        age = age_of(assessment.state, self.clock.now())
        records = self.timeline.read(run_id)
        refusal = latest_refusal(records) if self.queue is not None else None
        holder, unreadable = None, ""
        if self.lock is not None:
            try:
                holder = self.lock.holder(run_id)
            except LockUnavailable as error:
                unreadable = error.message
        loose = self._loose(run_id, records)
        return StatusReport(assessment, self._stored(assessment), age, refusal, loose, holder, unreadable)

    def _loose(self, run_id: str, records: Sequence[Record]) -> Reconciliation | None:
        """N3: the run's unreferenced objects, listed with their stamps."""
        try:
            return unreferenced_objects(self.store, run_id, records, fold(records))
        except BankReadFailed as error:
            log.info("run %s: the store could not list its bank objects: %s", run_id, error.message)
            return None

    def break_lock(self, run_id: str, *, by: str = "operator") -> LockHolder | None:
        """An operator's action (A16): end whoever holds the run's lock and fence it (its
        next refresh is LOCK_LOST); answers what was broken (None: nothing held it)."""
        if self.lock is None:
            raise TypeError("break_lock needs the run's lock (a lock store)")
        broken = self.lock.break_lock(run_id, by=by)
        log.warning("run %s: lock broken by %s: %s", run_id, by, broken)
        return broken

    def hold(self, run_id: str, request: ResumeRequest = ResumeRequest()) -> tuple[LockGrant, ResumeDecision]:
        """C8: an in-process resume takes the run's lock and checks under it BEFORE its
        pause-path writes (answers, a node's finish), then claims with ``resume(grant=)``.
        A refused check lets the lock go (the caller writes nothing); RunLocked while
        another holder is live."""
        lock = self.lock or LOCAL
        grant = take(lock, run_id, new_execution(), ttl=self.lock_ttl, wait=self.lock_wait, clock=self.clock)
        try:
            decision = self.assess(run_id, request).decision
        except BaseException:
            lock.release(grant)
            raise
        if decision.refused:
            lock.release(grant)
        return grant, decision

    def _stored(self, assessment: Assessment) -> StoreCheck:
        if assessment.state.bank is None:
            return StoreCheck("no bank")
        try:
            name = assessment.state.bank.record.object  # A17: the object the record names
            return check_stored(assessment.state, self.store.stat(assessment.run_id, name))
        except BankReadFailed as error:
            return StoreCheck("unreadable", None, error.message)

    def resume(
        self,
        run_id: str,
        request: ResumeRequest = ResumeRequest(),
        target: Target = Target(),
        *,
        progress: Progress | None = None,
        attempt: str | None = None,
        grant: LockGrant | None = None,
    ) -> resume_use_case.ResumeOutcome:
        """Resume as the engine does: under the run's lock (A16), the use case decides once,
        and refuses by name before any write (RUN_LOCKED, retryable; RUN_NOT_FOUND,
        NO_RESTORE_TARGET: ADR 0004) when it cannot go on. ``grant``: the lock ``hold``
        took (C8). The execution it starts keeps the lock until its teardown recorded."""
        lock = self.lock or (LOCAL if grant is not None else None)
        try:
            outcome = resume_use_case.resume(
                run_id,
                self._request(request, self.where),
                timeline=self.timeline,
                store=self.store,
                sandbox=target.sandbox,
                host_directory=target.host_directory,
                without_sandbox=target.without_sandbox,
                attempt=attempt,
                clock=self.clock,
                progress=progress,
                snapshots=self.snapshots,
                lock=lock,
                grant=grant,
                execution=grant.holder if grant is not None else None,
                lock_wait=self.lock_wait,
                lock_ttl=self.lock_ttl,
            )
        except BaseException:
            if grant is not None and lock is not None:
                lock.release(grant)
            raise
        kept = outcome.grant or (grant if outcome.proceeds and outcome.claim is not None else None)
        if grant is not None and kept is None and lock is not None:
            lock.release(grant)
        if kept is not None and lock is not None and outcome.execution is not None:
            if self.lock is None:  # LOCAL: this process only; nothing to refresh across processes
                lock.release(kept)
            else:
                self._held[run_id] = (outcome.execution, self._hold(lock, kept))
        verdict = f"{outcome.decision.verdict.value} ({outcome.decision.rule})"
        log.info("run %s: %s, %s", run_id, verdict, "goes on" if outcome.proceeds else "does not go on")
        return outcome

    def queue_resume(
        self, run_id: str, request: ResumeRequest = ResumeRequest(), *, attempt: str | None = None
    ) -> Queued:
        """Judge as a surface, then queue the run and publish its delivery (module docstring).

        Raises RunNotFound (nothing written), AttemptReused (a caller-supplied attempt id
        the run was already queued for: nothing written), TimelineConflict when the run
        moved between the judgement and the queueing (nothing queued), QueueUnavailable
        (queued, not published: the outbox sweeper publishes it past its cutoff).
        """
        if self.queue is None:
            raise TypeError("queue_resume needs a queue (SCRATCHBANK_QUEUE)")
        state = resume_use_case.current_state(self.timeline, run_id, snapshots=self.snapshots)
        if state.records == 0:
            raise RunNotFound(f"the timeline has no run {run_id!r}")
        decision = decide_resume(state, self._request(request, Where.SURFACE))
        log.info("run %s: the surface judges %s (%s)", run_id, decision.verdict.value, decision.rule)
        if decision.refused:
            return Queued(run_id, decision)
        if attempt is not None:
            _check_fresh(self.timeline.read(run_id), run_id, attempt)
        delivery = self._publish(run_id, request, attempt or new_attempt(), at=state.records)
        if self.verdicts is None:
            return Queued(run_id, decision, delivery.attempt)
        heard = self.verdicts.wait(delivery, self.verdict_wait)
        return Queued(run_id, heard or decision, delivery.attempt, heard is not None)

    def _publish(self, run_id: str, request: ResumeRequest, attempt: str, *, at: int) -> ResumeDelivery:
        """``attempt_queued`` at the position judged (C6: a publication queues), then the delivery."""
        assert self.queue is not None
        consents = request.consents
        queued = AttemptQueued(
            at=self.clock.now(),  # the orphan sweeper ages the queue from it (L4)
            attempt=attempt,
            force=consents.force,
            accept_scratch_loss=consents.accept_scratch_loss,
            checkpoint=request.checkpoint,
        )
        try:
            self.timeline.append(run_id, [queued], expected=at)
        except fencing.LOST_REPLY as lost:  # settled by reading: published only once known queued
            fencing.settle_append(self.timeline, run_id, [queued], at, lost)
        delivery = ResumeDelivery(run_id, attempt, consents, checkpoint=request.checkpoint)
        self.queue.publish(delivery)  # lost: the run stays queued; the outbox sweeper publishes it
        log.info("run %s: attempt %s queued and published", run_id, attempt)
        return delivery

    def delete_run(self, run_id: str) -> None:
        """T3: delete (sweep) the run's banks under the run's lock (A16): RunLocked, and
        nothing swept, while an execution holds it (its teardown may still put); else
        every object of the run is swept and the lock let go."""
        lock = self.lock or LOCAL
        grant = take(
            lock,
            run_id,
            f"delete-{new_execution()}",
            ttl=self.lock_ttl,
            wait=self.lock_wait,
            clock=self.clock,
        )
        try:
            self.store.sweep(run_id)
            log.info("run %s: deleted (its banks swept under the run's lock)", run_id)
        finally:
            lock.release(grant)

    def hand_over(self, grant: LockGrant) -> None:
        """Hold ``grant`` (an execution's: its holder is the execution id) as though this
        service had started that execution, as an engine hands its execution's grant to
        that execution's teardown: the teardown lets it go once recorded (A16)."""
        if self.lock is None:
            raise TypeError("hand_over needs the service's run lock (lock=...)")
        self._held[grant.run_id] = (grant.holder, self._hold(self.lock, grant))

    def _hold(self, lock: RunLock, grant: LockGrant) -> HeldLock:
        """How this service keeps an execution's grant alive until its teardown: refreshed
        in the background (the testing kit's explorer overrides it: its clocks stand still)."""
        return HeldLock(lock, grant, ttl=self.lock_ttl)

    def drop_holds(self) -> dict[str, LockGrant]:
        """Stop keeping this service's grants alive WITHOUT letting them go, as a process
        that dies: each lease lapses on its own. The grants, by run."""
        dropped: dict[str, LockGrant] = {}
        while self._held:
            run_id, (_execution, held) = self._held.popitem()
            held.stop()
            dropped[run_id] = held.grant
        return dropped

    def let_go(self) -> None:
        """Release the run locks this service holds for the executions it started (A16):
        a CLI's service closing ends its hold, so the next resume is not RUN_LOCKED until
        the lease lapses. The execution's teardown names it (A18) without the lock."""
        while self._held:
            run_id, (execution, held) = self._held.popitem()
            held.release()
            log.info("run %s: lock of execution %s let go as the service closed", run_id, execution)

    def bank_at_teardown(
        self,
        run_id: str,
        sandbox: Sandbox,
        *,
        run_finished: bool,
        budgets: teardown_use_case.Budgets = teardown_use_case.Budgets(),
        execution: str | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> teardown_use_case.TeardownReport:
        """Bank (or drop) the scratch of a sandbox being torn down (T1-T20), for the
        execution this service started on the run (or ``execution``: A18), and let that
        execution's lock go once it recorded (A16)."""
        held = self._held.get(run_id)
        if held is not None and execution not in (None, held[0]):
            held = None  # another execution's teardown: not this one's lock to let go
        try:
            report = teardown_use_case.bank_at_teardown(
                run_id,
                timeline=self.timeline,
                store=self.store,
                sandbox=sandbox,
                run_finished=run_finished,
                budgets=budgets,
                clock=self.clock,
                execution=held[0] if held is not None else execution,
                checkpoint=checkpoint,
                snapshots=self.snapshots,
                retain=RETAIN_CHECKPOINTS if self.retain is None else self.retain,
            )
        finally:
            if held is not None:
                self._held.pop(run_id, None)
                held[1].release()
        log.info("run %s: teardown %s", run_id, report.plan.action.value)
        return report

    explain = staticmethod(explain)
