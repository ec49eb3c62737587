"""Teardown banking (T1-T20): quiesce, archive to a host file, store, record.

It runs when things are already going wrong, so every step has a budget of its own
and every failure is tried again where a retry can cure it (T8), on the same archive
for an upload (T10). What a try saw is merged with earlier tries by the domain, which
never lets a later try record less (T9, A7). The processes the quiesce stopped are
continued whatever happens (T14): by the sandbox itself after a clean quiesced pass (one
exec: ``quiesce_and_archive``), else by the host on a budget of its own. It ignores
the run's own cancellation (T7): an async engine awaits it shielded, in a thread.

The lease keeper's ``cancel`` is another matter (L5, ADR 0005): past a ceiling, or
with the lease lost, the bank in flight stops. Every sandbox and store call rides
it (its deadline is cut at once), no other try, tar pass or upload starts, and no
store write (upload, T4 delete) is made after it: the store is not fenced, and a
stale upload could replace the bank the next holder's takeover stores. What does
not ride it still lands: the processes are continued on their own budget (T14), and
a bank that reached the store before the cut is recorded on the record's own
budget (the fence refuses it once a newer holder wrote). A teardown cut before
anything reached the store records nothing (``TeardownReport.cut``): the sandbox
is left to the next holder's takeover, which banks it (``orphan_may_bank``).

Bank objects (A17, ADR 0006): the put creates a content-named object stamped with this
teardown's execution and never replaces one; the record names it. Nothing is deleted
before the record lands: T4 (empty), T5 (finished) and a newer bank then prune what no
record needs (``bank_objects.prune``), never after a cut.
"""

from __future__ import annotations

import itertools
import math
import shutil
import tempfile
from pathlib import Path
from typing import Literal

import attrs

from scratchbank.domain.checkpoints import Checkpoint
from scratchbank.domain.errors import (
    ArchiveFailed,
    BankReadFailed,
    BankWriteFailed,
    ExecFailed,
    SandboxGone,
    StreamBroken,
    TimelineConflict,
    TimelineUnreadable,
)
from scratchbank.domain.executions import Execution, Standing, executions, standing
from scratchbank.domain.fold import ScratchState, fold
from scratchbank.domain.objects import BankStamp, digest_of, execution_label
from scratchbank.domain.records import Record, ScratchBanked
from scratchbank.domain.retention import RETAIN_CHECKPOINTS, check_retain
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

from .bank_format.host_archive import ArchiveFacts, HostArchive
from .bank_objects import prune
from .cancellation import Cancel, CancelScope, Deadline
from .folded import current_state
from .ports import (
    TRY_FAILURES,
    ArchiveReport,
    BankStore,
    Clock,
    LockGrant,
    Placed,
    QuiesceReport,
    RunLock,
    Sandbox,
    SnapshotStore,
    SystemClock,
    Timeline,
    quiesce_and_archive,
)
from .recording import RETRYABLE, Claim, another_teardown, append_at, new_execution
from .retry import Budget, Pauses, retry_within


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
class NothingRecorded:
    """What a teardown that wrote no record says in its place: ``outcome`` names why
    (``skipped``: its plan banks nothing; ``superseded``: another execution or teardown
    recorded first; ``cut``: the run context cut it before anything reached the store, L5)."""

    outcome: Literal["skipped", "superseded", "cut"]
    why: str
    #: nothing was banked (as a record that did not bank says)
    banked: Literal[False] = False


@attrs.frozen
class TeardownReport:
    """What one teardown did. ``record`` always names what it comes to: the record it wrote
    (or tried to: see ``recorded``), or ``NothingRecorded`` with why; never None."""

    plan: TeardownPlan
    record: ScratchBanked | NothingRecorded
    recorded: bool = False
    tries: tuple[TryOutcome, ...] = ()
    quiesce: QuiesceReport | None = None
    uploads: int = 0
    tar_passes: int = 0
    notes: tuple[str, ...] = ()
    #: why this teardown lost the run and wrote nothing (another execution or teardown
    #: recorded first: fencing by position), or "" when it did not
    superseded: str = ""
    #: why the run context cut this teardown short (L5), or "" when it was not cut
    cut: str = ""
    #: the execution this teardown banked (A18): its id, ``#N``, or None when it could not tell
    execution: str | None = None

    @property
    def sandbox_left(self) -> bool:
        """Cut before anything was recorded: the sandbox is the next holder's to bank."""
        return bool(self.cut) and not self.recorded


#: A complete archive on the host and the members tar caught racing in it (T16).
Complete = tuple[ArchiveFacts, tuple[str, ...]]


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
    claim: Claim | None = None
    #: the execution whose sandbox this teardown banks (A18); None: not known yet
    mine: Execution | None = None
    #: the id the caller named (A18), None when it named none
    asked: str | None = None
    complete: Complete | None = None
    cancel: Cancel | None = None
    stored: bool = False  # did any store write (an upload) land before a cut?
    #: has this try left processes stopped for the host to continue (T14)?
    left_stopped: bool = False
    #: the execution this teardown banks, as stamped on its object (N3, ADR 0006)
    execution: str = ""
    #: where the later checks read the records after the claim (issue 26)
    snapshots: SnapshotStore | None = None
    #: the objects the records before the claim name (None: not read), and whether the
    #: last put created its object (A17's look after the record, ADR 0006)
    named_before: frozenset[str | None] | None = None
    created: bool = False
    #: the quiesce each archive (by its SHA-256) was taken under, an unquiesced one kept:
    #: the record's is that of the archive it banks, maybe an earlier try's (T13, T16)
    quiesce_of: dict[str, Quiesce] = attrs.Factory(dict)

    def stamp(self, facts: ArchiveFacts) -> BankStamp:
        """What the object says of itself in the store (N3)."""
        manifest = facts.manifest.sha256 if facts.manifest else ""
        return BankStamp(self.run_id, self.execution, facts.bytes, facts.sha256, manifest, self.clock.now())

    def cut(self) -> str:
        """Why the run context was cancelled (L5), or "" while it was not."""
        if self.cancel is None or not self.cancel.is_set():
            return ""
        return self.cancel.why or "the run context was cancelled"

    def left(self) -> float:
        return 0.0 if self.cut() else self.deadline - self.clock.monotonic()

    def call_deadline(self) -> Deadline:
        """One call's deadline: the banking budget that is left (at least a second),
        cut at once with the run context (L5)."""
        return Deadline.after(max(self.left(), 1.0), self.cancel)

    def keep(self, archived: Complete) -> None:
        """T16: the last complete archive, a clean one before one that raced."""
        if self.complete is None or not archived[1] or self.complete[1]:
            self.complete = archived


@attrs.frozen
class FirstRead:
    """What the teardown's first read found: the state to plan on, the version read
    (None: unreadable for the whole record budget), the execution it banks (A18) and, when
    it must record nothing, why."""

    state: ScratchState
    claim: Claim | None
    mine: Execution | None
    why_not: str = ""


def _first_read(
    timeline: Timeline,
    run_id: str,
    execution: str | None,
    budgets: Budgets,
    clock: Clock,
    notes: list[str],
    snapshots: SnapshotStore | None = None,
) -> FirstRead:
    """Read the run, retried within the record's budget (a blip never disables the check),
    and say which execution this teardown banks and whether a newer one started (A18).
    The plan folds the latest snapshot and the records after it (issue 26)."""
    budget = Budget.start(clock, budgets.record_seconds)
    pauses = Pauses(budgets.first_pause, budgets.record_pause_cap)

    def read(_d: Deadline) -> tuple[ScratchState, Standing]:
        state = current_state(timeline, run_id, snapshots=snapshots)
        return state, _standing(timeline, run_id, state, execution)

    try:
        state, where = retry_within(budget, read, retry_on=(TimelineUnreadable,), pauses=pauses)
    except TimelineUnreadable as error:
        if execution is None:
            why = (
                "the timeline stayed unreadable for the record's budget: this teardown cannot tell "
                f"which execution it banks, so it records nothing ({error.message})"
            )
            notes.append(why)
            return FirstRead(ScratchState(), None, None, why)
        # Named: bank, and check the execution on every later read (before each store
        # write and the record).
        notes.append(f"timeline unreadable at teardown, banking execution {execution}: {error.message}")
        return FirstRead(ScratchState(), None, None)
    if where.why_not:
        notes.append(where.why_not)
    return FirstRead(state, Claim(run_id, state.records), where.execution, where.why_not)


def _standing(timeline: Timeline, run_id: str, state: ScratchState, execution: str | None) -> Standing:
    """A18 from the fold: the latest execution is the fold's; a teardown naming an older one
    (or one never started: superseded either way) reads the run whole to say which."""
    latest = state.latest_execution
    if latest is None:
        return Standing(None, missing=execution is not None)
    if execution is None or execution == state.latest_execution_id:
        return Standing(Execution(latest.position, state.latest_execution_id))
    return standing(tuple(timeline.read(run_id)), execution)


def _newer(records: tuple[Record, ...], mine: Execution | None, execution: str | None) -> str:
    """Why this teardown lost its execution on ``records`` (a newer one started), or ""."""
    if mine is not None:
        after = [e for e in executions(records) if e.position > mine.position]
        return standing(records, mine.id).why_not if mine.id else _superseded_by(after, mine)
    if execution is not None:
        return standing(records, execution).why_not
    return ""


def _superseded_by(after: list[Execution], mine: Execution) -> str:
    if not after:
        return ""
    return (
        f"superseded: execution {after[0].label} started after execution {mine.label}, "
        "whose sandbox this teardown banks (A18)"
    )


def bank_at_teardown(
    run_id: str,
    *,
    timeline: Timeline,
    store: BankStore,
    sandbox: Sandbox,
    run_finished: bool,
    budgets: Budgets = Budgets(),
    clock: Clock | None = None,
    cancel: Cancel | None = None,
    checkpoint: Checkpoint | None = None,
    execution: str | None = None,
    lock: RunLock | None = None,
    grant: LockGrant | None = None,
    snapshots: SnapshotStore | None = None,
    retain: int = RETAIN_CHECKPOINTS,
) -> TeardownReport:
    """Bank (or drop) the scratch of a sandbox being torn down, and record what happened.

    ``cancel``: the run context the lease keeper cuts (L5; module docstring).
    ``checkpoint``: the checkpoint the run stands at, stamped on the record (ADR 0013).
    ``retain``: how many recent checkpoints' banks the prune after the record keeps (K8).
    ``execution``: the execution whose sandbox this is (A18): if a newer one started, the
    teardown is superseded (named, nothing recorded, nothing deleted). None: the execution
    that is latest at its first read (records without ids keep today's meaning).
    ``lock`` and ``grant``: the run's lock that execution holds (A16); released once the
    teardown recorded or learned it lost the run.
    ``snapshots``: where the plan's fold starts (issue 26: the plan never reads the run whole).
    """
    try:
        return _bank_at_teardown(
            run_id,
            timeline,
            store,
            sandbox,
            run_finished,
            budgets,
            clock or SystemClock(),
            cancel,
            execution,
            checkpoint,
            snapshots,
            check_retain(retain),
        )
    finally:
        if lock is not None and grant is not None:
            lock.release(grant)


def _bank_at_teardown(
    run_id: str,
    timeline: Timeline,
    store: BankStore,
    sandbox: Sandbox,
    run_finished: bool,
    budgets: Budgets,
    clock: Clock,
    cancel: Cancel | None,
    execution: str | None,
    checkpoint: Checkpoint | None,
    snapshots: SnapshotStore | None = None,
    retain: int = RETAIN_CHECKPOINTS,
) -> TeardownReport:
    notes: list[str] = []
    first = _first_read(timeline, run_id, execution, budgets, clock, notes, snapshots)
    state, claim, mine = first.state, first.claim, first.mine
    named = mine.label if mine is not None else execution
    plan = _plan(state, sandbox, run_finished)
    if first.why_not:
        nothing = NothingRecorded("superseded", first.why_not)
        return TeardownReport(plan, nothing, notes=tuple(notes), superseded=first.why_not, execution=named)
    if plan.action is TeardownAction.SKIP:
        return TeardownReport(
            plan, NothingRecorded("skipped", plan.reason), notes=tuple(notes), execution=named
        )
    if cancel is not None and cancel.is_set():
        return _cut(plan, cancel.why or "the run context was cancelled", notes)
    stamp = mine.id if mine is not None else execution
    if plan.action is TeardownAction.DROP:
        checked = _Checked(timeline, run_id, claim, mine, execution, snapshots)
        lost = checked.lost()
        if lost:
            notes.append(lost)
            nothing = NothingRecorded("superseded", lost)
            return TeardownReport(plan, nothing, notes=tuple(notes), superseded=lost, execution=named)
        record = attrs.evolve(finished_record(), at=clock.now(), execution=stamp, checkpoint=checkpoint)
        written = _record(
            timeline, run_id, claim, record, budgets, clock, notes, sandbox, run_finished, checked
        )
        _prune_after(store, timeline, written, notes, cancel, retain, snapshots)  # T5, A17: record first
        return TeardownReport(
            plan, record, written.recorded, notes=tuple(notes), superseded=written.lost, execution=named
        )
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
        claim=claim,
        mine=mine,
        asked=execution,
        cancel=cancel,
        execution=named or execution_label(state),
        snapshots=snapshots,
        named_before=state.named_objects if claim is not None else None,
    )
    try:
        return _bank_then_record(run, plan, sandbox, run_finished, checkpoint, stamp, named, retain)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bank_then_record(
    run: _Run,
    plan: TeardownPlan,
    sandbox: Sandbox,
    run_finished: bool,
    checkpoint: Checkpoint | None,
    stamp: str | None,
    named: str | None,
    retain: int = RETAIN_CHECKPOINTS,
) -> TeardownReport:
    """Bank, record, prune, and see the recorded object is still there (the archive is
    kept until then: a prune racing the record may have deleted it, ADR 0006)."""
    timeline, store, clock, notes, cancel = run.timeline, run.store, run.clock, run.notes, run.cancel
    run_id, claim, mine, execution, budgets = run.run_id, run.claim, run.mine, run.asked, run.budgets
    tries, best = _tries(run, plan)
    if run.cut() and not run.stored:
        return _cut(plan, run.cut(), notes, tuple(tries), run)
    quiesce = run.quiesce or Quiesce(False, sandbox.facts.isolation)
    if best.archive is not None:  # the quiesce its archive was taken under (T13, T16)
        quiesce = run.quiesce_of.get(best.archive.sha256, quiesce)
    record = attrs.evolve(
        teardown_record(best, quiesce), at=clock.now(), execution=stamp, checkpoint=checkpoint
    )
    checked = _Checked(timeline, run_id, claim, mine, execution, run.snapshots)
    written = _record(timeline, run_id, claim, record, budgets, clock, notes, sandbox, run_finished, checked)
    _prune_after(store, timeline, written, notes, cancel, retain, run.snapshots)  # T4, A17
    if written.recorded:
        _still_there(run, record, written)
    return TeardownReport(
        plan,
        record,
        written.recorded,
        tuple(tries),
        run.report,
        run.uploads,
        run.tar_passes,
        tuple(notes),
        written.lost,
        run.cut(),
        named,
    )


def _put(run: _Run, facts: ArchiveFacts) -> None:
    """The bank's object, create-only, stamped, within the call's deadline (ADR 0006)."""
    placed = run.store.put(
        run.run_id,
        facts.path,
        sha256=facts.sha256,
        stamp=run.stamp(facts),
        deadline=run.call_deadline(),
    )
    run.created = isinstance(placed, Placed) and placed.created


def _still_there(run: _Run, record: Record, written: Written) -> None:
    """A17, the prune race's other side: a record naming an object this teardown's put
    found present may land after another teardown's prune deleted it. Once recorded,
    the object is looked at again and put back from this teardown's own archive."""
    name = getattr(record, "object", None)
    if name is None or run.complete is None or (run.cancel is not None and run.cancel.is_set()):
        return
    if _no_prune_can_take(run, name, written):
        return
    facts = run.complete[0]
    if digest_of(name) != facts.sha256 or not facts.path.exists():
        return
    try:
        if run.store.stat(run.run_id, name) is None:
            _put(run, facts)
            run.notes.append(f"bank object {name} put back: a prune deleted it as this record landed")
    except (BankReadFailed, BankWriteFailed) as error:
        run.notes.append(f"could not check the recorded bank object {name}: {error.message}")


def _no_prune_can_take(run: _Run, name: str, written: Written) -> bool:
    """Issue 26, ADR 0006: no look is needed when this teardown's last put created the
    object and no record before its own names it. A prune deletes an object only as named
    by a record it read and needed by none (its fold then has a record naming it before
    this one: there is none), or as unreferenced past the bound (an hour old by the store's
    own clock, both ends: this put created it moments ago, whatever any process's clock
    says). "Before its own" is known only when the record landed right at the first read's
    claim (no record came between)."""
    after, claim = written.after, run.claim
    return (
        run.created
        and run.named_before is not None
        and name not in run.named_before
        and claim is not None
        and after is not None
        and after.position == claim.position + 1
    )


def _prune_after(
    store: BankStore,
    timeline: Timeline,
    written: Written,
    notes: list[str],
    cancel: Cancel | None,
    retain: int = RETAIN_CHECKPOINTS,
    snapshots: SnapshotStore | None = None,
) -> None:
    """A17: once this teardown's record landed, delete what no record needs (T4's previous
    bank, T5's, a bank the new one replaced); never before it, never after a cut (L5).
    Ages are the store's (issue 26): no process clock decides what is swept."""
    if written.after is None or (cancel is not None and cancel.is_set()):
        return
    prune(store, timeline, written.after, notes, retain, snapshots=snapshots)


def _cut(
    plan: TeardownPlan,
    why: str,
    notes: list[str],
    tries: tuple[TryOutcome, ...] = (),
    run: _Run | None = None,
) -> TeardownReport:
    """L5: cut before anything reached the store: nothing recorded, the sandbox left."""
    notes.append(f"cut ({why}): nothing reached the store, nothing recorded (L5)")
    if run is None:
        return TeardownReport(plan, NothingRecorded("cut", why), notes=tuple(notes), cut=why)
    return TeardownReport(
        plan,
        NothingRecorded("cut", why),
        tries=tries,
        quiesce=run.report,
        uploads=run.uploads,
        tar_passes=run.tar_passes,
        notes=tuple(notes),
        cut=why,
    )


def _plan(state: ScratchState, sandbox: Sandbox, run_finished: bool) -> TeardownPlan:
    facts = sandbox.facts
    return plan_teardown(
        state,
        scratch_host_backed=facts.host_backed,
        process_isolated=facts.process_isolated,
        run_finished=run_finished,
    )


def _tries(run: _Run, plan: TeardownPlan) -> tuple[list[TryOutcome], TryOutcome]:
    """Try until the domain says stop (T8, T9, A7); return every try and the best one.
    Through ``retry_within``: another try while the domain asks for one, the pause
    doubling, none once the run context is cut or the banking budget is nearer."""
    tries: list[TryOutcome] = []
    best: list[TryOutcome] = []

    def one(_deadline: Deadline) -> bool:
        outcome, final = _one_try(run, plan, len(tries))
        tries.append(outcome)
        merged = merge_try(best[0] if best else None, outcome)
        best[:] = [merged.best]
        return not (merged.stop or final)  # another try?

    if run.budgets.bank_tries > 0:
        retry_within(
            _budget(run),
            one,
            retry_on=(),
            again=bool,
            pauses=Pauses(run.budgets.first_pause, math.inf),
            tries=run.budgets.bank_tries,
            stop=lambda pause: bool(run.cut()) or run.left() <= pause,
        )
    assert best
    return tries, best[0]


def _budget(run: _Run) -> Budget:
    """The banking budget, as ``retry_within`` reads it (until ``run.deadline``)."""
    return Budget(run.clock, 0.0, run.deadline)


def _one_try(run: _Run, plan: TeardownPlan, attempt: int) -> tuple[TryOutcome, bool]:
    """One try: quiesce, archive (again while it races), continue, upload. (outcome, final?)

    T16: when this try cannot archive, for whatever reason, the last complete archive
    an earlier pass or try took is uploaded instead of being forgotten.
    """
    try:
        archived = _archive_quiesced(run, plan, attempt)
    except TRY_FAILURES as error:
        failed = _failed_try(error)
        if run.complete is None:
            return failed, False
        run.notes.append(f"{failed.reason}; banking the last complete archive (T16)")
        archived = run.complete
    if archived is None:
        return TryOutcome(Seen.EMPTY), True
    if not archived[0].refused and run.complete is not None:
        archived = run.complete  # T16: a clean archive before one that raced, across tries
    return _bank(run, *archived)


def _failed_try(error: BaseException) -> TryOutcome:
    """What a try that could not archive saw (T8, T19)."""
    if isinstance(error, SandboxGone):
        return TryOutcome(Seen.UNKNOWN, reason=f"the sandbox is gone: {error.message}")
    if isinstance(error, ArchiveFailed):
        return TryOutcome(Seen.FILES, reason=f"tar failed: {error.message}")
    assert isinstance(error, ExecFailed | StreamBroken)
    return TryOutcome(Seen.UNKNOWN, reason=f"exec failed: {error.message}")


def _archive_quiesced(run: _Run, plan: TeardownPlan, attempt: int) -> Complete | None:
    """Quiesce (when isolated) and archive, and continue whatever happens (T11, T14).

    The first pass quiesces too (``quiesce_and_archive``: one exec where the sandbox
    offers it), and the sandbox continues the processes itself after a pass that did
    not race. Anything else leaves them to the host: a race (more passes run first,
    T16), a failure, or a call cut on its way (its deadline, the run context) that may
    have stopped some.
    """
    run.left_stopped = plan.quiesce
    try:
        return _archive(run, attempt, quiesce=plan.quiesce)
    finally:
        if run.left_stopped:
            _continue(run)


def _bank(run: _Run, facts: ArchiveFacts, raced: tuple[str, ...]) -> tuple[TryOutcome, bool]:
    """Store a complete archive unless the cap, the host check or the store rules it out."""
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


def _continue(run: _Run) -> None:
    """T14: continue on a budget of its own, never holding the sandbox's shutdown: the
    call runs in a cancellation scope whose deadline is that budget, on the teardown's
    own thread (a scope of no thread: none can be left behind; the transport's pump
    returns by the deadline and joins its own, ADR 0008)."""
    with CancelScope(run.budgets.continue_seconds, name="continue") as scope:
        try:
            run.sandbox.continue_processes(deadline=scope.deadline)
        except Exception as error:  # the watchdog in the sandbox continues them anyway
            run.notes.append(f"continuing processes failed ({error}); the watchdog will")


def _archive(run: _Run, attempt: int, *, quiesce: bool) -> Complete | None:
    """Archive to a host file, quiescing on the first pass when asked; run tar again
    while it races and budget allows (T16).

    Every complete pass is kept on the run (``_Run.keep``): a pass that fails later, for
    any reason, leaves it to ``_one_try`` to bank that one.
    """
    last: Complete | None = None
    passes = 0
    while True:
        started = run.clock.monotonic()
        path = run.work / f"try{attempt}-pass{passes}.tgz"
        taken = _quiesced_pass(run, path) if quiesce and passes == 0 else _one_pass(run, path)
        passes += 1
        run.tar_passes += 1
        if taken is None:
            return None
        if run.quiesce is not None:
            sha = taken[0].sha256
            known = run.quiesce_of.get(sha)
            if known is None or known.quiesced:
                run.quiesce_of[sha] = run.quiesce
        if not taken[0].refused:
            run.keep(taken)
        last = taken
        took = run.clock.monotonic() - started
        if not should_retar(
            raced=bool(taken[1]), passes=passes, last_pass_seconds=took, seconds_left=run.left()
        ):
            return last


def _sink(run: _Run, path: Path) -> HostArchive:
    return HostArchive(
        path,
        gzipped_input=run.budgets.compress_in_sandbox,
        gzip_level=run.budgets.gzip_level,
        cap=run.budgets.cap_bytes,
    )


def _taken(sink: HostArchive, report: ArchiveReport) -> Complete | None:
    """A pass's archive: (facts, raced), or None for an empty scratch."""
    facts = sink.finish()
    return None if report.empty else (facts, report.raced)


def _quiesced_pass(run: _Run, path: Path) -> Complete | None:
    """The first pass: quiesce and archive; the quiesce is recorded whatever tar did."""
    sink = _sink(run, path)
    try:
        done = quiesce_and_archive(
            run.sandbox,
            sink,
            budget_seconds=max(1, int(run.left()) + int(run.budgets.continue_seconds)),
            wait_seconds=run.budgets.quiesce_wait_seconds,
            compress=run.budgets.compress_in_sandbox,
            deadline=run.call_deadline(),
        )
        run.report = done.quiesce
        run.quiesce = Quiesce(done.quiesce.quiesced, "; ".join(done.quiesce.reasons))
        run.left_stopped = not done.continued
        if done.archive is None:
            raise done.failure or ArchiveFailed("the sandbox gave neither an archive nor a reason")
    except BaseException:
        sink.close()
        raise
    return _taken(sink, done.archive)


def _one_pass(run: _Run, path: Path) -> Complete | None:
    """One plain tar pass, verifying unless every process is stopped (T16, N4)."""
    verify = not (run.quiesce and run.quiesce.quiesced and run.left_stopped)
    sink = _sink(run, path)
    try:
        report = run.sandbox.archive(
            sink, compress=run.budgets.compress_in_sandbox, verify=verify, deadline=run.call_deadline()
        )
    except BaseException:
        sink.close()
        raise
    return _taken(sink, report)


def _upload(run: _Run, facts: ArchiveFacts) -> tuple[bool, str]:
    """T10: retry the upload on the same archive file (through ``retry_within``)."""
    why = [""]

    def once(_deadline: Deadline) -> tuple[bool, str]:
        lost = run.cut() or _lost_since_read(run)
        if lost:
            return False, lost
        run.uploads += 1
        _put(run, facts)
        run.stored = True
        return True, ""

    def failed(error: BaseException) -> None:
        why[0] = f"upload failed: {getattr(error, 'message', error)}"

    if run.budgets.upload_tries <= 0:
        return False, ""
    try:
        return retry_within(
            _budget(run),
            once,
            retry_on=(BankWriteFailed,),
            pauses=Pauses(run.budgets.first_pause, math.inf),
            tries=run.budgets.upload_tries,
            on_failure=failed,
            stop=lambda pause: run.left() <= pause,
        )
    except BankWriteFailed:
        return False, why[0]


def _lost_since_read(run: _Run) -> str:
    """Before a store write: did another execution or teardown take the run since we read
    it, or did a newer execution start after ours (A18)?

    Then this teardown must not replace the bank a newer record names ("" when not). A
    timeline it cannot read now is no answer: the write waits for a read that succeeds.
    """
    return _Checked(run.timeline, run.run_id, run.claim, run.mine, run.asked, run.snapshots).lost()


@attrs.frozen
class _Checked:
    """The teardown's check (A18 and fencing by position), made on a fresh read."""

    timeline: Timeline
    run_id: str
    claim: Claim | None
    mine: Execution | None
    execution: str | None
    #: where the records after the claim are read from (issue 26); None: the run read whole
    snapshots: SnapshotStore | None = None

    def lost(self) -> str:
        """Why this teardown must not write ("" when it may); an unreadable timeline is
        a reason too (the check is never skipped). With a claim and a snapshot store it
        reads the records after the claim only (issue 26: no decision pays a full read)."""
        try:
            if self.claim is not None and self.snapshots is not None:
                return self.on_tail(tuple(self.snapshots.read_after(self.run_id, self.claim.position)))
            records = tuple(self.timeline.read(self.run_id))
        except TimelineUnreadable as error:
            return f"the timeline is unreadable, so this teardown cannot check its run: {error.message}"
        return self.on(records)

    def on_tail(self, tail: tuple[Record, ...]) -> str:
        """``on`` for the records after the claim: every execution started there is newer
        than the one this teardown banks (its start was read before the claim)."""
        assert self.claim is not None
        at = self.claim.position
        after = [Execution(at + e.position, e.id) for e in executions(tail)]
        newer = _superseded_by(after, self.mine) if self.mine is not None else ""
        return newer or _why_lost(tail)

    def on(self, records: tuple[Record, ...]) -> str:
        newer = _newer(records, self.mine, self.execution)
        if newer:
            return newer
        if self.claim is None:
            return ""
        return _why_lost(records[self.claim.position :])


def _why_lost(since: tuple[Record, ...]) -> str:
    winner = new_execution(since) or another_teardown(since)
    return f"superseded: a {winner.WIRE} was recorded after this teardown read the run" if winner else ""


@attrs.frozen
class Written:
    """Whether the teardown's record landed, and why it lost the run if it did."""

    recorded: bool
    lost: str = ""
    #: the claim past the record, once it landed (the prune re-reads against it)
    after: Claim | None = None


def _record(
    timeline: Timeline,
    run_id: str,
    claim: Claim | None,
    record: ScratchBanked,
    budgets: Budgets,
    clock: Clock,
    notes: list[str],
    sandbox: Sandbox,
    run_finished: bool,
    checked: _Checked,
) -> Written:
    """T8: the record, at the version this teardown decided on, tried again until its own
    budget runs out (a store failover). A conflict is read, never retried blindly: another
    execution or teardown recorded first -> this one writes nothing; else it plans again
    on what it now reads and appends there. A teardown whose first read failed reads now,
    within the same budget, and checks its execution (A18) before it appends."""
    budget = Budget.start(clock, budgets.record_seconds)
    pauses = Pauses(budgets.first_pause, budgets.record_pause_cap)
    planned = [claim]

    def decide(_deadline: Deadline) -> Written:
        """One decision; a conflict that did not take the run is planned again and
        raised, so ``retry_within`` decides again (no pause: nothing to wait for)."""
        claim = planned[0]
        try:
            if claim is None:
                records = _read_within(timeline, run_id, budget, pauses)
                lost = checked.on(records)
                if lost:
                    notes.append(lost)
                    return Written(False, lost)
                claim = Claim(run_id, len(records))
            at = claim
            after = append_at(timeline, at, [record], budget=budget, pauses=pauses)
            return Written(True, after=after)
        except RETRYABLE as error:
            notes.append(f"the record was not written within its budget: {error.message}")
            return Written(False)
        except TimelineConflict:
            planned[0], lost = _replan(timeline, at, sandbox, run_finished, checked)
            if lost:
                notes.append(lost)
                return Written(False, lost)
            raise

    try:
        return retry_within(
            Budget(clock, clock.monotonic(), math.inf),  # bounded by DECIDE_AGAIN, not time
            decide,
            retry_on=(TimelineConflict,),
            pauses=itertools.repeat(0.0),
            tries=DECIDE_AGAIN,
        )
    except TimelineConflict:
        notes.append(f"the timeline kept moving under {DECIDE_AGAIN} tries; the record was not written")
        return Written(False, "superseded: the timeline kept moving")


#: How many times a teardown plans again after a conflict that did not take its run.
DECIDE_AGAIN = 5


def _read_within(timeline: Timeline, run_id: str, budget: Budget, pauses: Pauses) -> tuple[Record, ...]:
    """The run's records, read within the record's budget."""
    return retry_within(budget, lambda _d: tuple(timeline.read(run_id)), retry_on=RETRYABLE, pauses=pauses)


def _replan(
    timeline: Timeline, claim: Claim, sandbox: Sandbox, run_finished: bool, checked: _Checked
) -> tuple[Claim | None, str]:
    """After a conflict: (the claim to append at, "") or (None, why this teardown lost).
    With a snapshot store: the snapshot and the records after it, and the records after
    the claim for the check (issue 26: no decision pays a full read)."""
    try:
        if checked.snapshots is not None and (checked.mine is not None or checked.execution is None):
            state = current_state(timeline, claim.run_id, snapshots=checked.snapshots)
            moved = max(state.records - claim.position, 0)
            tail = itertools.islice(checked.snapshots.read_after(claim.run_id, claim.position), moved)
            lost = attrs.evolve(checked, claim=claim).on_tail(tuple(tail))
        else:
            records = tuple(timeline.read(claim.run_id))
            state = fold(records)
            lost = _newer(records, checked.mine, checked.execution) or _why_lost(records[claim.position :])
    except TimelineUnreadable:
        return None, ""  # read again within the record's budget
    if lost:
        return None, lost
    plan = _plan(state, sandbox, run_finished)
    if plan.action is TeardownAction.SKIP:
        return None, f"superseded: {plan.reason} ({plan.rule})"
    return Claim(claim.run_id, state.records), ""
