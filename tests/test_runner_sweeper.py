"""The orphan sweeper (L4): a queued attempt no runner claimed within the cutoff.

Model (RULES.md L4, issue #13): the cutoff outwaits every delivery at its rank's
longest delay, so a run still queued and unclaimed past it will not be carried on by
its deliveries: the sweeper publishes the attempt again (the same resume), and when
that publication too goes unclaimed past the cutoff, parks the run; a delivery that
arrives after the park applies nothing. The sweeper never writes over a runner that
claimed the run in between (its record is appended at the version it read).

Real parts: the in-process queue, local sandboxes, the reference engine, banks on
disk; the clock is a manual one so the cutoff passes without waiting.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from runner_rigs import RecordingInbound, RunnerRig, checksum, make_rig, queue_resume, types

from scratchbank.adapters.inprocess import InProcessQueue
from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.orphans import sweep_orphans
from scratchbank.application.ports import ResumeDelivery
from scratchbank.application.runner import Handled
from scratchbank.domain.admission import Consents
from scratchbank.domain.lease import HoldBudgets, LeaseTiming, sweeper_cutoff
from scratchbank.domain.orphans import Sweep, judge_orphan
from scratchbank.domain.records import AttemptClaimed, AttemptQueued, OrphanSwept, Record, RunStarted
from scratchbank.testing.clocks import ManualClock

RUN = "run-1"
CUTOFF = 600.0


def _queued_and_lost(
    tmp_path: Path, consents: Consents = Consents()
) -> tuple[ManualClock, InMemoryTimeline, RunnerRig]:
    """A run queued for a1 whose delivery was given up (acked unclaimed, as GAVE_UP does)."""
    clock = ManualClock()
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl, queue=InProcessQueue(ack_wait=5.0))
    tl.append(RUN, [RunStarted()])
    queue_resume(tl, rig.queue, RUN, "a1", consents, clock=clock)
    lost = rig.queue.fetch(1)
    assert lost is not None
    lost.ack()
    return clock, tl, rig


def test_L4_the_sweeper_leaves_a_run_queued_for_less_than_the_cutoff(tmp_path: Path) -> None:
    clock, tl, rig = _queued_and_lost(tmp_path)
    clock.advance(CUTOFF - 1)
    before = checksum(tl, RUN)
    [swept] = sweep_orphans([RUN], timeline=tl, queue=rig.queue, cutoff=CUTOFF, clock=clock)
    assert swept.verdict is not None and swept.verdict.sweep is Sweep.LEAVE and not swept.acted
    assert checksum(tl, RUN) == before
    assert rig.queue.fetch(0.05) is None


def test_L4_the_sweeper_publishes_an_unclaimed_attempt_again_and_a_runner_carries_it_on(
    tmp_path: Path,
) -> None:
    """Past the cutoff: ``orphan_swept`` written, the same attempt published again with
    its consents, and the runner claims and runs it."""
    accept = Consents(accept_scratch_loss=True)
    clock, tl, rig = _queued_and_lost(tmp_path, accept)
    clock.advance(CUTOFF)
    [swept] = sweep_orphans([RUN], timeline=tl, queue=rig.queue, cutoff=CUTOFF, clock=clock)
    assert swept.acted and swept.verdict is not None and swept.verdict.sweep is Sweep.REPUBLISH
    assert types(tl.read(RUN))[-1] == "orphan_swept"
    handled = rig.runner().run_once(1)
    assert handled is not None and handled.handled is Handled.RAN, handled.detail
    assert handled.delivery == ResumeDelivery(RUN, "a1", accept, republished=1)
    claims = [r.attempt for r in tl.read(RUN) if isinstance(r, AttemptClaimed)]
    assert claims == ["a1"]
    later = sweep_orphans([RUN], timeline=tl, queue=rig.queue, cutoff=CUTOFF, clock=clock)
    assert later[0].verdict is not None and later[0].verdict.sweep is Sweep.LEAVE  # claimed: left


def test_L4_the_sweeper_parks_when_the_republished_attempt_goes_unclaimed_too(tmp_path: Path) -> None:
    """The republication is lost as well: a cutoff after it the run is parked; a late
    delivery of that attempt is acked with nothing written; the sweeper leaves it."""
    clock, tl, rig = _queued_and_lost(tmp_path)
    clock.advance(CUTOFF)
    sweep_orphans([RUN], timeline=tl, queue=rig.queue, cutoff=CUTOFF, clock=clock)
    again = rig.queue.fetch(1)
    assert again is not None
    again.ack()
    clock.advance(CUTOFF - 1)
    assert sweep_orphans([RUN], timeline=tl, queue=rig.queue, cutoff=CUTOFF, clock=clock)[0].acted is False
    clock.advance(1)
    [parked] = sweep_orphans([RUN], timeline=tl, queue=rig.queue, cutoff=CUTOFF, clock=clock)
    assert parked.acted and parked.verdict is not None and parked.verdict.sweep is Sweep.PARK
    swept = [r for r in tl.read(RUN) if isinstance(r, OrphanSwept)]
    assert [r.parked for r in swept] == [False, True] and "resume the run again" in swept[-1].reason
    assert rig.queue.fetch(0.05) is None  # a park publishes nothing
    before = checksum(tl, RUN)
    late = RecordingInbound(ResumeDelivery(RUN, "a1"))
    handled = rig.runner().handle(late)
    assert handled.handled is Handled.DONE and late.acked, handled.detail
    assert checksum(tl, RUN) == before
    clock.advance(10 * CUTOFF)
    assert sweep_orphans([RUN], timeline=tl, queue=rig.queue, cutoff=CUTOFF, clock=clock)[0].acted is False
    assert checksum(tl, RUN) == before


class _ClaimsFirst(InMemoryTimeline):
    """A timeline a runner claims the run on just as the sweeper writes."""

    def __init__(self, inner: InMemoryTimeline) -> None:
        self.inner, self.fired = inner, False

    def read(self, run_id: str) -> Sequence[Record]:
        return self.inner.read(run_id)

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        if not self.fired and any(isinstance(r, OrphanSwept) for r in records):
            self.fired = True
            self.inner.append(run_id, [AttemptClaimed(attempt="a1")])
        return self.inner.append(run_id, records, expected=expected)


def test_L4_the_sweeper_writes_and_publishes_nothing_over_a_runner_that_claimed_meanwhile(
    tmp_path: Path,
) -> None:
    clock, tl, rig = _queued_and_lost(tmp_path)
    clock.advance(CUTOFF)
    [swept] = sweep_orphans([RUN], timeline=_ClaimsFirst(tl), queue=rig.queue, cutoff=CUTOFF, clock=clock)
    assert not swept.acted and "moved" in swept.detail
    assert types(tl.read(RUN))[-1] == "attempt_claimed"
    assert not [r for r in tl.read(RUN) if isinstance(r, OrphanSwept)]
    assert rig.queue.fetch(0.05) is None


def test_L4_judge_orphan_leaves_a_queue_record_without_a_time_and_a_run_not_queued() -> None:
    """Model: the sweeper acts only on what it can age; a run not queued is not its."""
    now = ManualClock().now()
    assert judge_orphan([RunStarted()], now, CUTOFF).sweep is Sweep.LEAVE
    untimed = judge_orphan([RunStarted(), AttemptQueued(attempt="a1")], now, CUTOFF)
    assert untimed.sweep is Sweep.LEAVE and "no time" in untimed.reason


def test_L4_the_sweeper_default_cutoff_is_the_lease_arithmetics() -> None:
    assert sweeper_cutoff(HoldBudgets(), LeaseTiming()) == 150 * 60
