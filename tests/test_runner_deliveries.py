"""The runner on the embedded default: deliveries, consents, refusals (C3-C8, R10-R12, L4).

Real parts: local sandboxes (a PID namespace each), banks on disk, the reference
engine's shell nodes, the in-process queue and lease, an in-memory timeline.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from runner_rigs import make_rig, queue_resume, types

from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.runner import Handled
from scratchbank.domain.records import (
    NodeFinished,
    RunStarted,
    ScratchRestored,
)


def _start(rig_tl: InMemoryTimeline, run: str = "run-1") -> None:
    rig_tl.append(run, [RunStarted()])


def test_story_a_run_parks_banks_and_goes_on_with_its_scratch_restored(tmp_path: Path) -> None:
    """Queued, claimed, run to its gate and banked; resumed on a new sandbox, restored, finished."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    _start(tl)
    runner = rig.runner()
    queue_resume(tl, rig.queue, "run-1", "a1")
    first = runner.run_once(1)
    assert first is not None and first.handled is Handled.RAN
    assert first.teardown is not None
    assert first.teardown.record.banked
    queue_resume(tl, rig.queue, "run-1", "a2")
    second = runner.run_once(1)
    assert second is not None and second.handled is Handled.RAN, second.detail
    records = tl.read("run-1")
    restored = [r for r in records if isinstance(r, ScratchRestored)]
    assert restored and restored[-1].restored
    measured = [r for r in records if isinstance(r, NodeFinished) and r.node == "measure"]
    assert measured and measured[0].succeeded and measured[0].in_sandbox is True  # it read the restored clone
    assert types(records).count("lease_taken") == 2
    assert rig.queue.pending() == 0  # type: ignore[attr-defined]


def test_story_the_demo_tells_the_runner_story_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    """`scratchbank demo`: park and bank, restore, R2 heard (R11) and logged (R12), R7, S1/S5, S2/S4."""
    from scratchbank.adapters.demo import run_demo

    assert run_demo() == 0
    out = capsys.readouterr().out
    assert "sandbox 2 now holds: clone/README.md, verify.sh" in out
    assert "the run's log (R12): SCRATCH_NOT_PORTABLE (R2): relaunch the run fresh" in out
    assert "resume: RESTORE (R7: an accepted loss forsakes the bank)" in out
    assert "(S1): 0 records, never ran there" in out and "(1 sandbox_shared, S5)" in out
    assert "REFUSE SCRATCH_NOT_PORTABLE (S2: " in out and "scratch_forsaken records: 1" in out
    assert "RESTORE (K6: " in out and "the resumed sandbox's scratch says 'draft 1'" in out  # a rewind
    for run in ("run-1", "run-1.fix", "run-1.ask"):  # the run ids, and how to inspect each afterwards
        assert f"status {run} " in out
