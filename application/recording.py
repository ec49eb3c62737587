"""Writing a record within its budget (T8, X7): one retry loop for every use case."""

from __future__ import annotations

from collections.abc import Sequence

from scratchbank.domain.errors import TimelineConflict, TimelineUnreadable, TimelineWriteFailed
from scratchbank.domain.records import Record

from .clock import Clock
from .ports import Timeline


def append_within_budget(
    timeline: Timeline,
    run_id: str,
    records: Sequence[Record],
    *,
    clock: Clock,
    budget: float,
    first_pause: float = 1.0,
    pause_cap: float = 8.0,
) -> str | None:
    """Append, retrying with a doubling pause (capped) until ``budget`` runs out.

    Returns None once written, else why it was not. ``budget=0`` tries exactly once
    (a best-effort record).
    """
    deadline = clock.monotonic() + budget
    pause = first_pause
    while True:
        try:
            timeline.append(run_id, records)
            return None
        except (TimelineWriteFailed, TimelineConflict, TimelineUnreadable) as error:
            if clock.monotonic() + pause > deadline:
                return error.message
            clock.sleep(pause)
            pause = min(pause * 2, pause_cap)
