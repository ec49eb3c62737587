"""Holding a run's lease while banking (L1-L5), as pure arithmetic on budgets.

The runner holds the run's lease through the engine's teardown and its own
post-engine steps (L1). Two ceilings bound that hold (L2); together they are the
lease-unwind ceiling (L3). A resume delivered while the lease is held backs off by
halves to a last delay that outwaits the whole ceiling and the lease's lapse, and
the orphan sweeper's cutoff outwaits every delivery at its rank's longest delay
(L4). A runner past a ceiling lets the lease go (L5): ``past_ceiling`` says when.

Every figure is in seconds. The defaults give the ADR's figures: a 56-minute
ceiling, of which the storage bank's 31 minutes are most, and a 2 h 30 cutoff.
"""

from __future__ import annotations

import math

import attrs

MINUTE = 60.0


@attrs.frozen
class HoldBudgets:
    """The budgets whose sum bounds the lease's hold (L2). Override per deployment.

    Teardown (from a cancellation to the engine's return): the bank's archive and
    record and the resume's restore, plus a margin. Post-engine (from the return,
    armed only when a resume can wait on the run): the git snapshot, the storage
    bank (31 min, most of the ceiling), the artifact upload, the spend and log
    records, plus a margin.
    """

    teardown: float = 6 * MINUTE
    teardown_margin: float = 2 * MINUTE
    snapshot: float = 5 * MINUTE
    storage_bank: float = 31 * MINUTE
    artifacts: float = 5 * MINUTE
    records: float = 1 * MINUTE
    post_margin: float = 6 * MINUTE


@attrs.frozen
class LeaseTiming:
    """How the lease is kept and how deliveries wait for it (L4).

    ``interval``: how often the holder refreshes, and the first retry's delay.
    ``lapse``: how long an unrefreshed lease lives. ``ack_wait``: how long the queue
    leaves a delivery with a runner that went silent before delivering it again.
    """

    interval: float = 30.0
    lapse: float = 1 * MINUTE
    ack_wait: float = 4 * MINUTE


def teardown_ceiling(b: HoldBudgets) -> float:
    """From a cancellation to the engine's return (L2)."""
    return b.teardown + b.teardown_margin


def post_engine_ceiling(b: HoldBudgets) -> float:
    """From the engine's return, when a resume can wait on the run (L2)."""
    return b.snapshot + b.storage_bank + b.artifacts + b.records + b.post_margin


def unwind_ceiling(b: HoldBudgets) -> float:
    """The lease-unwind ceiling: both ceilings together (L3; 56 min by default)."""
    return teardown_ceiling(b) + post_engine_ceiling(b)


def backoff_delays(b: HoldBudgets, t: LeaseTiming) -> tuple[float, ...]:
    """Retry delays for a resume that met a held lease, shortest first (L4).

    The last waits the whole ceiling plus the lapse; each earlier one is half the
    next, down to one lease interval (the first).
    """
    last = unwind_ceiling(b) + t.lapse
    delays = [last]
    while delays[-1] / 2 > t.interval:
        delays.append(delays[-1] / 2)
    delays.append(t.interval)
    return tuple(reversed(delays))


def delay_for(delivery: int, b: HoldBudgets, t: LeaseTiming) -> float | None:
    """How long the ``delivery``-th delivery (1-based) waits before the next; None: no retry left."""
    delays = backoff_delays(b, t)
    return delays[delivery - 1] if 1 <= delivery <= len(delays) else None


def max_deliveries(b: HoldBudgets, t: LeaseTiming) -> int:
    """The first delivery plus one retry per delay (L4)."""
    return len(backoff_delays(b, t)) + 1


def sweeper_cutoff(b: HoldBudgets, t: LeaseTiming) -> float:
    """How long a queued run may wait before the orphan sweeper takes it (L4).

    Every delivery is counted at the longest delay its rank can take: its back-off
    delay, plus the ack wait of a runner that went silent holding it. Rounded up to
    a whole minute (2 h 30 with the defaults).
    """
    longest = sum(backoff_delays(b, t)) + max_deliveries(b, t) * t.ack_wait
    return math.ceil(longest / MINUTE) * MINUTE


@attrs.frozen
class HoldClock:
    """Where a hold stands: when the run was cancelled and when the engine returned."""

    cancelled_at: float | None = None
    engine_returned_at: float | None = None
    resume_can_wait: bool = False


def past_ceiling(hold: HoldClock, now: float, b: HoldBudgets) -> str | None:
    """Which ceiling the hold is past, if any (L2, L5): then the lease is let go."""
    if hold.engine_returned_at is None:
        if hold.cancelled_at is not None and now - hold.cancelled_at > teardown_ceiling(b):
            return "teardown ceiling"
        return None
    if hold.resume_can_wait and now - hold.engine_returned_at > post_engine_ceiling(b):
        return "post-engine ceiling"
    return None
