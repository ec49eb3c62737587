"""The orphan sweeper (L4): queued runs no runner claimed within the cutoff.

A delivery that met a held lease at every rank is acked and left to the sweeper
(``Handled.GAVE_UP``); one lost with a queue's outage is never delivered at all. The
sweeper reads each run it is given, asks the domain (``judge_orphan``) and either
publishes the queued attempt's delivery again (same attempt, same consents: the same
resume) or parks the run for the operator. Its record is appended at the version it
read, as every claim is: a runner that claimed the run in between wins, and the
sweeper writes and publishes nothing. The record lands before the publication; a
publication lost after it is aged from the record and ends in the park.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from scratchbank.domain.consent import Consents
from scratchbank.domain.errors import TimelineConflict, TimelineUnreadable, TimelineWriteFailed
from scratchbank.domain.lease import (
    HoldBudgets,
    LeaseTiming,
    OrphanVerdict,
    Sweep,
    judge_orphan,
    sweeper_cutoff,
)
from scratchbank.domain.records import OrphanSwept

from .clock import Clock, SystemClock
from .ports import Timeline
from .runner_ports import DeliveryQueue, ResumeDelivery


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
        timeline.append(run_id, [record], expected=len(records))
    except TimelineConflict:
        return Swept(run_id, verdict, detail="the run moved since it was read: left to that writer")
    except (TimelineWriteFailed, TimelineUnreadable) as error:
        return Swept(run_id, verdict, detail=f"{error.code}: {error.message}; swept again next time")
    if verdict.sweep is Sweep.REPUBLISH:
        consents = Consents(force=queued.force, accept_scratch_loss=queued.accept_scratch_loss)
        queue.publish(ResumeDelivery(run_id, queued.attempt, consents, verdict.republished))
    return Swept(run_id, verdict, acted=True, detail=verdict.reason)
