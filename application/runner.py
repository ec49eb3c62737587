"""The runner: a delivery in, a run carried on under its lease, the delivery acked.

Per delivery (C3-C8, R10-R12, L1-L5):
1. Admission: a delivery published before the run was last queued is superseded:
   acked, nothing written (C6).
2. The lease: held by another runner -> deliver again after the back-off of this
   delivery's rank (L4); none left -> acked, for the orphan sweeper.
3. Under the lease, read again: superseded -> acked, nothing written (C6 again).
   The engine's gate runs before the claim (R10): a refusal is written to the run's
   log with the hint of ``remedy()`` (R12, C10) and told to an in-process waiter (R11).
4. The claim, from the very status read (C7): ``lease_taken`` + ``attempt_claimed``
   appended at that position. Lost to a newer attempt -> acked, nothing more (C6). A
   claim whose reply was lost is settled by reading (the fenced timeline): found at its
   position, it carries on as this delivery's claim, with its consents (C4).
5. A new sandbox, the resume (restore), the engine, the teardown's bank, the sandbox
   torn down: every write through the fenced timeline (and every store write through
   the fenced store, ``FencedBankStore``), the lease refreshed all along
   on its interval and let go past a ceiling (L1, L2, L5). The resume claims the run
   again by position (``run_resumed`` at the version it read) through that same
   fenced timeline: a resume that loses its claim (ResumeSuperseded) is acked with
   nothing more written (C6); one fenced by a newer holder is left to that holder.
6. L5: past a ceiling, or with the lease lost, the keeper lets the lease go and cuts
   the run context the engine and the teardown's bank ride. A teardown cut before
   anything reached the store records nothing and its sandbox is left, not torn
   down: the next holder's takeover banks it (``_take_over``). The delivery is acked
   when the engine had returned (its verdict stands; the next resume takes over),
   left for redelivery when the engine itself was cut (``Handled.LET_GO``).
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Callable

import attrs

from scratchbank.domain.admission import Delivery, DeliveryVerdict, admit
from scratchbank.domain.errors import (
    Fenced,
    LeaseLost,
    ResumeSuperseded,
    ScratchbankError,
    TimelineConflict,
    TimelineUnreadable,
)
from scratchbank.domain.fold import ScratchState, fold
from scratchbank.domain.lease import HoldBudgets, LeaseTiming, delay_for
from scratchbank.domain.orphans import orphan_may_bank
from scratchbank.domain.records import (
    AttemptClaimed,
    ResumeRefused,
    RunStatus,
    RunStatusChanged,
)
from scratchbank.domain.remedy import remedy
from scratchbank.domain.resume_gate import ResumeDecision, ResumeRequest, Where, decide_resume
from scratchbank.domain.retention import RETAIN_CHECKPOINTS, check_retain

from .fencing import FencedBankStore, FencedTimeline, Token
from .lease_keeper import LeaseKeeper
from .ports import (
    BankStore,
    Clock,
    DeliveryQueue,
    Engine,
    EngineEnd,
    Inbound,
    Lease,
    LeaseGrant,
    ResumeDelivery,
    Sandbox,
    SandboxProvider,
    SystemClock,
    Timeline,
)
from .resume import ResumeOutcome, resume
from .run_lock import HandedLock
from .teardown import Budgets, TeardownReport, bank_at_teardown

#: A claim lost to another writer that is not a newer attempt: try again soon.
RETRY_SOON = 1.0


class Handled(enum.Enum):
    """What the runner did with one delivery."""

    SUPERSEDED = "superseded"  # C6: acked, nothing written
    DONE = "done"  # its attempt was already carried on: acked, nothing applied twice
    LEASE_HELD = "lease_held"  # L4: delivered again after its rank's delay
    GAVE_UP = "gave_up"  # L4: no retry left; acked, the orphan sweeper takes the run
    REFUSED = "refused"  # R12: the refusal written, acked
    RAN = "ran"  # claimed, resumed, the engine ran, the teardown banked; acked
    PARKED_ON_RESTORE = "parked_on_restore"  # X4: the restore parked the run; acked
    REDELIVER = "redeliver"  # X5, a lost claim race, an unreadable timeline: delivered again
    FENCED = "fenced"  # a newer holder owns the run: this runner's writes were refused
    LET_GO = "let_go"  # L5: past a ceiling or the lease lost: the bank cut, the sandbox left


@attrs.frozen
class Handling:
    """What happened to one delivery, and why."""

    handled: Handled
    delivery: ResumeDelivery
    detail: str = ""
    decision: ResumeDecision | None = None
    end: EngineEnd | None = None
    teardown: TeardownReport | None = None


Listener = Callable[[ResumeDelivery, ResumeDecision], None]


class Verdicts:
    """Where an in-process resume waits for the engine's verdict (R11).

    The runner tells the verdict once the engine is past its refusals, or refused;
    it does not wait for the claim.
    """

    def __init__(self) -> None:
        self._told: dict[str, ResumeDecision] = {}
        self._cond = threading.Condition()

    def tell(self, delivery: ResumeDelivery, decision: ResumeDecision) -> None:
        with self._cond:
            self._told[delivery.msg_id] = decision
            self._cond.notify_all()

    def wait(self, delivery: ResumeDelivery, timeout: float) -> ResumeDecision | None:
        with self._cond:
            self._cond.wait_for(lambda: delivery.msg_id in self._told, timeout)
            return self._told.pop(delivery.msg_id, None)


@attrs.frozen
class RunnerSettings:
    holder: str
    hold: HoldBudgets = HoldBudgets()
    timing: LeaseTiming = LeaseTiming()
    teardown: Budgets = Budgets()
    #: K8: how many recent checkpoints' banks the gate and the prune keep (SCRATCHBANK_RETAIN):
    #: the runner prunes, so it decides with its own setting, never a delivery's
    retain: int = attrs.field(default=RETAIN_CHECKPOINTS, validator=lambda _, __, v: check_retain(v))


@attrs.define
class Runner:
    """Takes deliveries from the queue and carries their runs on (module docstring)."""

    queue: DeliveryQueue
    lease: Lease
    timeline: Timeline
    store: BankStore
    sandboxes: SandboxProvider
    engine: Engine
    settings: RunnerSettings
    verdicts: Verdicts | None = None
    clock: Clock = attrs.Factory(SystemClock)

    def run_once(self, timeout: float) -> Handling | None:
        """Fetch one delivery and handle it; None when none came within ``timeout``."""
        inbound = self.queue.fetch(timeout)
        return None if inbound is None else self.handle(inbound)

    def serve(self, stop: threading.Event, poll: float = 0.5) -> None:
        while not stop.is_set():
            self.run_once(poll)

    def handle(self, inbound: Inbound) -> Handling:
        d = inbound.delivery
        try:
            records = self.timeline.read(d.run_id)
        except TimelineUnreadable as error:
            return _redeliver(inbound, RETRY_SOON, f"timeline unreadable: {error.message}")
        dropped = _dropped(inbound, admit(records, fold(records), d.attempt, d.consents), "on admission")
        if dropped is not None:
            return dropped
        grant = self.lease.acquire(d.run_id, self.settings.holder)
        if grant is None:
            return self._lease_held(inbound)
        keeper = LeaseKeeper(self.lease, grant, self.settings.hold, self.settings.timing, self.clock)
        keeper.start(on_refresh=inbound.in_progress)
        try:
            return self._under_lease(inbound, grant, keeper)
        except Fenced as error:
            # Not acked: the delivery is the new holder's now (an ack by stream sequence
            # would settle it under that holder's feet).
            return Handling(Handled.FENCED, d, error.message)
        except ScratchbankError as error:  # a sandbox that would not start, a store outage (X5)
            return _redeliver(inbound, RETRY_SOON, f"{error.code}: {error.message}")
        finally:
            keeper.stop()
            with contextlib.suppress(LeaseLost, ScratchbankError):
                self.lease.release(keeper.grant)

    def _lease_held(self, inbound: Inbound) -> Handling:
        delay = delay_for(inbound.deliveries, self.settings.hold, self.settings.timing)
        if delay is None:
            why = f"the lease was held at each of {inbound.deliveries} deliveries: left to the sweeper"
            return _acked(inbound, Handled.GAVE_UP, why)
        inbound.nak(delay)
        return Handling(Handled.LEASE_HELD, inbound.delivery, f"retry in {delay:.1f} s (L4)")

    def _under_lease(self, inbound: Inbound, grant: LeaseGrant, keeper: LeaseKeeper) -> Handling:
        d = inbound.delivery
        fenced = FencedTimeline(self.timeline, d.run_id, Token(grant.holder, grant.token, d.attempt))
        store = FencedBankStore(self.store, fenced)  # the token rides the store writes too
        records = fenced.read(d.run_id)
        verdict = admit(records, fold(records), d.attempt, d.consents)
        dropped = _dropped(inbound, verdict, "under the lease")
        if dropped is not None:
            return dropped
        if self._take_over(d.run_id, fenced, store, keeper):
            if keeper.cancel.is_set():  # L5: cut while taking over: the next holder's again
                return Handling(Handled.LET_GO, d, f"{keeper.note}; cut while taking over (L5)")
            records = fenced.read(d.run_id)
        retain = self.settings.retain  # K8: the retention this runner prunes by
        request = ResumeRequest(
            consents=verdict.consents, where=Where.ENGINE, checkpoint=d.checkpoint, retain=retain
        )
        decision = decide_resume(fold(records), request)
        if decision.refused:
            return self._refuse(inbound, fenced, decision, len(records))
        if self.verdicts is not None:
            self.verdicts.tell(d, decision)  # R11: past its refusals; the claim is not waited for
        claimed = self._claim(inbound, fenced, len(records))
        if claimed is not None:
            return claimed
        return self._carry_on(inbound, fenced, store, request, keeper)

    def _take_over(
        self, run_id: str, fenced: FencedTimeline, store: FencedBankStore, keeper: LeaseKeeper
    ) -> int:
        """Bank (when safe) and stop the sandboxes a lapsed holder left, before the claim.

        A bank cut by this holder's own run context (L5) leaves its sandbox, again.
        """
        orphans = self.sandboxes.orphans(run_id)
        for orphan in orphans:
            report: TeardownReport | None = None
            try:
                if orphan_may_bank(fenced.read(run_id)):
                    fenced.announce()  # the token first: the teardown counts its own positions
                    report = bank_at_teardown(
                        run_id,
                        timeline=fenced,
                        store=store,
                        sandbox=orphan,
                        run_finished=False,
                        budgets=self.settings.teardown,
                        clock=self.clock,
                        cancel=keeper.cancel,
                        retain=self.settings.retain,
                    )
            finally:
                if report is None or not report.sandbox_left:
                    self.sandboxes.stop(orphan)
        return len(orphans)

    def _refuse(
        self, inbound: Inbound, fenced: FencedTimeline, decision: ResumeDecision, at: int
    ) -> Handling:
        """R12, C10: the refusal in the run's log, its hint from remedy(); R11: told."""
        d = inbound.delivery
        record = ResumeRefused(
            code=decision.code or "", rule=decision.rule, hint=remedy(decision), attempt=d.attempt
        )
        with contextlib.suppress(TimelineConflict):
            fenced.append(d.run_id, [record], expected=at)
        if self.verdicts is not None:
            self.verdicts.tell(d, decision)
        return _acked(inbound, Handled.REFUSED, decision.explanation, decision=decision)

    def _claim(self, inbound: Inbound, fenced: FencedTimeline, at: int) -> Handling | None:
        """C7: claim from the very status read; a newer attempt that won supersedes (C6)."""
        d = inbound.delivery
        try:
            running = RunStatusChanged(status=RunStatus.RUNNING)  # C7: never reads paused from here
            fenced.append(d.run_id, [AttemptClaimed(attempt=d.attempt), running], expected=at)
            return None
        except TimelineConflict:
            state = fold(fenced.read(d.run_id))
        if _newer_attempt(state, d.attempt):
            return _acked(inbound, Handled.SUPERSEDED, "lost its claim to a newer attempt (C6)")
        return _redeliver(inbound, RETRY_SOON, "lost the claim race; read again on redelivery")

    def _carry_on(
        self,
        inbound: Inbound,
        fenced: FencedTimeline,
        store: FencedBankStore,
        request: ResumeRequest,
        keeper: LeaseKeeper,
    ) -> Handling:
        """A new sandbox; the resume (restore); the engine; the teardown's bank; torn down."""
        d = inbound.delivery
        sandbox = self.sandboxes.start(d.run_id, attempt=d.attempt)  # the pod is labelled with both
        report: TeardownReport | None = None
        try:
            resumed = self._resume(inbound, fenced, store, request, sandbox, keeper)
            if isinstance(resumed, Handling):
                return resumed
            end, report = self._engine_then_bank(d, fenced, store, sandbox, keeper, resumed.execution)
        finally:
            if report is None or not report.sandbox_left:
                self.sandboxes.stop(sandbox)
        if report.sandbox_left:
            return _let_go(inbound, keeper, end, report)
        fenced.read(d.run_id)  # a holder fenced while banking learns it here
        return _acked(inbound, Handled.RAN, keeper.note, end=end, teardown=report)

    def _resume(
        self,
        inbound: Inbound,
        fenced: FencedTimeline,
        store: FencedBankStore,
        request: ResumeRequest,
        sandbox: Sandbox,
        keeper: LeaseKeeper,
    ) -> Handling | ResumeOutcome:
        """The resume use case; a Handling when the run does not go on past it, else its
        outcome (the execution it started: its teardown names it, A18).

        L5: the lease's cancel rides the restore; a holder cut off during it stops at
        once (the staged tree discarded, its X5 record written through the fence unless
        a newer holder wrote) and leaves the delivery to the next holder, unacked.
        """
        d = inbound.delivery
        lock = HandedLock(self.lease, keeper.grant)  # A16: the run's lock is this lease (ADR 0007)
        try:
            outcome = resume(
                d.run_id,
                request,
                timeline=fenced,
                store=store,
                sandbox=sandbox,
                attempt=d.attempt,
                cancel=keeper.cancel,
                lock=lock,
                grant=lock.acquire(d.run_id, keeper.grant.holder, ttl=0),
            )
        except ResumeSuperseded as error:  # C6: the resume lost its claim; it wrote nothing more
            return _acked(inbound, Handled.SUPERSEDED, f"{error.code}: {error.message}")
        if keeper.cancel.is_set():
            keeper.engine_cut = True  # the attempt is not over: the next holder carries it on
            recorded = "recorded" if outcome.recorded else "not recorded"
            return Handling(Handled.LET_GO, d, f"{keeper.note}; cut during the resume ({recorded}, L5)")
        return outcome if outcome.proceeds else _restore_parked(inbound, outcome)

    def _engine_then_bank(
        self,
        d: ResumeDelivery,
        fenced: FencedTimeline,
        store: FencedBankStore,
        sandbox: Sandbox,
        keeper: LeaseKeeper,
        execution: str | None = None,
    ) -> tuple[EngineEnd, TeardownReport]:
        """The engine, then the teardown's bank under the same lease (L1, L2)."""
        end = self.engine.continue_run(d.run_id, sandbox=sandbox, timeline=fenced, cancel=keeper.cancel)
        keeper.engine_returned(resume_can_wait=end.resume_can_wait)
        report = bank_at_teardown(
            d.run_id,
            timeline=fenced,
            store=store,
            sandbox=sandbox,
            run_finished=end is EngineEnd.FINISHED,
            budgets=self.settings.teardown,
            clock=self.clock,
            retain=self.settings.retain,
            cancel=keeper.cancel,  # L5: past a ceiling or the lease lost, the bank stops
            execution=execution,  # A18: the execution this resume started, and no other's
        )
        return end, report


def _dropped(inbound: Inbound, verdict: DeliveryVerdict, where: str) -> Handling | None:
    """C6: a superseded delivery, and one whose attempt already ended, are acked unapplied."""
    if verdict.delivery is Delivery.SUPERSEDED:
        return _acked(inbound, Handled.SUPERSEDED, f"superseded {where} ({verdict.rule}): {verdict.reason}")
    if verdict.delivery is Delivery.DONE:
        return _acked(inbound, Handled.DONE, f"{where}: {verdict.reason}")
    return None


def _newer_attempt(state: ScratchState, attempt: str) -> bool:
    queued = state.queued_attempt
    return queued is not None and queued.attempt != attempt


def _acked(inbound: Inbound, handled: Handled, detail: str, **more: object) -> Handling:
    inbound.ack()
    return Handling(handled, inbound.delivery, detail, **more)  # type: ignore[arg-type]


def _let_go(inbound: Inbound, keeper: LeaseKeeper, end: EngineEnd, report: TeardownReport) -> Handling:
    """L5: the bank was cut and the sandbox left to the next holder's takeover.

    The engine had returned before the cut: its verdict stands and the attempt is over
    (acked; the next resume's runner takes the sandbox over before its claim). The
    engine itself was cut: the attempt is not over, so the delivery is left unacked
    and comes back after its ack wait to a runner that takes over and carries it on.
    """
    detail = f"{report.cut}; the sandbox is left to the next holder's takeover (L5)"
    if keeper.engine_cut:
        return Handling(Handled.LET_GO, inbound.delivery, detail, end=end, teardown=report)
    return _acked(inbound, Handled.LET_GO, detail, end=end, teardown=report)


def _redeliver(inbound: Inbound, delay: float, detail: str) -> Handling:
    inbound.nak(delay)
    return Handling(Handled.REDELIVER, inbound.delivery, detail)


def _restore_parked(inbound: Inbound, outcome: ResumeOutcome) -> Handling:
    """X4 parks the run with a code (acked); X5 without one: the runner redelivers."""
    restore = outcome.restore
    detail = restore.record.reason if restore is not None else outcome.decision.explanation
    if restore is not None and restore.park is not None and restore.park.code is None:
        return _redeliver(inbound, RETRY_SOON, f"the restore failed on the way (X5): {detail}")
    return _acked(inbound, Handled.PARKED_ON_RESTORE, detail, decision=outcome.decision)
