"""Which execution a record belongs to (A18), read from the timeline alone (pure).

An execution starts with ``run_started`` or ``run_resumed``; since ADR 0007 that record
names it (``execution``). A record written before then names none: its execution is
known by its position (``@N``, N the 0-based position of its start record, as the bank
objects' stamps name it: ADR 0006), today's meaning.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .records import Record, RunResumed, RunStarted


@attrs.frozen
class Execution:
    """One execution's start: its position in the timeline and its id (None: unnamed)."""

    position: int
    id: str | None

    @property
    def label(self) -> str:
        return self.id or f"@{self.position}"


def executions(records: Sequence[Record]) -> tuple[Execution, ...]:
    """Every execution's start, in order."""
    return tuple(
        Execution(i, r.execution) for i, r in enumerate(records) if isinstance(r, RunStarted | RunResumed)
    )


def label_of(position: int | None, execution_id: str | None) -> str | None:
    """How a record names an execution: its id, else ``@N``; None for no execution."""
    if position is None:
        return None
    return execution_id or f"@{position}"


@attrs.frozen
class Standing:
    """Where a teardown of ``execution`` stands on a timeline: ``newer`` is the first
    execution that started after it (the teardown is superseded), ``missing`` is True
    when no start record names it at all (it cannot say which execution it banks)."""

    execution: Execution | None
    newer: Execution | None = None
    missing: bool = False

    @property
    def why_not(self) -> str:
        """Why this teardown must record nothing, or "" when it may."""
        if self.missing:
            return "superseded: no execution on the timeline is the one this teardown banks"
        if self.newer is not None:
            mine = self.execution.label if self.execution else "?"
            return (
                f"superseded: execution {self.newer.label} started after execution {mine}, "
                "whose sandbox this teardown banks (A18)"
            )
        return ""


def standing(records: Sequence[Record], execution: str | None) -> Standing:
    """Where a teardown banking ``execution`` stands (None: the latest one, A18's
    meaning for a caller that names none)."""
    starts = executions(records)
    if execution is None:
        return Standing(starts[-1] if starts else None)
    index = next((i for i, e in enumerate(starts) if e.id == execution), None)
    if index is None:
        return Standing(None, missing=True)
    newer = starts[index + 1] if index + 1 < len(starts) else None
    return Standing(starts[index], newer)
