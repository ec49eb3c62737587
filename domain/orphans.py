"""The orphan judgement: may a new lease holder bank what a lapsed one left (T9, X3),
and what the orphan sweeper does with a run left queued (L4)."""

from __future__ import annotations

import enum
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
