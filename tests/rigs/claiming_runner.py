"""A runner whose claim races: timelines that write first, another execution during the engine.

First written for tests/test_runner_claims.py: The runner on the engine's claim API: the resume's
claim and the fenced writer compose."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from runner_rigs import RunnerRig, make_rig, queue_resume, types

from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.runner import Handled
from scratchbank.domain.records import (
    AttemptClaimed,
    Record,
    RunResumed,
    RunStarted,
)

RUN = "run-1"


class _WritesFirst(InMemoryTimeline):
    """A timeline another writer appends ``theirs`` to just before our first batch holding a ``before``."""

    def __init__(self, inner: InMemoryTimeline, before: type[Record], theirs: Sequence[Record]) -> None:
        self.inner, self.before, self.theirs, self.fired = inner, before, list(theirs), False

    def read(self, run_id: str) -> Sequence[Record]:
        return self.inner.read(run_id)

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        if not self.fired and any(isinstance(r, self.before) for r in records):
            self.fired = True
            self.inner.append(run_id, self.theirs)
        return self.inner.append(run_id, records, expected=expected)


def _parked_and_banked(tmp_path: Path) -> tuple[InMemoryTimeline, RunnerRig]:
    """The story's first delivery: run to its human gate, scratch banked. Then a2 queued."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    tl.append(RUN, [RunStarted()])
    queue_resume(tl, rig.queue, RUN, "a1")
    first = rig.runner().run_once(1)
    assert first is not None and first.handled is Handled.RAN, first.detail
    assert first.teardown is not None and first.teardown.record.banked
    queue_resume(tl, rig.queue, RUN, "a2")
    return tl, rig


def _after(tl: InMemoryTimeline, mark: type[Record], attempt: str) -> list[str]:
    """The record types after the first ``mark`` record (of ``attempt`` for claims)."""
    records = list(tl.read(RUN))
    at = next(
        i
        for i, r in enumerate(records)
        if isinstance(r, mark) and (not isinstance(r, AttemptClaimed) or r.attempt == attempt)
    )
    return types(records[at + 1 :])


class _AnotherExecutionDuringTheEngine:
    """The rig's engine, after which another execution starts on the run (a CLI resume)."""

    def __init__(self, inner: object, timeline: InMemoryTimeline) -> None:
        self.inner, self.timeline = inner, timeline

    def continue_run(self, run_id: str, **kw: object) -> object:
        end = self.inner.continue_run(run_id, **kw)  # type: ignore[attr-defined]
        self.timeline.append(run_id, [RunResumed(attempt="cli", execution="the-newer-one")])
        return end

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)
