"""The resume gate, rule by rule (R1-R15, S2-S4, C1-C2, C9-C10, A1-A12)."""

from __future__ import annotations

from rigs.resume_decisions import decide

from scratchbank.domain import (
    Verdict,
    fold,
)
from scratchbank.domain.records import NodeFinished
from scratchbank.testing.builders import (
    banked,
    node,
    started,
)


def test_unknown_record_types_are_passed_over() -> None:
    from scratchbank.domain import UnknownRecord

    d = decide(started(), banked(), UnknownRecord(type="llm_usage", data={"t": 1}))
    assert d.verdict is Verdict.RESTORE
    assert fold([UnknownRecord(type="x")]).unknown_records == 1


def test_node_finished_record_is_what_the_fold_reads() -> None:
    """Sanity: the builder writes the metadata fields the rules read."""
    rec = node("a", "agent", in_sandbox=True, on_cycle=True)
    assert isinstance(rec, NodeFinished) and rec.in_sandbox and rec.on_cycle
