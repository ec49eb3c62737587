"""Checkpoint stamps on banks and rewinds, and a service's kept flags.

First written for tests/test_rules_checkpoints.py: Checkpoint stamps (ADR 0013): staleness read from
the checkpoint itself (N1, N2, K1-K5)."""

from __future__ import annotations

import attrs

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.service import ScratchService
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import Consents
from scratchbank.domain.checkpoints import Checkpoint
from scratchbank.domain.records import Record, RunRewound, ScratchBanked
from scratchbank.testing.builders import banked, node, resumed, started
from scratchbank.testing.clocks import ManualClock

C1 = Checkpoint(("start", "c1"))


C2 = Checkpoint(("start", "c1", "c2"))


C3 = Checkpoint(("start", "c1", "c3"))


ACCEPT = Consents(accept_scratch_loss=True)


def stamped(checkpoint: Checkpoint | None) -> ScratchBanked:
    return attrs.evolve(banked(), checkpoint=checkpoint)


C4 = Checkpoint(("start", "c1", "c2", "c4"))


C5 = Checkpoint(("start", "c1", "c2", "c4", "c5"))


def bank_at(checkpoint: Checkpoint, digit: str) -> ScratchBanked:
    """A stamped bank whose object is its own (distinct content per checkpoint)."""
    sha = digit * 64
    return attrs.evolve(banked(sha256=sha), checkpoint=checkpoint, object=f"banks/{sha}.tgz")


def checkpoints_run() -> list[Record]:
    """Banks taken at c1 (#2) and c2 (#5): the run stands past c2."""
    return [started(), bank_at(C1, "1"), resumed(), node("b"), bank_at(C2, "2"), resumed()]


def _teardown(
    timeline: InMemoryTimeline,
    store: InMemoryBankStore,
    files: dict[str, bytes],
    at: Checkpoint,
    retain: int = 5,
) -> None:
    report = bank_at_teardown(
        "run-1", timeline=timeline, store=store, sandbox=FakeSandbox(dict(files)),
        run_finished=False, clock=ManualClock(), checkpoint=at, retain=retain,
    )  # fmt: skip
    assert report.recorded
    timeline.append("run-1", [resumed()])


def loop(pass_: int, name: str = "loop") -> Record:
    return attrs.evolve(node(name, on_cycle=True), pass_=pass_)


def rewind_replaying(**replayed: list[int]) -> RunRewound:
    nodes = tuple(replayed)
    return RunRewound(dropped_nodes=nodes, on_cycle=nodes, replayed=replayed)


URLS = {
    "SCRATCHBANK_TIMELINE": "sqlite:///tmp/sb-unused/timeline.db",
    "SCRATCHBANK_BANK": "file:///tmp/sb-unused",
}


def kept_flags(service: ScratchService) -> list[bool]:
    from scratchbank.adapters.present import status_data, status_text

    banks = status_data(service.status("run-1"))["state"]["checkpoint_banks"]
    swept = [line for line in status_text(service.status("run-1")) if "past retention" in line]
    assert len(swept) == [b["kept"] for b in banks].count(False)
    return [b["kept"] for b in banks]
