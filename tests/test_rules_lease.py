"""The run's lease while banking (L1-L5): ceilings, back-off, sweeper cutoff, the keeper.

The figures the tests hold the code to are the ADR's (RULES.md L3, L4): 56 minutes,
31 of them the storage bank's, and 2 h 30; the back-off shape is read from L4's text.
"""

from __future__ import annotations

import itertools
import time

import attrs

from scratchbank.adapters.inprocess import InProcessLease
from scratchbank.application.clock import SystemClock
from scratchbank.application.lease_keeper import LeaseKeeper
from scratchbank.domain.lease import (
    HoldBudgets,
    HoldClock,
    LeaseTiming,
    backoff_delays,
    delay_for,
    max_deliveries,
    past_ceiling,
    post_engine_ceiling,
    sweeper_cutoff,
    teardown_ceiling,
    unwind_ceiling,
)

B, T = HoldBudgets(), LeaseTiming()
MIN = 60.0


def test_L3_unwind_ceiling_is_56_minutes_with_the_defaults() -> None:
    """Both ceilings together: 56 minutes, of which the 31-minute storage bank is most."""
    assert unwind_ceiling(B) == 56 * MIN
    assert teardown_ceiling(B) + post_engine_ceiling(B) == unwind_ceiling(B)
    assert B.storage_bank == 31 * MIN
    assert B.storage_bank > unwind_ceiling(B) / 2


def test_L3_ceiling_follows_each_budget() -> None:
    """Raising any one budget raises the ceiling by as much."""
    for field in attrs.fields(HoldBudgets):
        bigger = attrs.evolve(B, **{field.name: getattr(B, field.name) + 7})
        assert unwind_ceiling(bigger) == unwind_ceiling(B) + 7, field.name


def test_L4_backoff_halves_from_one_interval_to_ceiling_plus_lapse() -> None:
    """First delay one lease interval, last the whole ceiling plus the lapse, each half the next."""
    delays = backoff_delays(B, T)
    assert delays[0] == T.interval
    assert delays[-1] == unwind_ceiling(B) + T.lapse
    for shorter, longer in itertools.pairwise(delays[1:]):
        assert shorter * 2 == longer
    assert delays[1] / 2 <= T.interval < delays[1]


def test_L4_the_last_retry_outwaits_a_whole_hold() -> None:
    """A delivery meeting a hold just taken still finds it gone at its last retry."""
    assert delay_for(max_deliveries(B, T) - 1, B, T) == unwind_ceiling(B) + T.lapse
    assert delay_for(max_deliveries(B, T), B, T) is None
    assert delay_for(1, B, T) == T.interval


def test_L4_sweeper_cutoff_is_2h30_with_the_defaults() -> None:
    """Every delivery at its rank's longest delay (its back-off plus an ack wait)."""
    assert sweeper_cutoff(B, T) == 150 * MIN
    longest = sum(backoff_delays(B, T)) + max_deliveries(B, T) * T.ack_wait
    assert longest <= sweeper_cutoff(B, T) < longest + MIN


def test_L2_teardown_ceiling_counts_from_a_cancellation_to_the_engine_return() -> None:
    """No ceiling while the engine runs uncancelled; past teardown + margin once cancelled."""
    assert past_ceiling(HoldClock(), 10_000.0, B) is None
    cancelled = HoldClock(cancelled_at=0.0)
    assert past_ceiling(cancelled, teardown_ceiling(B), B) is None
    assert past_ceiling(cancelled, teardown_ceiling(B) + 1, B) == "teardown ceiling"


def test_L2_post_engine_ceiling_is_armed_only_when_a_resume_can_wait() -> None:
    """An engine that returned an error arms it; a finished run's bank runs to its own budget."""
    parked = HoldClock(engine_returned_at=0.0, resume_can_wait=True)
    assert past_ceiling(parked, post_engine_ceiling(B) + 1, B) == "post-engine ceiling"
    assert past_ceiling(parked, post_engine_ceiling(B), B) is None
    finished = HoldClock(engine_returned_at=0.0, resume_can_wait=False)
    assert past_ceiling(finished, 10 * unwind_ceiling(B), B) is None


def _short(lapse: float = 0.3) -> tuple[InProcessLease, HoldBudgets, LeaseTiming]:
    return InProcessLease(lapse=lapse), HoldBudgets(), LeaseTiming(interval=0.05, lapse=lapse)


def test_L1_keeper_refreshes_through_the_hold() -> None:
    """While kept, the lease outlives its lapse many times over: nobody else can take it."""
    lease, hold, timing = _short()
    grant = lease.acquire("run-1", "a")
    assert grant is not None
    keeper = LeaseKeeper(lease, grant, hold, timing, SystemClock())
    keeper.start()
    try:
        deadline = time.monotonic() + 5
        while keeper.refreshes < 12 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lease.acquire("run-1", "b") is None
    finally:
        keeper.stop()
    assert keeper.refreshes >= 12 and not keeper.cancel.is_set()


def test_L5_past_a_ceiling_the_keeper_lets_go_and_cancels_the_run() -> None:
    """The post-engine ceiling passes: the lease is released and the run context cancelled."""
    lease, _, timing = _short(lapse=30.0)
    tiny = HoldBudgets(0, 0, 0, 0, 0, 0, 0.1)
    grant = lease.acquire("run-1", "a")
    assert grant is not None
    keeper = LeaseKeeper(lease, grant, tiny, timing, SystemClock())
    keeper.start()
    keeper.engine_returned(resume_can_wait=True)
    try:
        assert keeper.cancel.wait(5)
    finally:
        keeper.stop()
    assert "post-engine ceiling" in keeper.note
    assert lease.acquire("run-1", "b") is not None  # let go: another runner takes it at once


def test_L5_a_refresh_that_fails_cancels_the_run() -> None:
    """The lease lapsed and was taken: the refresh fails and the run context is cancelled."""
    lease, hold, timing = _short(lapse=0.1)
    grant = lease.acquire("run-1", "a")
    assert grant is not None
    time.sleep(0.15)
    taken = lease.acquire("run-1", "b")
    assert taken is not None and taken.token > grant.token
    keeper = LeaseKeeper(lease, grant, hold, timing, SystemClock())
    keeper.start()
    try:
        assert keeper.cancel.wait(5)
    finally:
        keeper.stop()
    assert "LEASE_LOST" in keeper.note
