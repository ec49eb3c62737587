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

import enum
import math
from collections.abc import Sequence
from datetime import datetime

import attrs

from .fold import fold
from .records import (
    AttemptQueued,
    OrphanSwept,
    Record,
    RunResumed,
    RunStarted,
    ScratchBanked,
    ScratchRestored,
)

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


def _last_execution(records: Sequence[Record]) -> int | None:
    starts = [i for i, r in enumerate(records) if isinstance(r, RunStarted | RunResumed)]
    return starts[-1] if starts else None


def orphan_may_bank(records: Sequence[Record]) -> bool:
    """May a new lease holder bank the sandbox a lapsed holder left behind? (T9, X3)

    Only when that execution's restore landed (``sandbox_scratch_restored {restored}``)
    or none was due, and its teardown did not already record the scratch: a sandbox
    cut off mid-restore holds a part of the bank, never banked over the bank itself.
    """
    last = _last_execution(records)
    if last is None:
        return True
    since = records[last:]
    if any(isinstance(r, ScratchBanked) for r in since):
        return False
    if fold(records[:last]).bank is None:
        return True
    return any(isinstance(r, ScratchRestored) and r.restored for r in since)


# --- the orphan sweeper (L4) ---------------------------------------------------------


class Sweep(enum.Enum):
    """What the orphan sweeper does with one run."""

    LEAVE = "leave"  # not waiting on a delivery, or not for as long as the cutoff
    REPUBLISH = "republish"  # its attempt's delivery is published again
    PARK = "park"  # published again and still unclaimed: the run is parked for the operator


@attrs.frozen
class OrphanVerdict:
    sweep: Sweep
    reason: str
    queued: AttemptQueued | None = None
    #: which publication of the attempt a REPUBLISH is (1: the first the sweeper makes)
    republished: int = 0


def _since_queued(records: Sequence[Record], queued: AttemptQueued) -> Sequence[Record]:
    last = max(i for i, r in enumerate(records) if isinstance(r, AttemptQueued) and r == queued)
    return records[last + 1 :]


def judge_orphan(
    records: Sequence[Record], now: datetime, cutoff: float, republishes: int = 1
) -> OrphanVerdict:
    """L4: a queued attempt no runner claimed within ``cutoff`` seconds of its last
    publication outwaited every delivery at its rank's longest delay: nobody will carry
    it on. Publish it again (up to ``republishes`` times), then park the run."""
    state = fold(records)
    queued = state.queued_attempt
    if queued is None:
        return OrphanVerdict(Sweep.LEAVE, "no attempt is queued")
    if state.claimed_attempt == queued.attempt:
        return OrphanVerdict(Sweep.LEAVE, f"attempt {queued.attempt} was claimed", queued)
    swept = [r for r in _since_queued(records, queued) if isinstance(r, OrphanSwept)]
    if any(r.parked for r in swept):
        return OrphanVerdict(Sweep.LEAVE, f"attempt {queued.attempt} was already parked", queued)
    published = swept[-1].at if swept else queued.at
    if published is None:
        return OrphanVerdict(Sweep.LEAVE, "its last publication carries no time: it cannot be aged", queued)
    waited = (now - published).total_seconds()
    if waited < cutoff:
        return OrphanVerdict(
            Sweep.LEAVE, f"unclaimed for {waited:.0f} s of the {cutoff:.0f} s cutoff", queued
        )
    if len(swept) < republishes:
        why = f"attempt {queued.attempt} unclaimed for {waited:.0f} s, past the {cutoff:.0f} s cutoff"
        return OrphanVerdict(Sweep.REPUBLISH, why, queued, len(swept) + 1)
    why = (
        f"attempt {queued.attempt} went unclaimed past the {cutoff:.0f} s cutoff "
        f"{len(swept) + 1} times: parked; resume the run again"
    )
    return OrphanVerdict(Sweep.PARK, why, queued)
