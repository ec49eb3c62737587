"""Bank objects over the ports (A17, N3, ADR 0006): prune after a record, reconcile before a resume.

- ``prune``: once a teardown's record has landed, delete what no record needs any more
  (the objects older records named, the legacy key) and the unreferenced objects past
  the bound; never an object a put may still be on its way to record, and nothing at
  all once anything was appended after the record (re-read first).
- ``reconcile_before_resume``: an engine-side resume's N3 step. The one unreferenced
  object provably the latest execution's own teardown is recorded; objects that may be
  but cannot be proved refuse the resume by name (BANK_UNRECORDED).
- ``unreferenced_objects``: what ``status`` lists.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import attrs

from scratchbank.domain.errors import (
    BankGone,
    BankReadFailed,
    BankWriteFailed,
    HostileArchive,
    TimelineUnreadable,
)
from scratchbank.domain.fold import ScratchState
from scratchbank.domain.objects import (
    BankStamp,
    Reconciliation,
    StoredObject,
    digest_of,
    listed_now,
    named_objects,
    needed_objects,
    over_bound,
    reconcile,
    reconciled,
    reconciled_record,
)
from scratchbank.domain.records import Record
from scratchbank.domain.retention import RETAIN_CHECKPOINTS

from .folded import current_state
from .ports import BankStore, Clock, SnapshotStore, Timeline
from .recording import Claim, append_at
from .retry import Budget


def prune(
    store: BankStore,
    timeline: Timeline,
    after: Claim,
    notes: list[str],
    retain: int = RETAIN_CHECKPOINTS,
    *,
    snapshots: SnapshotStore | None = None,
) -> tuple[str | None, ...]:
    """After a record that left the timeline at ``after``: delete what no record needs
    (the current bank and the last ``retain`` checkpoints' banks are needed: K8).
    Decided on the fold (``snapshots``: its latest snapshot and the records after it,
    issue 26), the put-back on the records after ``after``.

    Returns the names deleted. Any failure is a note: an object left behind is only
    space, and the next prune (or the sweep) takes it.
    """
    try:
        state = current_state(timeline, after.run_id, snapshots=snapshots)
    except TimelineUnreadable as error:
        notes.append(f"bank objects not pruned: the timeline could not be read ({error.message})")
        return ()
    if state.records != after.position:
        notes.append("bank objects not pruned: the run moved on after this record (the next prune will)")
        return ()
    try:
        # the stamps of objects the records name are never read (only loose ones': N3, the
        # bound), so the store need not fetch them (S3: a HEAD each; issue 26)
        listing = store.objects(after.run_id, named=state.named_objects)
    except BankReadFailed as error:
        notes.append(f"bank objects not pruned: the store could not list them ({error.message})")
        return ()
    doomed = _doomed(state, listing, retain)
    stamps = {o.name: o.stamp for o in listing}
    work = Path(tempfile.mkdtemp(prefix="scratchbank-prune-"))
    try:
        gone: list[str | None] = []
        for name in doomed:
            if _delete_keeping_a_copy(store, after.run_id, name, work, notes):
                gone.append(name)
        back = _put_back(store, timeline, after, gone, stamps, work, notes, snapshots)
        return tuple(n for n in gone if n not in back)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _copy_of(work: Path, name: str) -> Path:
    return work / digest_of(name)


def _delete_keeping_a_copy(
    store: BankStore, run_id: str, name: str | None, work: Path, notes: list[str]
) -> bool:
    """Delete one object, a copy of it kept first (a named one: a record landing during
    this prune may name it, ADR 0006). No copy, no delete: an object left is only space."""
    if name is not None:
        try:
            with _copy_of(work, name).open("wb") as dest:
                store.fetch(run_id, dest, max_bytes=1 << 62, name=name)
        except (BankGone, BankReadFailed, HostileArchive) as error:
            if not isinstance(error, BankGone):
                notes.append(f"bank object {name} not pruned: no copy could be kept ({error.message})")
                return False
    try:
        store.delete(run_id, name)
    except BankWriteFailed as error:
        notes.append(f"could not delete bank object {name or 'at the legacy key'}: {error.message}")
        return False
    return True


def _put_back(
    store: BankStore,
    timeline: Timeline,
    after: Claim,
    gone: Sequence[str | None],
    stamps: dict[str | None, BankStamp | None],
    work: Path,
    notes: list[str],
    snapshots: SnapshotStore | None = None,
) -> tuple[str | None, ...]:
    """A17, the prune race: re-read after the deletes; an object a record that landed
    meanwhile names (its put found it present) is put back from the copy. A timeline
    that cannot be read puts every one back (an object left is only space)."""
    named = [n for n in gone if n is not None and _copy_of(work, n).exists()]
    if not named:
        return ()
    try:
        since = named_objects(_since(timeline, after, snapshots))
        back = [n for n in named if n in since]
    except TimelineUnreadable:
        back = named
    for name in back:
        try:
            store.put(after.run_id, _copy_of(work, name), sha256=digest_of(name), stamp=stamps.get(name))
            notes.append(f"bank object {name} put back: a record landed during the prune names it")
        except BankWriteFailed as error:
            notes.append(f"bank object {name} named by a record could not be put back: {error.message}")
    return tuple(back)


def _since(timeline: Timeline, after: Claim, snapshots: SnapshotStore | None) -> tuple[Record, ...]:
    """The records after ``after`` (issue 26: from the snapshot store, never the run whole)."""
    if snapshots is not None:
        return tuple(snapshots.read_after(after.run_id, after.position))
    return tuple(timeline.read(after.run_id))[after.position :]


def _doomed(
    state: ScratchState,
    listing: Sequence[StoredObject],
    retain: int = RETAIN_CHECKPOINTS,
) -> tuple[str | None, ...]:
    """Superseded objects (named by older records, not needed now), the legacy key when
    nothing needs it, and the unreferenced objects past the bound (A17); the names come
    from the fold (``named_objects``), so a snapshot and its tail decide as the run would.
    Ages by the store's clock alone: each object's ``stored_at`` against the listing's
    ``now`` (issue 26: a writer's or this process's clock an hour off never sweeps a put
    on its way to its record)."""
    needed = needed_objects(state, retain)
    named = state.named_objects
    superseded = [o.name for o in listing if o.name not in needed and (o.name in named or o.name is None)]
    loose = [o for o in listing if o.name not in named and o.name is not None]
    keep = reconciled(state, loose)
    candidates = {o.name for o in (keep.record, *keep.unproven) if o is not None}
    bounded = [
        o.name for o in over_bound([o for o in loose if o.name not in candidates], listed_now(listing))
    ]
    return tuple(dict.fromkeys([*superseded, *bounded]))


def unreferenced_objects(
    store: BankStore, run_id: str, records: Sequence[Record], state: ScratchState
) -> Reconciliation:
    """What ``status`` shows: the run's unreferenced objects, sorted by N3 (BankReadFailed
    when the store cannot list them)."""
    return reconcile(state, records, store.objects(run_id))


@attrs.frozen
class Reconciled:
    """The N3 step's outcome: what it found, the timeline's version it read (past its
    own record when it wrote one), and the claim past that record."""

    found: Reconciliation
    version: int
    recorded: Claim | None = None


def reconcile_before_resume(
    store: BankStore,
    timeline: Timeline,
    run_id: str,
    clock: Clock,
    budget: float,
    snapshots: SnapshotStore | None = None,
) -> Reconciled | None:
    """N3 before an engine-side resume decides: record the one object provably the latest
    execution's teardown, at the version read (a conflict: the run moved; the resume reads
    again anyway). None when the timeline cannot be read (the gate refuses, R15); nothing
    found when the store cannot list (the resume decides on its records, as before N3).
    Decided from the snapshot and the records after it, as the gate's fold (issue 26)."""
    try:
        state = current_state(timeline, run_id, snapshots=snapshots)
    except TimelineUnreadable:
        return None
    try:
        # N3 sorts only the objects no record names: the named ones' stamps are never read
        listing = store.objects(run_id, named=state.named_objects) if state.records else ()
    except BankReadFailed:
        listing = ()
    found = reconciled(state, listing)
    if found.record is None:
        return Reconciled(found, state.records)
    record = attrs.evolve(reconciled_record(found.record), at=clock.now())
    claim = append_at(timeline, Claim(run_id, state.records), [record], budget=Budget.start(clock, budget))
    return Reconciled(found, claim.position, claim)
