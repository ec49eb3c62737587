"""Checkpoint stamps (ADR 0013): staleness read from the checkpoint itself (N1, N2, K1-K5)."""

from __future__ import annotations

import attrs
import pytest

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.resume import resume
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import SCRATCH_NOT_PORTABLE, Consents, ResumeRequest, Verdict, decide_resume, fold
from scratchbank.domain.checkpoints import Checkpoint, Position, compare
from scratchbank.domain.errors import InvalidCheckpoint, TimelineUnreadable
from scratchbank.domain.records import Record, RunRewound, ScratchBanked, ScratchRestored
from scratchbank.domain.snapshot import state_from_data, state_to_data
from scratchbank.domain.wire import decode, encode
from scratchbank.testing.builders import banked, node, resumed, started
from scratchbank.testing.clocks import ManualClock

C1 = Checkpoint(("start", "c1"))
C2 = Checkpoint(("start", "c1", "c2"))
C3 = Checkpoint(("start", "c1", "c3"))
ACCEPT = Consents(accept_scratch_loss=True)


def stamped(checkpoint: Checkpoint | None) -> ScratchBanked:
    return attrs.evolve(banked(), checkpoint=checkpoint)


def decide(timeline: list[Record], at: Checkpoint | None, consents: Consents = Consents()) -> object:
    return decide_resume(fold(timeline), ResumeRequest(consents=consents, checkpoint=at))


def test_K_compare_reads_the_lineage_never_a_count() -> None:
    """Equal lengths on different branches diverge; prefixes are ahead or behind."""
    assert compare(C2, C2) is Position.EXACT
    assert compare(C1, C2) is Position.AHEAD
    assert compare(C2, C1) is Position.BEHIND
    assert compare(C2, C3) is Position.DIVERGED
    assert Position.AHEAD.stale and Position.DIVERGED.stale
    assert not Position.EXACT.stale and not Position.BEHIND.stale


def test_K_a_checkpoint_without_a_lineage_is_refused_by_name() -> None:
    """An empty lineage or an empty id is a named error, never a stamp."""
    for bad in ((), ("start", "")):
        with pytest.raises(InvalidCheckpoint):
            Checkpoint(bad)


def test_N1_K1_a_lost_node_finished_no_longer_hides_a_stale_bank() -> None:
    """The events say fresh (the finish was lost); the checkpoint says ahead: refused R2."""
    timeline = [started(), node("a"), stamped(C1), resumed()]  # node b's finish was lost
    legacy = decide_resume(fold(timeline), ResumeRequest())
    assert legacy.verdict is Verdict.RESTORE  # the silent revert of N1
    decision = decide_resume(fold(timeline), ResumeRequest(checkpoint=C2))
    assert decision.refused and decision.code == SCRATCH_NOT_PORTABLE and decision.rule == "K1"
    assert "ahead" in decision.explanation


def test_K1_R7_accepting_the_loss_restores_the_stale_bank_and_says_stale() -> None:
    """A stamped stale bank with its loss accepted restores as R7, stale."""
    timeline = [started(), node("a"), stamped(C1), resumed()]
    decision = decide_resume(fold(timeline), ResumeRequest(consents=ACCEPT, checkpoint=C2))
    assert decision.verdict is Verdict.RESTORE and decision.rule == "R7" and decision.stale


def test_N2_K3_a_rewind_across_a_loop_to_the_bank_checkpoint_restores_exactly() -> None:
    """Loop passes after the bank, rewound to the bank's checkpoint: restored, not refused."""
    rewind = RunRewound(dropped_nodes=("loop",), on_cycle=("loop",))
    timeline = [started(), node("a"), stamped(C1), node("loop", on_cycle=True), rewind, resumed()]
    legacy = decide_resume(fold(timeline), ResumeRequest())
    assert legacy.refused and legacy.rule == "R2"  # refused by shape (N2)
    decision = decide_resume(fold(timeline), ResumeRequest(checkpoint=C1))
    assert decision.verdict is Verdict.RESTORE and decision.rule == "K3" and not decision.stale


def test_K2_a_branch_past_a_rewind_is_stale_though_its_count_equals_the_bank() -> None:
    """Bank at c2, resume at c3 (same length, another branch): refused K2."""
    decision = decide_resume(fold([started(), stamped(C2), resumed()]), ResumeRequest(checkpoint=C3))
    assert decision.refused and decision.rule == "K2" and decision.code == SCRATCH_NOT_PORTABLE


def test_K4_a_rewind_to_before_the_bank_restores_it_and_says_so() -> None:
    """Resume behind the bank: the bank holds every write of the checkpoint; restored K4."""
    decision = decide_resume(fold([started(), stamped(C2), resumed()]), ResumeRequest(checkpoint=C1))
    assert decision.verdict is Verdict.RESTORE and decision.rule == "K4" and not decision.stale
    assert "later checkpoint" in decision.explanation


@pytest.mark.parametrize(("bank_stamp", "at"), [(None, C2), (C1, None), (None, None)])
def test_K5_without_a_stamp_on_either_side_the_events_decide_as_before(
    bank_stamp: Checkpoint | None, at: Checkpoint | None
) -> None:
    """Unstamped bank or request: the decision is the legacy one, field for field."""
    for tail in ([], [node("b")]):
        timeline = [started(), node("a"), stamped(bank_stamp), *tail, resumed()]
        legacy = [started(), node("a"), banked(), *tail, resumed()]
        got = decide_resume(fold(timeline), ResumeRequest(checkpoint=at))
        want = decide_resume(fold(legacy), ResumeRequest())
        assert attrs.evolve(got, bank=None) == attrs.evolve(want, bank=None)


def test_A2_K_a_restore_naming_its_checkpoint_restamps_the_bank() -> None:
    """A stale bank restored at c2 with loss accepted is c2's scratch from then on."""
    restored = ScratchRestored(restored=True, stale=True, accepted=True, checkpoint=C2)
    state = fold([started(), stamped(C1), resumed(), restored])
    assert state.bank is not None and state.bank.checkpoint == C2
    assert decide_resume(state, ResumeRequest(checkpoint=C2)).rule == "K3"


def test_A2_K5_a_stale_restore_naming_no_checkpoint_drops_the_stamp() -> None:
    """Restored stale without a checkpoint: the events decide from then on; exact keeps it."""
    stale = ScratchRestored(restored=True, stale=True, accepted=True)
    assert fold([started(), stamped(C1), resumed(), stale]).bank.checkpoint is None  # type: ignore[union-attr]
    exact = ScratchRestored(restored=True, stale=False, accepted=False)
    assert fold([started(), stamped(C1), resumed(), exact]).bank.checkpoint == C1  # type: ignore[union-attr]


def test_K_wire_a_stamp_survives_the_wire_and_older_records_read_unstamped() -> None:
    """v3 banked / v2 restored carry the lineage; v2 banked and v1 restored read without one."""
    rec = stamped(C2)
    data = encode(rec)
    assert data["v"] == 3 and data["checkpoint"] == ["start", "c1", "c2"]
    assert decode(data) == rec
    restored = ScratchRestored(restored=True, stale=False, accepted=False, checkpoint=C1)
    assert decode(encode(restored)) == restored
    old = {**encode(banked()), "v": 2}
    assert decode(old) == banked()
    old_restored = {
        "type": "sandbox_scratch_restored",
        "v": 1,
        "restored": True,
        "stale": False,
        "accepted": False,
    }
    assert decode(old_restored).checkpoint is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", [[], [""], ["start", 3], "start", 7, {"id": "c1"}])
def test_A6_K_an_ill_typed_checkpoint_makes_the_timeline_unreadable(bad: object) -> None:
    """A checkpoint that is not a non-empty list of non-empty ids is unreadable, never None."""
    with pytest.raises(TimelineUnreadable, match="checkpoint"):
        decode({**encode(banked()), "checkpoint": bad}, position=3)


def test_K_wire_a_newer_version_than_this_build_is_unreadable() -> None:
    """A v4 teardown record is refused, not read as if it had no stamp."""
    with pytest.raises(TimelineUnreadable, match="newer"):
        decode({**encode(stamped(C1)), "v": 4})


def test_K_a_snapshot_keeps_the_bank_stamp_and_an_older_one_reads_the_record() -> None:
    """The stamp survives a snapshot; a 3-field bank (older snapshot) reads its record's."""
    restored = ScratchRestored(restored=True, stale=True, accepted=True, checkpoint=C2)
    state = fold([started(), stamped(C1), resumed(), restored])
    assert state_from_data(state_to_data(state)) == state
    data = state_to_data(fold([started(), stamped(C1)]))
    data["bank"] = data["bank"][:3]
    back = state_from_data(data)
    assert back is not None and back.bank is not None and back.bank.checkpoint == C1


def test_K_teardown_stamps_its_record_and_the_resume_restamps_the_restore() -> None:
    """bank_at_teardown(checkpoint=) and resume(ResumeRequest(checkpoint=)) thread the stamp."""
    timeline, store, clock = InMemoryTimeline(), InMemoryBankStore(), ManualClock()
    timeline.append("run-1", [started(), node("clone", "tool")])
    files = {"a.txt": b"one"}
    report = bank_at_teardown(
        "run-1", timeline=timeline, store=store, sandbox=FakeSandbox(dict(files)),
        run_finished=False, clock=clock, checkpoint=C1,
    )  # fmt: skip
    assert report.recorded and report.record.checkpoint == C1
    assert timeline.read("run-1")[-1] == report.record
    timeline.append("run-1", [resumed()])  # the write of c2 lost its node_finished
    before = timeline.read("run-1")
    box = FakeSandbox({})
    out = resume(
        "run-1", ResumeRequest(checkpoint=C2), timeline=timeline, store=store, sandbox=box, clock=clock
    )
    assert out.decision.rule == "K1" and not out.proceeds
    assert timeline.read("run-1") == before and box.files == {}  # the refusal changed nothing
    out = resume(
        "run-1", ResumeRequest(checkpoint=C1), timeline=timeline, store=store, sandbox=box, clock=clock
    )
    assert out.proceeds and out.decision.rule == "K3" and box.files == files
    last = timeline.read("run-1")[-1]
    assert isinstance(last, ScratchRestored) and last.restored and last.checkpoint == C1


def test_K1_the_refusal_line_names_its_rule_in_words() -> None:
    """A K1 refusal says K1 in words from the shipped rule reference; K1-K5 are all there."""
    from scratchbank.adapters.present import decision_text
    from scratchbank.adapters.rules import RULES

    decision = decide_resume(fold([started(), stamped(C1), resumed()]), ResumeRequest(checkpoint=C2))
    assert any(f"K1: {RULES['K1'].title}" in line for line in decision_text(decision))
    assert all(f"K{n}" in RULES for n in range(1, 6))
