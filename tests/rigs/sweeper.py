"""The orphan sweeper's cutoff and a queued attempt lost before its claim.

First written for tests/rules/test_L_adapters.py: The orphan sweeper (L4): a queued attempt no
runner claimed within the cutoff."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from runner_rigs import RunnerRig, make_rig, queue_resume

from scratchbank.adapters.inprocess import InProcessQueue
from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.domain.admission import Consents
from scratchbank.domain.records import AttemptClaimed, OrphanSwept, Record, RunStarted
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
