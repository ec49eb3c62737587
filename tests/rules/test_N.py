"""Rules N: known limits, and where this project goes further. The pure tier's tests of N1, N2
(tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from rigs.checkpoint_stamps import C1, C2, loop, rewind_replaying, stamped
from rigs.rewind_model import EVENTS, _records

from scratchbank.domain import SCRATCH_NOT_PORTABLE, ResumeRequest, Verdict, decide_resume, fold
from scratchbank.domain.fold import ScratchState, step
from scratchbank.domain.records import RunRewound
from scratchbank.domain.snapshot import state_from_data, state_to_data
from scratchbank.testing.builders import banked, node, resumed, rewound, started

# ---- from tests/rules/test_[KN]*.py: Attacks on K9 (a rewind's replay read from the timeline) and K8's retention setting.


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, max_size=14), st.integers(0, 14))
def test_N2_K9_the_fold_restores_exactly_when_the_model_says_every_write_was_taken_back(
    events: list[tuple[Any, ...]], cut: int
) -> None:
    """Generated loops, fan-outs, nested rewinds, never-run passes, restores, consents: restore iff no write survives.
    Proves ``scratchbank.domain.decide_resume``."""
    records, model = _records(events)
    records.append(resumed())
    state = fold(records)
    decision = decide_resume(state, ResumeRequest())
    if model is None:
        return
    if model.writes:
        assert decision.refused, (records, model)
    else:
        assert decision.verdict is Verdict.RESTORE and not decision.refused, (records, decision)
    cut = min(cut, len(records))
    snap = state_from_data(state_to_data(fold(records[:cut])))
    assert snap is not None
    resumed_state: ScratchState = snap
    for record in records[cut:]:
        resumed_state = step(resumed_state, record)
    assert resumed_state == state  # a snapshot mid-loop, then more passes, folds as the whole


# ---- from tests/test_rules_checkpoints.py: Checkpoint stamps (ADR 0013): staleness read from the checkpoint itself (N1, N2, K1-K5).


def test_N1_K1_a_lost_node_finished_no_longer_hides_a_stale_bank() -> None:
    """The events say fresh (the finish was lost); the checkpoint says ahead: refused R2.
    Proves ``scratchbank.domain.decide_resume``."""
    timeline = [started(), node("a"), stamped(C1), resumed()]  # node b's finish was lost
    legacy = decide_resume(fold(timeline), ResumeRequest())
    assert legacy.verdict is Verdict.RESTORE  # the silent revert of N1
    decision = decide_resume(fold(timeline), ResumeRequest(checkpoint=C2))
    assert decision.refused and decision.code == SCRATCH_NOT_PORTABLE and decision.rule == "K1"
    assert "ahead" in decision.explanation


def test_N2_K3_a_rewind_across_a_loop_to_the_bank_checkpoint_restores_exactly() -> None:
    """Loop passes after the bank, rewound to the bank's checkpoint: restored, not refused.
    Proves ``scratchbank.domain.decide_resume``."""
    rewind = RunRewound(dropped_nodes=("loop",), on_cycle=("loop",))
    timeline = [started(), node("a"), stamped(C1), node("loop", on_cycle=True), rewind, resumed()]
    legacy = decide_resume(fold(timeline), ResumeRequest())
    assert legacy.refused and legacy.rule == "R2"  # refused by shape (N2)
    decision = decide_resume(fold(timeline), ResumeRequest(checkpoint=C1))
    assert decision.verdict is Verdict.RESTORE and decision.rule == "K3" and not decision.stale


def test_N2_K9_a_rewind_replaying_every_loop_pass_after_the_bank_restores_without_stamps() -> None:
    """Loop pass 2 wrote after the bank; the rewind replays pass 2: restored, K9, not refused by shape.
    Proves ``scratchbank.domain.decide_resume``."""
    shape = [started(), loop(1), banked(), loop(2), rewound("loop", on_cycle=("loop",)), resumed()]
    assert decide_resume(fold(shape), ResumeRequest()).rule == "R2"  # v1 rewind: refused by shape
    timeline = [started(), loop(1), banked(), loop(2), rewind_replaying(loop=[2]), resumed()]
    decision = decide_resume(fold(timeline), ResumeRequest())
    assert decision.verdict is Verdict.RESTORE and decision.rule == "K9" and not decision.stale
    assert "#5 run_rewound" in decision.explanation
