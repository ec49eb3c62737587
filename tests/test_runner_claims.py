"""The runner on the engine's claim API: the resume's claim and the fenced writer compose.

The runner claims the run (``lease_taken``, ``attempt_claimed``); the resume use case
then claims it again by position (``run_resumed`` at the version it read) and writes
its restore record where its claim ended; the teardown records at the version it read.
All of it goes through one FencedTimeline. A resume that loses its claim (C6 "again if
it loses its claim to a newer attempt") is acked with nothing more written; a holder
fenced in the middle of the resume is refused and writes nothing more either.

Real parts: local sandboxes, banks on disk, the reference engine, the in-process
queue and lease, an in-memory timeline; the race is a timeline whose other writer
appends just before one chosen record of ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from runner_rigs import RecordingInbound, RunnerRig, checksum, make_rig, queue_resume, types

from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.fencing import FencedTimeline, Token
from scratchbank.application.ports import ResumeDelivery
from scratchbank.application.resume import resume
from scratchbank.application.runner import Handled
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain.errors import Fenced
from scratchbank.domain.records import (
    AttemptClaimed,
    LeaseTaken,
    NodeFinished,
    Record,
    RunResumed,
    RunStarted,
    ScratchBanked,
    ScratchRestored,
)
from scratchbank.domain.resume_gate import ResumeRequest, Verdict, Where

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


def test_C6_a_resume_that_loses_its_claim_in_the_runner_is_acked_with_nothing_more_written(
    tmp_path: Path,
) -> None:
    """Another execution starts between the resume's read and its claim: ResumeSuperseded
    inside the runner, acked, and after the other writer's record nothing of ours lands."""
    tl, rig = _parked_and_banked(tmp_path)
    theirs = RunResumed(attempt="cli")
    rig.timeline = _WritesFirst(tl, RunResumed, [theirs])
    inbound = RecordingInbound(ResumeDelivery(RUN, "a2"))
    handled = rig.runner().handle(inbound)
    assert handled.handled is Handled.SUPERSEDED, handled.detail
    assert "RESUME_SUPERSEDED" in handled.detail or "claimed it" in handled.detail
    assert inbound.acked and not inbound.naks
    assert tl.read(RUN)[-1] == theirs  # the last record is the other execution's: nothing after it
    assert _after(tl, AttemptClaimed, "a2") == ["run_status_changed", "run_resumed"]
    assert not list((tmp_path / "sandboxes").iterdir())  # its sandbox was torn down


def test_C6_a_resume_that_loses_its_claim_after_the_restore_writes_no_record_runs_nothing_banks_nothing(
    tmp_path: Path,
) -> None:
    """Another writer appends between the resume's claim and its restore record: the restore
    record is not written, the engine does not run, the teardown does not bank; acked."""
    tl, rig = _parked_and_banked(tmp_path)
    theirs = RunResumed(attempt="cli")
    rig.timeline = _WritesFirst(tl, ScratchRestored, [theirs])
    banks_before = sorted(p.read_bytes() for p in (tmp_path / "banks").rglob("*") if p.is_file())
    inbound = RecordingInbound(ResumeDelivery(RUN, "a2"))
    handled = rig.runner().handle(inbound)
    assert handled.handled is Handled.SUPERSEDED, handled.detail
    assert inbound.acked
    assert tl.read(RUN)[-1] == theirs
    assert _after(tl, AttemptClaimed, "a2") == ["run_status_changed", "run_resumed", "run_resumed"]
    banks_after = sorted(p.read_bytes() for p in (tmp_path / "banks").rglob("*") if p.is_file())
    assert banks_after == banks_before  # the bank the newer execution restores is untouched


def test_fence_a_newer_holder_during_the_resume_is_refused_and_not_acked(tmp_path: Path) -> None:
    """A newer lease holder writes between the resume's claim and its restore record: the
    stale runner's restore record is refused FENCED, nothing more of it lands, and the
    delivery is left to the new holder (not acked)."""
    tl, rig = _parked_and_banked(tmp_path)
    newer = [LeaseTaken(holder="runner-b", token=10**9, attempt="a2"), AttemptClaimed(attempt="a2")]
    rig.timeline = _WritesFirst(tl, ScratchRestored, newer)
    inbound = RecordingInbound(ResumeDelivery(RUN, "a2"))
    handled = rig.runner().handle(inbound)
    assert handled.handled is Handled.FENCED, handled.detail
    assert not inbound.acked
    assert types(tl.read(RUN)[-2:]) == ["lease_taken", "attempt_claimed"]  # the new holder's, last


def test_fence_resume_and_teardown_through_an_announced_fenced_timeline_land_where_they_counted(
    tmp_path: Path,
) -> None:
    """announce() first, then the resume's claim and restore record and the teardown's
    record: each lands at the position its use case counted (no conflict with itself)."""
    tl, rig = _parked_and_banked(tmp_path)
    fenced = FencedTimeline(tl, RUN, Token("runner-c", 10**9, "a2"))
    fenced.announce()
    assert types(tl.read(RUN))[-1] == "lease_taken"
    sandbox = rig.provider.start(RUN)
    try:
        request = ResumeRequest(where=Where.ENGINE)
        outcome = resume(RUN, request, timeline=fenced, store=rig.store, sandbox=sandbox, attempt="a2")
        assert outcome.decision.verdict is Verdict.RESTORE and outcome.proceeds
        assert outcome.claim is not None and outcome.claim.position == len(tl.read(RUN))
        report = bank_at_teardown(RUN, timeline=fenced, store=rig.store, sandbox=sandbox, run_finished=False)
        assert report.recorded and not report.superseded, report.notes
    finally:
        rig.provider.stop(sandbox)
    tail = types(tl.read(RUN))
    assert tail[-4:] == ["lease_taken", "run_resumed", "sandbox_scratch_restored", "sandbox_scratch_banked"]
    assert tail.count("lease_taken") == 2  # a1's runner's, then ours: once


def test_fence_announce_is_once_and_refused_past_a_newer_token(tmp_path: Path) -> None:
    """announce() writes the token once; a holder older than the last token is refused."""
    tl = InMemoryTimeline()
    tl.append(RUN, [RunStarted()])
    stale = FencedTimeline(tl, RUN, Token("a", 1))
    stale.announce()
    stale.announce()
    FencedTimeline(tl, RUN, Token("b", 2)).announce()
    before = checksum(tl, RUN)
    late = FencedTimeline(tl, RUN, Token("c", 1))
    with pytest.raises(Fenced) as refused:
        late.announce()
    assert refused.value.code == "FENCED"
    assert types(tl.read(RUN)) == ["run_started", "lease_taken", "lease_taken"]
    assert checksum(tl, RUN) == before
    assert [r for r in tl.read(RUN) if isinstance(r, NodeFinished | ScratchBanked)] == []


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


def test_A18_the_runners_teardown_names_the_execution_its_resume_started(tmp_path: Path) -> None:
    """A runner execution's teardown names its own execution (A18): once a newer one
    started, it is superseded and records nothing over the newer execution."""
    tl, rig = _parked_and_banked(tmp_path)
    rig.engine = _AnotherExecutionDuringTheEngine(rig.engine, tl)  # type: ignore[assignment]
    handled = rig.runner().run_once(1)
    assert handled is not None and handled.teardown is not None, handled
    ours = [r for r in tl.read(RUN) if isinstance(r, RunResumed)][-2]
    assert ours.execution and handled.teardown.execution == ours.execution
    assert handled.teardown.superseded and not handled.teardown.recorded
    assert tl.read(RUN)[-1] == RunResumed(attempt="cli", execution="the-newer-one")
