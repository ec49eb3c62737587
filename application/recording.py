"""Writing to a run's timeline as a claim holder: read, decide, append at what was read.

Every use case reads the timeline with its version (its length), decides, and appends
with ``expected=`` that version (C7, R10: the engine checks "under the run's lock,
before its claim"). A conflict is never retried blindly: the writer reads what was
appended since and decides again, or learns that it lost the run.

A ``Claim`` is the position a writer's next append must find. The resume's first append
is its claim; every later write of that resume appends at the position it last wrote
(fencing by position), so a resume or a teardown that lost the run writes nothing more.
The runner's lease fencing builds on the same value.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from scratchbank.domain.errors import TimelineBusy, TimelineConflict, TimelineUnreadable, TimelineWriteFailed
from scratchbank.domain.records import Record, RunResumed, RunStarted, ScratchBanked

from .ports import Timeline
from .retry import Budget, Pauses, retry_within

#: What one failed append may be retried for: a store outage or a busy store, never a conflict.
RETRYABLE = (TimelineWriteFailed, TimelineUnreadable, TimelineBusy)


@attrs.frozen
class Claim:
    """A writer's hold on a run's timeline: the length its next append must find.

    ``position`` is the timeline's length right after this writer's last append (or,
    before its first, the length it read and decided on). Pass it along; append with
    ``append_at``; a TimelineConflict from it means someone else wrote in between.
    """

    run_id: str
    position: int

    def after(self, records: Sequence[Record]) -> Claim:
        return attrs.evolve(self, position=self.position + len(records))


def read_since(timeline: Timeline, claim: Claim) -> tuple[Record, ...]:
    """What other writers appended after the claim's position (raises TimelineUnreadable)."""
    return tuple(timeline.read(claim.run_id))[claim.position :]


def landed(timeline: Timeline, claim: Claim, records: Sequence[Record]) -> bool:
    """Did our own earlier try land after all (a write that failed on the way back)?

    False when the timeline cannot tell (unreadable, busy): a report never claims a
    record it has not seen.
    """
    try:
        since = read_since(timeline, claim)
    except (TimelineUnreadable, TimelineBusy):
        return False
    return since[: len(records)] == tuple(records)


def append_at(
    timeline: Timeline,
    claim: Claim,
    records: Sequence[Record],
    *,
    budget: Budget,
    pauses: Pauses = Pauses(),
    tries: int | None = None,
) -> Claim:
    """Append ``records`` at the claim's position; return the claim past them.

    A store outage is retried within ``budget`` (same position: the claim does not
    move); a conflict raises TimelineConflict at once unless it was our own earlier
    try that landed. The last outage's error is raised when the budget is spent.
    """
    tried = False

    def once(_deadline: object) -> Claim:
        nonlocal tried
        try:
            timeline.append(claim.run_id, records, expected=claim.position)
        except TimelineConflict:
            if tried and landed(timeline, claim, records):
                return claim.after(records)
            raise
        except RETRYABLE:
            tried = True
            raise
        return claim.after(records)

    return retry_within(budget, once, retry_on=RETRYABLE, pauses=pauses, tries=tries)


def new_execution(records: Sequence[Record]) -> Record | None:
    """The first record that starts another execution of the run (a claim by someone else)."""
    return next((r for r in records if isinstance(r, RunStarted | RunResumed)), None)


def another_teardown(records: Sequence[Record]) -> ScratchBanked | None:
    """The first teardown record among ``records`` (another teardown recorded first)."""
    return next((r for r in records if isinstance(r, ScratchBanked)), None)
