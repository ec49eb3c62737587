"""The teardown use case over fakes: flaky stores and timelines, sandboxes claimed during banking or
allowed one call.

First written for tests/test_teardown_use_case.py: The teardown banking use case under faults, with
fakes (T1-T20). Each test names the expected outcome and checks that nothing was lost."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.cancellation import Deadline
from scratchbank.application.ports import QuiescedArchive
from scratchbank.application.teardown import (
    Budgets,
    bank_at_teardown,
)
from scratchbank.domain.errors import (
    ArchiveFailed,
    BankWriteFailed,
    ExecFailed,
    TimelineWriteFailed,
)
from scratchbank.domain.objects import BankStamp
from scratchbank.domain.records import Record, ScratchBanked
from scratchbank.testing.builders import started
from scratchbank.testing.clocks import ManualClock

FILES = {"verify.sh": b"#!/bin/sh\nexit 0\n", "measure.json": b'{"floor": 12}'}


FakeClock = ManualClock


class FlakyStore(InMemoryBankStore):
    def __init__(self, fail_puts: int = 0) -> None:
        super().__init__()
        self.fail_puts = fail_puts
        self.put_digests: list[str] = []

    def put(
        self,
        run_id: str,
        archive: Path,
        *,
        sha256: str,
        stamp: BankStamp | None = None,
        deadline: Deadline | None = None,
    ) -> str:
        self.put_digests.append(hashlib.sha256(archive.read_bytes()).hexdigest())
        if self.fail_puts:
            self.fail_puts -= 1
            raise BankWriteFailed("store blip")
        return super().put(run_id, archive, sha256=sha256, stamp=stamp, deadline=deadline)


class FlakyTimeline(InMemoryTimeline):
    def __init__(self, clock: FakeClock, fail_appends: int = 0) -> None:
        super().__init__()
        self.clock, self.fail_appends = clock, fail_appends

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        if self.fail_appends:
            self.fail_appends -= 1
            raise TimelineWriteFailed("store failing over")
        return super().append(run_id, records, expected=expected)


def teardown(
    sandbox: FakeSandbox,
    *,
    history: Sequence[Record] = (started(),),
    store: InMemoryBankStore | None = None,
    timeline: InMemoryTimeline | None = None,
    clock: FakeClock | None = None,
    finished: bool = False,
    **budgets: object,
):  # type: ignore[no-untyped-def]
    clock = clock or FakeClock()
    timeline = timeline if timeline is not None else InMemoryTimeline()
    store = store if store is not None else InMemoryBankStore()
    timeline.append("run-1", list(history))
    report = bank_at_teardown(
        "run-1",
        timeline=timeline,
        store=store,
        sandbox=sandbox,
        run_finished=finished,
        budgets=Budgets(**budgets),
        clock=clock,  # type: ignore[arg-type]
    )
    return report, timeline, store


def last_record(timeline: InMemoryTimeline) -> ScratchBanked:
    rec = timeline.read("run-1")[-1]
    assert isinstance(rec, ScratchBanked)
    return rec


class ClaimedDuringBanking(FakeSandbox):
    """While tar reads, another execution claims the run (a resume the engine allowed)."""

    def __init__(self, timeline: InMemoryTimeline, claim: Record) -> None:
        super().__init__(dict(FILES))
        self.timeline, self.claim = timeline, claim

    def archive(self, dest, *, compress, verify, deadline=None):  # type: ignore[no-untyped-def]
        self.timeline.append("run-1", [self.claim])
        return super().archive(dest, compress=compress, verify=verify, deadline=deadline)


class OneCallSandbox(FakeSandbox):
    """A fake with its own ``quiesce_and_archive``, as bank.sh behaves: it continues the
    processes itself after a pass that did not race; ``calls`` logs what the host asked."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(files)
        self.calls: list[str] = []
        self.verified: list[bool] = []

    def quiesce_and_archive(self, dest, *, budget_seconds, wait_seconds, compress, deadline=None):  # type: ignore[no-untyped-def]
        self.calls.append("bank")
        report = FakeSandbox.quiesce(self, budget_seconds=budget_seconds, wait_seconds=wait_seconds)
        try:
            archived = FakeSandbox.archive(self, dest, compress=compress, verify=not report.quiesced)
        except ArchiveFailed as error:
            return QuiescedArchive(report, None, report.refused, error)
        if report.refused or archived.raced:
            return QuiescedArchive(report, archived, report.refused)
        self.stopped = False
        return QuiescedArchive(report, archived, True)

    def archive(self, dest, *, compress, verify, deadline=None):  # type: ignore[no-untyped-def]
        self.calls.append("archive")
        self.verified.append(verify)
        return super().archive(dest, compress=compress, verify=verify, deadline=deadline)

    def continue_processes(self, *, deadline: Deadline | None = None) -> None:
        self.calls.append("continue")
        super().continue_processes(deadline=deadline)


class StuckContinue(OneCallSandbox):
    """A continue that hangs until its deadline cuts it (a transport honouring it)."""

    def continue_processes(self, *, deadline: Deadline | None = None) -> None:
        self.calls.append("continue")
        assert deadline is not None and deadline.cancel is not None
        deadline.cancel.wait(30.0)  # the scope's cut; 30 s is a safety net only
        raise ExecFailed("the exec did not end within its deadline: cut")
