"""Adopting a subbot child into its parent's sandbox (S1, S5).

The domain decides (``decide_adoption``); this use case writes the adoption record
``sandbox_shared`` on the child's timeline within its budget before the child runs
there (S5). A refusal (S1) or a record that did not land means the child does not
execute in the parent's sandbox.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from scratchbank.domain.adoption import AdoptionDecision, ChildNode, decide_adoption
from scratchbank.domain.errors import TimelineConflict
from scratchbank.domain.records import Record

from .ports import Clock, SandboxFacts, SystemClock, Timeline
from .recording import RETRYABLE, Claim, landed
from .retry import Budget, retry_within

#: S5: the adoption record's own budget (the records' default, RULES.md facts).
ADOPTION_RECORD_BUDGET = 30.0


@attrs.frozen
class Adoption:
    """Whether the child may run in the parent's sandbox, and why."""

    adopted: bool
    rule: str
    reason: str
    decision: AdoptionDecision


def adopt_child(
    child_run: str,
    child: Sequence[ChildNode],
    *,
    parent_run: str,
    parent: SandboxFacts,
    parent_copy_based: bool,
    timeline: Timeline,
    budget: float = ADOPTION_RECORD_BUDGET,
    clock: Clock | None = None,
) -> Adoption:
    """Decide (S1), then write the adoption record within ``budget`` or refuse (S5)."""
    local = not parent.host_backed
    decision = decide_adoption(child, scratch_container_local=local, parent_copy_based=parent_copy_based)
    if not decision.adopt or decision.record is None:
        return Adoption(False, decision.rule, decision.reason, decision)
    record = attrs.evolve(decision.record, parent_run=parent_run)
    why = _record_within(timeline, child_run, record, Budget.start(clock or SystemClock(), budget))
    if why is not None:
        reason = f"the adoption record did not land within its budget ({why}): not run there"
        return Adoption(False, "S5", reason, decision)
    return Adoption(True, "S5", decision.reason, decision)


def _record_within(timeline: Timeline, child_run: str, record: Record, budget: Budget) -> str | None:
    """Append the adoption record, retrying a store outage within ``budget``; None once
    written, else why not. The child has no claim of its own yet: an append that raced
    another writer is tried again at the new tail (the record only adds a fact). A try
    whose reply was lost is settled by reading: landed, it is never written twice."""
    tried: list[Claim] = []  # where earlier tries appended, their outcome unknown

    def once(_deadline: object) -> None:
        if any(landed(timeline, claim, [record]) for claim in tried):
            return
        claim = Claim(child_run, len(timeline.read(child_run)))
        try:
            timeline.append(child_run, [record], expected=claim.position)
        except RETRYABLE:
            tried.append(claim)
            raise

    try:
        retry_within(budget, once, retry_on=(*RETRYABLE, TimelineConflict))
    except (*RETRYABLE, TimelineConflict) as error:
        return error.message
    return None
