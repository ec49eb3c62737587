"""The resume and restore use cases end to end, with fakes (R and X rules)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.resume import ResumeOutcome, resume
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import (
    SCRATCH_NOT_PORTABLE,
    Consents,
    RestoreResult,
    ResumeRequest,
    Verdict,
    Where,
    fold,
)
from scratchbank.domain.errors import BankReadFailed, StreamBroken, TimelineWriteFailed
from scratchbank.domain.records import Record, ScratchRestored
from scratchbank.testing.builders import node, started

FILES = {"verify.sh": b"#!/bin/sh\n", "clone/README": b"docs"}
ACCEPT = ResumeRequest(consents=Consents(accept_scratch_loss=True))


class World:
    """One run: a timeline, a bank store, and its sandboxes."""

    def __init__(self) -> None:
        self.timeline = InMemoryTimeline()
        self.store = InMemoryBankStore()
        self.timeline.append("run-1", [started(), node("clone", "tool")])

    def park(self, files: dict[str, bytes] | None = None) -> None:
        bank_at_teardown(
            "run-1",
            timeline=self.timeline,
            store=self.store,
            sandbox=FakeSandbox(dict(files or FILES)),
            run_finished=False,
        )

    def resume(
        self, request: ResumeRequest = ResumeRequest(), sandbox: FakeSandbox | None = None, **kw: object
    ) -> tuple[ResumeOutcome, FakeSandbox]:
        box = sandbox if sandbox is not None else FakeSandbox({})
        out = resume("run-1", request, timeline=self.timeline, store=self.store, sandbox=box, **kw)  # type: ignore[arg-type]
        return out, box

    def last(self) -> Record:
        return self.timeline.read("run-1")[-1]


def test_X1_the_bank_is_restored_before_the_first_node_and_recorded() -> None:
    w = World()
    w.park()
    out, box = w.resume()
    assert out.proceeds and box.files == FILES
    rec = w.last()
    assert isinstance(rec, ScratchRestored) and rec.restored and not rec.stale


def test_R2_a_stale_bank_is_refused_before_anything_moves_the_run() -> None:
    w = World()
    w.park()
    w.timeline.append("run-1", [node("measure", "agent")])
    before = len(w.timeline.read("run-1"))
    out, box = w.resume()
    assert out.decision.code == SCRATCH_NOT_PORTABLE and not out.proceeds
    assert len(w.timeline.read("run-1")) == before and box.files == {}
    out, box = w.resume(ACCEPT)
    assert out.proceeds and box.files == FILES
    rec = w.last()
    assert isinstance(rec, ScratchRestored) and rec.stale and rec.accepted


def test_R10_the_surface_defers_while_the_latest_execution_may_still_bank() -> None:
    w = World()
    out, _ = w.resume(ResumeRequest(where=Where.SURFACE))
    assert out.decision.verdict is Verdict.DEFER_TO_ENGINE and not out.proceeds


def test_X4_a_bank_that_is_gone_parks_scratch_not_portable_and_holds() -> None:
    w = World()
    w.park()
    w.store.banks.clear()
    out, _ = w.resume()
    assert out.restore is not None and out.restore.park is not None
    assert out.restore.park.code == SCRATCH_NOT_PORTABLE and out.restore.hold
    assert fold(w.timeline.read("run-1")).hold is not None
    out, box = w.resume(ACCEPT)
    assert out.proceeds and box.files == {}
    assert fold(w.timeline.read("run-1")).forsaken is not None


def test_X4_a_resume_without_a_sandbox_parks_scratch_not_portable() -> None:
    w = World()
    w.park()
    out = resume("run-1", ResumeRequest(), timeline=w.timeline, store=w.store, sandbox=None)
    assert out.restore is not None and out.restore.park is not None
    assert out.restore.park.code == SCRATCH_NOT_PORTABLE


def test_X4_a_bank_replaced_without_its_record_is_never_restored_as_recorded() -> None:
    """The banking process was killed between the upload and the record (N3)."""
    w = World()
    w.park()
    w.timeline.append("run-1", [])
    other = World()
    other.park({"other": b"unrecorded"})
    w.store.banks["run-1"] = other.store.banks["run-1"]
    out, box = w.resume()
    assert out.restore is not None and out.restore.park is not None
    assert "BANK_MISMATCH" in out.restore.record.reason and box.files == {}
    w.store.sweep("run-1")
    assert "run-1" not in w.store.banks  # swept with the run


def test_X4_the_sandbox_refusing_the_bank_parks_with_the_code() -> None:
    from scratchbank.domain.errors import RestoreRefused

    w = World()
    w.park()
    box = FakeSandbox({})
    box.faults["restore"] = [RestoreRefused("disk full")]
    out, _ = w.resume(sandbox=box)
    assert out.restore is not None and out.restore.park is not None
    assert out.restore.park.code == SCRATCH_NOT_PORTABLE
    assert "disk full" in out.restore.record.reason


@pytest.mark.parametrize("fault", ["store", "stream"])
def test_X5_a_failed_read_parks_without_a_code_and_consent_does_not_skip_it(fault: str) -> None:
    w = World()
    w.park()
    box = FakeSandbox({})
    for request in (ResumeRequest(), ACCEPT):
        if fault == "store":
            w.store.fetch = _failing_fetch  # type: ignore[method-assign]
        else:
            box.faults["restore"] = [StreamBroken("kubectl exited 0 short")]
        out, _ = w.resume(request, sandbox=box)
        assert out.restore is not None and out.restore.park is not None
        assert out.restore.park.code is None and not out.proceeds


def _failing_fetch(*args: object, **kwargs: object) -> None:
    raise BankReadFailed("503 Slow Down")


def test_X2_a_partial_restore_is_refused_by_name() -> None:
    class Lossy(FakeSandbox):
        def staged_lines(self, tree: dict[str, tuple[str, bytes]]) -> list[str]:
            return super().staged_lines(tree)[:-1]  # a file lost on the way

    w = World()
    w.park()
    out, _ = w.resume(sandbox=Lossy({}))
    assert out.restore is not None and out.restore.park is not None
    assert "partial restore" in out.restore.record.reason


def test_X6_a_restore_into_a_host_directory_hands_the_scratch_over(tmp_path: Path) -> None:
    w = World()
    w.park()
    target = tmp_path / "host-scratch"
    out = resume(
        "run-1", ResumeRequest(), timeline=w.timeline, store=w.store, sandbox=None, host_directory=target
    )
    assert out.proceeds and (target / "clone/README").read_bytes() == b"docs"
    rec = w.last()
    assert isinstance(rec, ScratchRestored) and rec.host_backed
    w.timeline.append("run-1", [node("edit", "agent")])
    out2, _ = w.resume()
    assert out2.decision.verdict is Verdict.GO_ON_WITHOUT and out2.decision.rule == "X6"


def test_X7_a_stale_restore_whose_record_cannot_land_fails_without_a_code() -> None:
    w = World()
    w.park()
    w.timeline.append("run-1", [node("measure")])

    class Failing(InMemoryTimeline):
        calls = 0

        def append(self, run_id, records, *, expected=None):  # type: ignore[no-untyped-def]
            Failing.calls += 1
            if Failing.calls > 1:
                raise TimelineWriteFailed("down")
            return w.timeline.append(run_id, records, expected=expected)

        def read(self, run_id):  # type: ignore[no-untyped-def]
            return w.timeline.read(run_id)

    class Instant:
        now = 0.0

        def monotonic(self) -> float:
            return self.now

        def sleep(self, s: float) -> None:
            self.now += s

    out = resume("run-1", ACCEPT, timeline=Failing(), store=w.store, sandbox=FakeSandbox({}), clock=Instant())
    assert out.restore is not None and out.restore.must_record
    assert not out.recorded and not out.proceeds
    # the next resume restores the bank again: the stale restore was never recorded
    out2, box = w.resume(ACCEPT)
    assert out2.proceeds and box.files == FILES


def test_R13_accepting_an_unbanked_loss_records_it_and_goes_on() -> None:
    w = World()
    bank_at_teardown(
        "run-1",
        timeline=w.timeline,
        store=InMemoryBankStore(keeps_banks=False),
        sandbox=FakeSandbox(dict(FILES)),
        run_finished=False,
    )
    out, _ = w.resume()
    assert out.decision.code == SCRATCH_NOT_PORTABLE and out.decision.rule == "R1"
    out, box = w.resume(ACCEPT)
    assert out.proceeds and box.files == {}
    rec = w.last()
    assert isinstance(rec, ScratchRestored) and rec.accepted and "keeps no bank" in rec.reason


def test_restore_result_names_are_stable() -> None:
    assert {r.value for r in RestoreResult} >= {"restored", "gone", "stream_broken"}
