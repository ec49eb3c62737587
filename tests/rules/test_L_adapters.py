"""Rules L: the runner's lease while it banks. The adapters tier's tests of L4 (tests/tiers.py: a file
of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

from pathlib import Path

from rigs.sweeper import CUTOFF, RUN, _ClaimsFirst, _queued_and_lost
from runner_rigs import RecordingInbound, checksum, make_rig, types

from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.orphans import sweep_orphans
from scratchbank.application.ports import ResumeDelivery
from scratchbank.application.runner import Handled
from scratchbank.domain.admission import Consents
from scratchbank.domain.lease import HoldBudgets, LeaseTiming, sweeper_cutoff
from scratchbank.domain.orphans import Sweep, judge_orphan
from scratchbank.domain.records import AttemptClaimed, AttemptQueued, OrphanSwept, RunStarted
from scratchbank.testing.clocks import ManualClock

# ---- from tests/test_runner_deliveries.py: The runner on the embedded default: deliveries, consents, refusals (C3-C8, R10-R12, L4).


def test_L4_a_delivery_meeting_a_held_lease_backs_off_by_its_rank(tmp_path: Path) -> None:
    """Held by another runner: nak'd with its rank's delay; past the last, acked for the sweeper.
    Proves ``scratchbank.domain.lease.backoff_delays``."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    tl.append("run-1", [RunStarted(), AttemptQueued(attempt="a1")])
    assert rig.lease.acquire("run-1", "runner-b") is not None
    runner = rig.runner()
    before = checksum(tl, "run-1")
    delays = []
    for rank in range(1, 20):
        inbound = RecordingInbound(ResumeDelivery("run-1", "a1"), deliveries=rank)
        handled = runner.handle(inbound)
        if handled.handled is Handled.GAVE_UP:
            assert inbound.acked
            break
        assert handled.handled is Handled.LEASE_HELD and not inbound.acked
        delays += inbound.naks
    s = runner.settings
    from scratchbank.domain.lease import backoff_delays

    assert delays == list(backoff_delays(s.hold, s.timing))
    assert checksum(tl, "run-1") == before


# ---- from tests/rules/test_L_adapters.py: The orphan sweeper (L4): a queued attempt no runner claimed within the cutoff.


def test_L4_the_sweeper_leaves_a_run_queued_for_less_than_the_cutoff(tmp_path: Path) -> None:
    """The sweeper leaves a run queued for less than the cutoff:
    ``scratchbank.application.orphans.sweep_orphans``."""
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
    its consents, and the runner claims and runs it.
    Proves ``scratchbank.application.orphans.sweep_orphans``."""
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


class _Flaky:
    """A queue whose first ``fails`` publications raise QueueUnavailable (a NATS restart)."""

    def __init__(self, queue: object, fails: int) -> None:
        self.queue, self.fails, self.tries = queue, fails, 0

    def publish(self, delivery: ResumeDelivery) -> bool:
        from scratchbank.domain.errors import QueueUnavailable

        self.tries += 1
        if self.tries <= self.fails:
            raise QueueUnavailable("the server went away (test)")
        return bool(self.queue.publish(delivery))  # type: ignore[attr-defined]


def test_L4_the_sweepers_publication_is_tried_again_within_its_budget(tmp_path: Path) -> None:
    """A queue down for a moment: the republication is tried again on the one retry helper's
    doubling pauses (on the sweep's clock) and lands; ``orphans._publish``."""
    clock, tl, rig = _queued_and_lost(tmp_path)
    clock.advance(CUTOFF)
    flaky = _Flaky(rig.queue, fails=3)
    [swept] = sweep_orphans([RUN], timeline=tl, queue=flaky, cutoff=CUTOFF, clock=clock)  # type: ignore[arg-type]
    assert swept.acted and flaky.tries == 4, swept.detail
    assert clock.slept == [0.2, 0.4, 0.8]
    assert rig.queue.fetch(1) is not None


def test_L4_a_queue_down_past_the_budget_leaves_the_sweep_recorded_and_named(tmp_path: Path) -> None:
    """Down for good: the tries stop within PUBLISH_SECONDS on the sweep's clock, the sweep
    stays recorded (aged to the park) and the reason names QUEUE_UNAVAILABLE.
    Proves ``scratchbank.application.orphans.sweep_orphans``."""
    from scratchbank.application.orphans import PUBLISH_SECONDS

    clock, tl, rig = _queued_and_lost(tmp_path)
    clock.advance(CUTOFF)
    down = _Flaky(rig.queue, fails=10**6)
    started = clock.monotonic()
    [swept] = sweep_orphans([RUN], timeline=tl, queue=down, cutoff=CUTOFF, clock=clock)  # type: ignore[arg-type]
    assert not swept.acted and "QUEUE_UNAVAILABLE" in swept.detail and "recorded" in swept.detail
    assert clock.monotonic() - started <= PUBLISH_SECONDS and down.tries > 3
    assert types(tl.read(RUN))[-1] == "orphan_swept"


def test_L4_the_sweeper_parks_when_the_republished_attempt_goes_unclaimed_too(tmp_path: Path) -> None:
    """The republication is lost as well: a cutoff after it the run is parked; a late
    delivery of that attempt is acked with nothing written; the sweeper leaves it.
    Proves ``scratchbank.application.orphans.sweep_orphans``."""
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


def test_L4_the_sweeper_writes_and_publishes_nothing_over_a_runner_that_claimed_meanwhile(
    tmp_path: Path,
) -> None:
    """The sweeper writes and publishes nothing over a runner that claimed meanwhile:
    ``scratchbank.application.orphans.sweep_orphans``."""
    clock, tl, rig = _queued_and_lost(tmp_path)
    clock.advance(CUTOFF)
    [swept] = sweep_orphans([RUN], timeline=_ClaimsFirst(tl), queue=rig.queue, cutoff=CUTOFF, clock=clock)
    assert not swept.acted and "moved" in swept.detail
    assert types(tl.read(RUN))[-1] == "attempt_claimed"
    assert not [r for r in tl.read(RUN) if isinstance(r, OrphanSwept)]
    assert rig.queue.fetch(0.05) is None


def test_L4_judge_orphan_leaves_a_queue_record_without_a_time_and_a_run_not_queued() -> None:
    """Model: the sweeper acts only on what it can age; a run not queued is not its.
    Proves ``scratchbank.domain.orphans.judge_orphan``."""
    now = ManualClock().now()
    assert judge_orphan([RunStarted()], now, CUTOFF).sweep is Sweep.LEAVE
    untimed = judge_orphan([RunStarted(), AttemptQueued(attempt="a1")], now, CUTOFF)
    assert untimed.sweep is Sweep.LEAVE and "no time" in untimed.reason


def test_L4_the_sweeper_default_cutoff_is_the_lease_arithmetics() -> None:
    """The sweeper default cutoff is the lease arithmetics: ``scratchbank.domain.lease.sweeper_cutoff``."""
    assert sweeper_cutoff(HoldBudgets(), LeaseTiming()) == 150 * 60


# ---- the NATS lease's acquire racing its value's aging out (seen once in CI under load).


class _AgingKv:
    """A KV bucket whose value ages out between nats-py's create and its read-back: the first
    create fails as nats-py's does then (KeyNotFoundError), the next one lands."""

    def __init__(self, lapses: int) -> None:
        self.lapses, self.creates = lapses, 0

    async def create(self, key: str, value: bytes) -> int:
        import nats.js.errors

        self.creates += 1
        if self.creates <= self.lapses:
            raise nats.js.errors.KeyNotFoundError
        return 41


class _LoopConn:
    def call(self, coro: object, timeout: float = 30.0) -> object:
        import asyncio

        return asyncio.run(coro)  # type: ignore[arg-type]


def _aging_lease(kv: _AgingKv) -> object:
    from scratchbank.adapters.nats_queue import NatsKvLease

    lease = NatsKvLease.__new__(NatsKvLease)
    lease.conn, lease.lapse, lease.clock, lease.bucket = _LoopConn(), 30.0, ManualClock(), "b"  # type: ignore[assignment]
    lease.kv = kv  # type: ignore[assignment]
    return lease


def test_L4_a_lease_whose_value_ages_out_during_the_acquire_is_taken_not_a_queue_outage() -> None:
    """The old holder's value lapsing between the create and its read-back is a free key: taken.
    Proves ``scratchbank.adapters.nats_queue.NatsKvLease.acquire``."""
    kv = _AgingKv(lapses=1)
    grant = _aging_lease(kv).acquire("run-1", "b")  # type: ignore[attr-defined]
    assert grant is not None and grant.token == 41 and kv.creates == 2


def test_L4_a_lease_that_keeps_lapsing_under_the_acquire_is_held_and_backed_off_from() -> None:
    """A key lapsing under every try is reported held (the caller backs off), never an outage.
    Proves ``scratchbank.adapters.nats_queue.NatsKvLease.acquire``."""
    kv = _AgingKv(lapses=99)
    assert _aging_lease(kv).acquire("run-1", "b") is None  # type: ignore[attr-defined]
    assert kv.creates == 3
