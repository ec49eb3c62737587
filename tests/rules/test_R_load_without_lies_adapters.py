"""Rules R: the resume gate: refuse or go on, before anything moves. The adapters tier's tests of R15
(tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold). These sit apart from test_R_adapters.py: a name of theirs (a test's or a
fixture's) is another test's there."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rigs.landed_records import FILES, N

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.memory import FakeSandbox
from scratchbank.application.resume import Target
from scratchbank.application.service import ScratchService
from scratchbank.domain.records import ScratchBanked, ScratchRestored
from scratchbank.testing.builders import node, started

# ---- from tests/test_load_without_lies.py: Issue 26: load without lies. A report says ``recorded`` only for a record known to have landed; a busy timeline waits for a call slot and is never read as unreadable (R15).


def test_R15_200_teardowns_and_resumes_at_once_on_sqlite_none_refused_none_falsely_recorded(
    tmp_path: Path,
) -> None:
    """200 threads at once on one SQLite file: no refusal, every `recorded` on the timeline.
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline``."""
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/timeline.db")
    service = ScratchService(timeline, FilesystemBankStore(tmp_path / "banks"), snapshots=timeline)
    runs = [f"run-{i}" for i in range(N)]
    for run in runs:
        timeline.append(run, [started(), node("clone", "tool")])
    barrier = threading.Barrier(N)

    def one(run: str) -> tuple[bool, bool, bool, str]:
        barrier.wait()
        report = service.bank_at_teardown(run, FakeSandbox(dict(FILES)), run_finished=False)
        out = service.resume(run, target=Target(sandbox=FakeSandbox({})))
        return report.recorded, out.recorded, out.proceeds, out.decision.rule

    with ThreadPoolExecutor(N) as pool:
        results = dict(zip(runs, pool.map(one, runs), strict=True))
    refused = {run: r[3] for run, r in results.items() if not r[2]}
    assert refused == {}
    for run, (banked, restored, _, _) in results.items():
        records = timeline.read(run)
        assert banked == any(isinstance(r, ScratchBanked) for r in records), run
        assert restored == any(isinstance(r, ScratchRestored) for r in records), run
    assert all(r[0] and r[1] for r in results.values())
