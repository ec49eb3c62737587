"""The orphan sweeper (L4): queued runs no runner claimed within the cutoff.

A delivery that met a held lease at every rank is acked and left to the sweeper
(``Handled.GAVE_UP``); one lost with a queue's outage is never delivered at all. The
sweeper reads each run it is given, asks the domain (``judge_orphan``) and either
publishes the queued attempt's delivery again (same attempt, same consents: the same
resume) or parks the run for the operator. Its record is appended at the version it
read, as every claim is: a runner that claimed the run in between wins, and the
sweeper writes and publishes nothing. The record lands before the publication (a lost
reply of it is settled by reading); the publication is tried again within its own
deadline (a queue restarting), and one lost past it is aged from the record and ends
in the park.

The outbox (issue #19): ``Sweeper`` is what a runner process runs on a schedule. It
sweeps only while it holds the sweeper's lease (one sweeper at a time across runners,
the lease refreshed before each run it sweeps: a sweeper that lost it stops), and it
asks the timeline which runs to look at (``OutboxListing.queued_unclaimed``: queued
and unclaimed since before the cutoff), so a run whose publication was lost, whose
deliveries all met a held lease, or that nobody ever delivered is found.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from datetime import timedelta

import attrs

from scratchbank.domain.admission import Consents
from scratchbank.domain.errors import (
    LeaseLost,
    QueueUnavailable,
    ScratchbankError,
    TimelineConflict,
    TimelineUnreadable,
    TimelineWriteFailed,
)
from scratchbank.domain.lease import HoldBudgets, LeaseTiming, sweeper_cutoff
from scratchbank.domain.orphans import OrphanVerdict, Sweep, judge_orphan
from scratchbank.domain.records import OrphanSwept

from .fencing import LOST_REPLY, settle_append
from .ports import (
    Clock,
    DeliveryQueue,
    Lease,
    LeaseGrant,
    OutboxListing,
    ResumeDelivery,
    SystemClock,
    Timeline,
)
from .retry import Budget, Pauses, retry_within

#: The sweeper's lease key (a name no run id can take: run ids start with a letter or digit
#: and the key lives in a bucket of its own).
SWEEPER_KEY = "sweeper"
#: How long the sweeper tries to hand one republication to the queue (a restarting server).
PUBLISH_SECONDS = 30.0


@attrs.frozen
class Swept:
    """What the sweeper did with one run: ``acted`` once its record landed (and, for a
    republication, the delivery was handed to the queue)."""

    run_id: str
    verdict: OrphanVerdict | None
    acted: bool = False
    detail: str = ""


def sweep_orphans(
    run_ids: Iterable[str],
    *,
    timeline: Timeline,
    queue: DeliveryQueue,
    cutoff: float | None = None,
    clock: Clock | None = None,
    republishes: int = 1,
) -> list[Swept]:
    """Sweep the given runs (``cutoff`` default: the lease arithmetic's, 2 h 30)."""
    wait = sweeper_cutoff(HoldBudgets(), LeaseTiming()) if cutoff is None else cutoff
    now_clock = clock or SystemClock()
    return [_sweep_one(run, timeline, queue, wait, now_clock, republishes) for run in run_ids]


def _sweep_one(
    run_id: str, timeline: Timeline, queue: DeliveryQueue, cutoff: float, clock: Clock, republishes: int
) -> Swept:
    try:
        records = timeline.read(run_id)
    except TimelineUnreadable as error:
        return Swept(run_id, None, detail=f"{error.code}: {error.message}")
    verdict = judge_orphan(records, clock.now(), cutoff, republishes)
    if verdict.sweep is Sweep.LEAVE or verdict.queued is None:
        return Swept(run_id, verdict, detail=verdict.reason)
    queued = verdict.queued
    record = OrphanSwept(
        at=clock.now(), attempt=queued.attempt, parked=verdict.sweep is Sweep.PARK, reason=verdict.reason
    )
    try:
        try:
            timeline.append(run_id, [record], expected=len(records))
        except LOST_REPLY as lost:  # settled by reading, never by guessing
            settle_append(timeline, run_id, [record], len(records), lost)
    except TimelineConflict:
        return Swept(run_id, verdict, detail="the run moved since it was read: left to that writer")
    except (TimelineWriteFailed, TimelineUnreadable) as error:
        return Swept(run_id, verdict, detail=f"{error.code}: {error.message}; swept again next time")
    if verdict.sweep is Sweep.REPUBLISH:
        consents = Consents(force=queued.force, accept_scratch_loss=queued.accept_scratch_loss)
        delivery = ResumeDelivery(run_id, queued.attempt, consents, verdict.republished, queued.checkpoint)
        unpublished = _publish(queue, delivery, clock)
        if unpublished is not None:
            return Swept(run_id, verdict, detail=f"{unpublished}; recorded, aged from its record to the park")
    return Swept(run_id, verdict, acted=True, detail=verdict.reason)


def _publish(queue: DeliveryQueue, delivery: ResumeDelivery, clock: Clock) -> str | None:
    """Hand the delivery to the queue within PUBLISH_SECONDS on the one retry helper (the
    same message id each try: a try that landed unseen is de-duplicated); None once it
    did, else why not."""
    try:
        retry_within(
            Budget.start(clock, PUBLISH_SECONDS),
            lambda _deadline: queue.publish(delivery),
            retry_on=(QueueUnavailable,),
            pauses=Pauses(first=0.2, cap=2.0),
        )
    except QueueUnavailable as error:
        return f"{error.code}: {error.message}"
    return None


@attrs.frozen
class SweepReport:
    """One sweep: ``held`` False when another sweeper held the lease (nothing was looked at)."""

    held: bool
    swept: tuple[Swept, ...] = ()
    detail: str = ""


@attrs.define
class Sweeper:
    """The orphan sweeper a runner process runs on a schedule, under the sweeper's lease."""

    lease: Lease
    listing: OutboxListing
    timeline: Timeline
    queue: DeliveryQueue
    holder: str
    cutoff: float = attrs.field(factory=lambda: sweeper_cutoff(HoldBudgets(), LeaseTiming()))
    clock: Clock = attrs.Factory(SystemClock)
    republishes: int = 1

    def sweep_once(self) -> SweepReport:
        """Take the sweeper's lease or leave it to its holder; list, sweep each run; let go."""
        grant = self.lease.acquire(SWEEPER_KEY, self.holder)
        if grant is None:
            return SweepReport(False, detail="another runner holds the sweeper's lease")
        out: list[Swept] = []
        try:
            before = self.clock.now() - timedelta(seconds=self.cutoff)
            for run_id in self.listing.queued_unclaimed(before):
                grant = self._still_held(grant)
                out.append(
                    _sweep_one(run_id, self.timeline, self.queue, self.cutoff, self.clock, self.republishes)
                )
            return SweepReport(True, tuple(out))
        except ScratchbankError as error:  # the lease lost, the listing unreadable: the next sweep
            return SweepReport(
                True, tuple(out), f"{error.code}: {error.message}; stopped, swept again next time"
            )
        finally:
            with contextlib.suppress(LeaseLost, ScratchbankError):
                self.lease.release(grant)

    def _still_held(self, grant: LeaseGrant) -> LeaseGrant:
        return self.lease.refresh(grant)  # LeaseLost: another sweeper took over; stop
