"""Rules N: known limits, and where this project goes further. The engines tier's tests of N3
(tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

from pathlib import Path

from rigs.bank_store_hooks import (
    ACCEPT,
    NEW,
    OLD,
    RUN,
    FullDisk,
    _park_with_a_failed_record,
    archive_of,
    store,  # noqa: F401 - a fixture
    teardown,
)

from scratchbank.adapters.memory import FakeSandbox, InMemoryTimeline
from scratchbank.adapters.present import status_data, status_text
from scratchbank.application.ports import BankStore
from scratchbank.application.resume import resume
from scratchbank.application.service import ScratchService
from scratchbank.domain import ResumeRequest
from scratchbank.domain.errors import BankUnrecorded
from scratchbank.domain.objects import BankStamp, object_name
from scratchbank.domain.records import ScratchBanked
from scratchbank.testing.builders import started
from scratchbank.testing.clocks import ManualClock

# ---- from tests/rules/test_[AN]*.py: Banks as content-named, create-only objects the record names (A17), and reconciliation (N3).


def test_N3_the_latest_executions_unrecorded_bank_is_recorded_and_restored(store: BankStore) -> None:
    """Stamped by the latest execution, nothing after it: the resume records it and restores it.
    Proves ``scratchbank.application.resume.resume``."""
    timeline = FullDisk()
    lost = _park_with_a_failed_record(timeline, store)
    box = FakeSandbox({})
    out = resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=box)
    assert out.proceeds and box.files == NEW
    reconciled = [r for r in timeline.read(RUN) if isinstance(r, ScratchBanked)]
    assert [r.object for r in reconciled] == [lost.object] and "reconciled (N3)" in reconciled[0].reason


def test_N3_an_unrecorded_bank_that_cannot_be_proved_refuses_the_resume_by_name(
    store: BankStore, tmp_path: Path
) -> None:
    """Two unrecorded banks stamped by the latest execution: refused by name, nothing written
    or deleted; accepting the scratch's loss goes on without them.
    Proves ``scratchbank.application.resume.resume``."""
    timeline = FullDisk()
    first = _park_with_a_failed_record(timeline, store)
    other, digest = archive_of(OLD, tmp_path)
    store.put(RUN, other, sha256=digest, stamp=BankStamp(RUN, "@0", other.stat().st_size, digest))
    before = (tuple(timeline.read(RUN)), tuple(store.objects(RUN)))
    out = resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({}))
    assert out.decision.refused and out.decision.code == BankUnrecorded.code and out.decision.rule == "N3"
    assert first.object in out.decision.explanation and object_name(digest) in out.decision.explanation
    assert (tuple(timeline.read(RUN)), tuple(store.objects(RUN))) == before
    out = resume(RUN, ACCEPT, timeline=timeline, store=store, sandbox=FakeSandbox({}))
    assert out.proceeds


def test_N3_an_earlier_executions_unrecorded_bank_is_never_reconciled(
    store: BankStore, tmp_path: Path
) -> None:
    """A bank stamped by an execution that is not the latest stays unreferenced: shown, not restored.
    Proves ``scratchbank.application.resume.resume``."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    assert teardown(timeline, store, NEW).recorded
    assert resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({})).proceeds
    stray, digest = archive_of(OLD, tmp_path)
    store.put(RUN, stray, sha256=digest, stamp=BankStamp(RUN, "@0", stray.stat().st_size, digest))
    status = ScratchService(timeline, store, clock=ManualClock()).status(RUN)  # type: ignore[arg-type]
    assert status.unreferenced is not None and status.unreferenced.record is None
    assert [o.name for o in status.unreferenced.others] == [object_name(digest)]
    data = status_data(status)["unreferenced"]
    assert data["objects"][0]["object"] == object_name(digest) and data["objects"][0]["execution"] == "@0"
    assert any(object_name(digest) in line for line in status_text(status))
