"""Teardown banking (T1-T20): quiesce, archive to a host file, store, record.

It runs when things are already going wrong, so every step has a budget of its own
and every failure is tried again where a retry can cure it (T8), on the same archive
for an upload (T10). What a try saw is merged with earlier tries by the domain, which
never lets a later try record less (T9, A7). The processes the quiesce stopped are
continued on their own budget whatever happens (T14), and the whole thing ignores
the run's own cancellation (T7): ``bank_at_teardown_async`` shields it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import attrs

from scratchbank.domain.errors import (
    ArchiveFailed,
    BankWriteFailed,
    ExecFailed,
    SandboxGone,
    StreamBroken,
    TimelineUnreadable,
)
from scratchbank.domain.fold import ScratchState, fold
from scratchbank.domain.records import ScratchBanked
from scratchbank.domain.teardown import (
    CAP_BYTES,
    Archive,
    Quiesce,
    Seen,
    TeardownAction,
    TeardownPlan,
    TryOutcome,
    finished_record,
    merge_try,
    over_cap,
    plan_teardown,
    should_retar,
    teardown_record,
)

from .clock import Clock, SystemClock
from .host_archive import ArchiveFacts, HostArchive
from .ports import BankStore, QuiesceReport, Sandbox, Timeline
from .recording import append_within_budget


@attrs.frozen
class Budgets:
    """The ADR's defaults (RULES.md, facts): override per deployment."""

    banking_seconds: float = 300.0
    bank_tries: int = 3
    first_pause: float = 1.0
    upload_tries: int = 3
    record_seconds: float = 30.0
    record_pause_cap: float = 8.0
    continue_seconds: float = 30.0
    quiesce_wait_seconds: int = 5
    cap_bytes: int = CAP_BYTES
    compress_in_sandbox: bool = False
    gzip_level: int = 1  # ADR 0003: the fastest bank, +0.8-4% bytes


@attrs.frozen
class TeardownReport:
    plan: TeardownPlan
    record: ScratchBanked | None = None
    recorded: bool = False
    tries: tuple[TryOutcome, ...] = ()
    quiesce: QuiesceReport | None = None
    uploads: int = 0
    tar_passes: int = 0
    notes: tuple[str, ...] = ()


@attrs.define
class _Run:
    run_id: str
    timeline: Timeline
    store: BankStore
    sandbox: Sandbox
    budgets: Budgets
    clock: Clock
    work: Path
    deadline: float
    notes: list[str] = attrs.Factory(list)
    uploads: int = 0
    tar_passes: int = 0
    quiesce: Quiesce | None = None
    report: QuiesceReport | None = None

    def left(self) -> float:
        return self.deadline - self.clock.monotonic()


def _read_state(timeline: Timeline, run_id: str, notes: list[str]) -> ScratchState:
    try:
        return fold(timeline.read(run_id))
    except TimelineUnreadable as error:
        # Banking more is never wrong; a hold we cannot read is not honoured.
        notes.append(f"timeline unreadable at teardown, banking anyway: {error.message}")
        return ScratchState()


def bank_at_teardown(
    run_id: str,
    *,
    timeline: Timeline,
    store: BankStore,
    sandbox: Sandbox,
    run_finished: bool,
    budgets: Budgets = Budgets(),
    clock: Clock | None = None,
) -> TeardownReport:
    """Bank (or drop) the scratch of a sandbox being torn down, and record what happened."""
    clock = clock or SystemClock()
    notes: list[str] = []
    state = _read_state(timeline, run_id, notes)
    facts = sandbox.facts
    plan = plan_teardown(
        state,
        scratch_host_backed=facts.host_backed,
        process_isolated=facts.process_isolated,
        run_finished=run_finished,
    )
    if plan.action is TeardownAction.SKIP:
        return TeardownReport(plan, notes=tuple(notes))
    if plan.action is TeardownAction.DROP:
        try:
            store.delete(run_id)
        except BankWriteFailed as error:
            notes.append(f"could not delete the finished run's bank: {error.message}")
        record = finished_record()
        recorded = _record(timeline, run_id, record, budgets, clock, notes)
        return TeardownReport(plan, record, recorded, notes=tuple(notes))
    work = Path(tempfile.mkdtemp(prefix="scratchbank-bank-"))
    run = _Run(
        run_id,
        timeline,
        store,
        sandbox,
        budgets,
        clock,
        work,
        clock.monotonic() + budgets.banking_seconds,
        notes,
    )
    try:
        tries, best = _tries(run, plan)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if best.seen is Seen.EMPTY:
        try:
            store.delete(run_id)  # T4
        except BankWriteFailed as error:
            notes.append(f"could not delete the previous bank: {error.message}")
    quiesce = run.quiesce or Quiesce(False, facts.isolation)
    record = teardown_record(best, quiesce)
    recorded = _record(timeline, run_id, record, budgets, clock, notes)
    return TeardownReport(
        plan, record, recorded, tuple(tries), run.report, run.uploads, run.tar_passes, tuple(notes)
    )


def _tries(run: _Run, plan: TeardownPlan) -> tuple[list[TryOutcome], TryOutcome]:
    """Try until the domain says stop (T8, T9, A7); return every try and the best one."""
    tries: list[TryOutcome] = []
    best: TryOutcome | None = None
    pause = run.budgets.first_pause
    for attempt in range(run.budgets.bank_tries):
        outcome, final = _one_try(run, plan, attempt)
        tries.append(outcome)
        merged = merge_try(best, outcome)
        best = merged.best
        if merged.stop or final or run.left() <= pause:
            break
        run.clock.sleep(pause)
        pause *= 2
    assert best is not None
    return tries, best


def _one_try(run: _Run, plan: TeardownPlan, attempt: int) -> tuple[TryOutcome, bool]:
    """One try: quiesce, archive (again while it races), continue, upload. (outcome, final?)"""
    try:
        if plan.quiesce:
            _quiesce(run)
        try:
            archived = _archive(run, attempt)
        finally:
            if plan.quiesce:
                _continue(run)
    except SandboxGone as error:
        return TryOutcome(Seen.UNKNOWN, reason=f"the sandbox is gone: {error.message}"), False
    except (ExecFailed, StreamBroken) as error:
        return TryOutcome(Seen.UNKNOWN, reason=f"exec failed: {error.message}"), False
    except ArchiveFailed as error:
        return TryOutcome(Seen.FILES, reason=f"tar failed: {error.message}"), False
    if archived is None:
        return TryOutcome(Seen.EMPTY), True
    facts, raced = archived
    archive = Archive(
        facts.bytes,
        facts.sha256,
        raced,
        facts.manifest.entries if facts.manifest else None,
        facts.manifest.bytes if facts.manifest else None,
        facts.manifest.sha256 if facts.manifest else None,
    )
    if facts.refused:
        return TryOutcome(Seen.FILES, archive, reason=f"refused on the host: {facts.refused}"), False
    if over_cap(facts.bytes, run.budgets.cap_bytes):
        why = f"over the {run.budgets.cap_bytes >> 20} MiB cap ({facts.bytes} bytes compressed)"
        return TryOutcome(Seen.FILES, archive, reason=why), True
    if not run.store.keeps_banks:
        return TryOutcome(Seen.FILES, archive, reason="the bank store keeps no bank"), True
    stored, why = _upload(run, facts)
    reason = f"{len(raced)} member(s) raced tar" if raced else ""
    return TryOutcome(Seen.FILES, archive, stored=stored, reason=why or reason), False


def _quiesce(run: _Run) -> None:
    budget = max(1, int(run.left()) + int(run.budgets.continue_seconds))
    report = run.sandbox.quiesce(budget_seconds=budget, wait_seconds=run.budgets.quiesce_wait_seconds)
    run.report = report
    run.quiesce = Quiesce(report.quiesced, "; ".join(report.reasons))


def _continue(run: _Run) -> None:
    """T14: continue on a budget of its own, never holding the sandbox's shutdown."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(run.sandbox.continue_processes)
    try:
        future.result(timeout=run.budgets.continue_seconds)
    except Exception as error:  # the watchdog in the sandbox continues them anyway
        run.notes.append(f"continuing processes failed ({error}); the watchdog will")
    finally:
        pool.shutdown(wait=False)


def _archive(run: _Run, attempt: int) -> tuple[ArchiveFacts, tuple[str, ...]] | None:
    """Archive to a host file; run tar again while it races and budget allows (T16)."""
    verify = not (run.quiesce and run.quiesce.quiesced)
    last: tuple[ArchiveFacts, tuple[str, ...]] | None = None
    passes = 0
    while True:
        path = run.work / f"try{attempt}-pass{passes}.tgz"
        sink = HostArchive(
            path,
            gzipped_input=run.budgets.compress_in_sandbox,
            gzip_level=run.budgets.gzip_level,
            cap=run.budgets.cap_bytes,
        )
        started = run.clock.monotonic()
        try:
            report = run.sandbox.archive(sink, compress=run.budgets.compress_in_sandbox, verify=verify)
        except ArchiveFailed:
            sink.close()
            if last is not None:
                return last  # T16: the last complete archive is kept
            raise
        except BaseException:
            sink.close()
            raise
        facts = sink.finish()
        passes += 1
        run.tar_passes += 1
        if report.empty:
            return None
        last = (facts, report.raced)
        took = run.clock.monotonic() - started
        if not should_retar(
            raced=bool(report.raced), passes=passes, last_pass_seconds=took, seconds_left=run.left()
        ):
            return last


def _upload(run: _Run, facts: ArchiveFacts) -> tuple[bool, str]:
    """T10: retry the upload on the same archive file."""
    pause = run.budgets.first_pause
    why = ""
    for _ in range(run.budgets.upload_tries):
        try:
            run.uploads += 1
            run.store.put(run.run_id, facts.path, sha256=facts.sha256)
            return True, ""
        except BankWriteFailed as error:
            why = f"upload failed: {error.message}"
            if run.left() <= pause:
                break
            run.clock.sleep(pause)
            pause *= 2
    return False, why


def _record(
    timeline: Timeline,
    run_id: str,
    record: ScratchBanked,
    budgets: Budgets,
    clock: Clock,
    notes: list[str],
) -> bool:
    """T8: the record is tried again until its own budget runs out (a store failover)."""
    why = append_within_budget(
        timeline,
        run_id,
        [record],
        clock=clock,
        budget=budgets.record_seconds,
        first_pause=budgets.first_pause,
        pause_cap=budgets.record_pause_cap,
    )
    if why is not None:
        notes.append(f"the record was not written within its budget: {why}")
    return why is None


async def bank_at_teardown_async(**kwargs: object) -> TeardownReport:
    """T7: runs to its own budgets even when the awaiting task (the run) is cancelled."""
    loop = asyncio.get_running_loop()
    call: Callable[[], TeardownReport] = lambda: bank_at_teardown(**kwargs)  # type: ignore[arg-type]  # noqa: E731
    return await asyncio.shield(loop.run_in_executor(None, call))
