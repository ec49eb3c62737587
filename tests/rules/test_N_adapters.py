"""Rules N: known limits, and where this project goes further. The adapters tier's tests of N3, N4, N5,
N6 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rigs.limits import RUN
from rigs.long_timelines import TAIL, long_run_with_tail
from rigs.real_sandboxes import rig

from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.bank_objects import reconcile_before_resume
from scratchbank.application.resume import current_state, resume
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import ResumeRequest, Verdict, decide_resume, fold
from scratchbank.domain.objects import reconcile, reconciled
from scratchbank.domain.records import ScratchBanked
from scratchbank.domain.teardown import TeardownAction
from scratchbank.testing.builders import node, started
from scratchbank.testing.clocks import ManualClock

# ---- from tests/rules/test_N_adapters.py: The limits the rules name (N4-N6): what is not guaranteed, and what the records say then.


def test_N4_T13_a_sandbox_that_cannot_be_frozen_banks_and_its_record_says_unquiesced() -> None:
    """N4: without a PID namespace of its own nothing is frozen, so a write during tar can go
    unseen; the record says so (`unquiesced` with its reason), never that the bank is quiet.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    sandbox = LocalSandbox(isolate=False)
    try:
        assert not sandbox.facts.process_isolated
        sandbox.run(f"mkdir -p {sandbox.facts.scratch} && echo one > {sandbox.facts.scratch}/a", [])
        timeline, store = InMemoryTimeline(), InMemoryBankStore()
        timeline.append(RUN, [started()])
        report = bank_at_teardown(RUN, timeline=timeline, store=store, sandbox=sandbox, run_finished=False)
    finally:
        sandbox.destroy()
    rec = report.record
    assert isinstance(rec, ScratchBanked) and rec.banked and report.recorded
    assert rec.unquiesced and rec.quiesce_reason, rec


def test_N5_a_sparse_file_comes_back_dense() -> None:
    """N5: a sparse file is banked as its bytes and restored with every block written: the same
    size and content, no longer sparse. Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    size = 4 * 1024 * 1024
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append(RUN, [started(), node("clone", "tool", in_sandbox=True)])
    with rig("local") as first:
        first.sh(
            f"mkdir -p {first.scratch} && truncate -s {size} {first.scratch}/sparse && echo x > {first.scratch}/x"
        )
        before = int(first.sh(f"stat -c %b {first.scratch}/sparse").strip())
        report = bank_at_teardown(
            RUN, timeline=timeline, store=store, sandbox=first.sandbox, run_finished=False
        )
        assert isinstance(report.record, ScratchBanked) and report.record.banked
    with rig("local") as second:
        out = resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=second.sandbox)
        assert out.proceeds, out
        restored = second.sh(f"stat -c '%s %b %B' {second.scratch}/sparse").split()
        zeros = second.sh(f"cmp -n {size} {second.scratch}/sparse /dev/zero && echo same").strip()
    length, blocks, unit = (int(v) for v in restored)
    assert before * 512 < size  # the source really was sparse on this filesystem
    assert length == size and zeros == "same"
    assert blocks * unit >= size  # dense: every block written


@pytest.mark.parametrize("nodes", [0, 2])
def test_N6_T1_a_scratch_on_the_host_is_not_banked_and_the_resume_goes_on_without(nodes: int) -> None:
    """N6: a runner whose scratch is the host's own folder (no sandbox between them) banks
    nothing and records nothing; its resume is neither refused nor given an old scratch.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append(RUN, [started(), *[node(f"n{i}", "tool", in_sandbox=True) for i in range(nodes)]])
    report = bank_at_teardown(
        RUN,
        timeline=timeline,
        store=store,
        sandbox=FakeSandbox({"a": b"host"}, host_backed=True),
        run_finished=False,
    )
    assert report.plan.action is TeardownAction.SKIP and store.stored == {}
    assert len(timeline.read(RUN)) == 1 + nodes
    decision = decide_resume(fold(timeline.read(RUN)), ResumeRequest())
    assert decision.verdict is Verdict.GO_ON_WITHOUT and not decision.refused


# ---- from tests/test_snapshots.py: Snapshots of the fold on the event store: same decisions, faster on long histories.


def test_N3_the_reconcile_reads_the_snapshot_and_the_tail_only(tmp_path: Path) -> None:
    """N3 on a long run with a snapshot: records read <= the tail + a constant, same outcome.
    Proves ``scratchbank.application.bank_objects.reconcile_before_resume``."""
    timeline, store, old, new = long_run_with_tail(tmp_path)
    done = reconcile_before_resume(store, timeline, "run-1", ManualClock(), 30.0, snapshots=timeline)
    assert timeline.handed <= TAIL + 2
    assert done is not None and done.found.record is not None and done.found.record.name == new
    assert done.found.unproven == () and old not in {o.name for o in done.found.others}
    records = timeline.read("run-1")
    assert isinstance(records[-1], ScratchBanked) and records[-1].object == new
    assert done.version == len(records)


def test_N3_the_reconcile_from_a_snapshot_sorts_as_from_the_whole_run(tmp_path: Path) -> None:
    """The fold's named objects (snapshot + tail) sort a listing as the whole timeline does.
    Proves ``scratchbank.application.resume.current_state``."""
    timeline, store, _, _ = long_run_with_tail(tmp_path)
    records = timeline.read("run-1")
    state = current_state(timeline, "run-1", snapshots=timeline)
    assert state == fold(records)
    assert reconciled(state, store.objects("run-1")) == reconcile(
        fold(records), records, store.objects("run-1")
    )
