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

from pathlib import Path

import pytest
from rigs.claiming_runner import RUN, _parked_and_banked, _WritesFirst
from runner_rigs import RecordingInbound, checksum, types

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
    RunStarted,
    ScratchBanked,
    ScratchRestored,
)
from scratchbank.domain.resume_gate import ResumeRequest, Verdict, Where


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
