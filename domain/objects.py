"""Bank objects (A17, N3, ADR 0006): their names, their stamps, and what a run needs.

A bank is an object named by its content (``banks/<sha256>.tgz`` beneath the run); the
record names it. A record written before objects had names (no ``object``) names the
old fixed key: ``None`` here, which each store maps to its own legacy key.

Pure: no I/O, no clock (ages are computed from a ``now`` the caller passes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

import attrs

from .errors import InvalidBankObject
from .fold import ScratchState
from .records import Record, ScratchBanked
from .retention import RETAIN_CHECKPOINTS, retained

BANK_PREFIX = "banks/"
_NAME = re.compile(r"banks/([0-9a-f]{64})\.tgz")

#: Unreferenced objects kept per run before the oldest are swept (A17's count).
UNREFERENCED_KEEP = 3
#: An unreferenced object younger than this may be a put on its way to its record.
UNREFERENCED_AGE = timedelta(hours=1)


def object_name(sha256: str) -> str:
    """The name of the object holding an archive with this SHA-256 (relative to its run)."""
    name = f"{BANK_PREFIX}{sha256}.tgz"
    return check_object_name(name)


def check_object_name(name: str) -> str:
    """``name`` if it is a bank object's name; InvalidBankObject otherwise (a hostile or
    corrupt record must never address anything outside the run's bank prefix)."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise InvalidBankObject(f"{name!r} is not a bank object's name (banks/<sha256>.tgz)")
    return name


def digest_of(name: str) -> str:
    """The SHA-256 a bank object's name says its content has."""
    match = _NAME.fullmatch(check_object_name(name))
    assert match is not None
    return match.group(1)


@attrs.frozen
class BankStamp:
    """What an object says of itself in the store (N3): whose teardown put it, and what."""

    run_id: str
    execution: str
    bytes: int
    sha256: str
    manifest_sha256: str = ""
    at: datetime | None = None


@attrs.frozen
class StoredObject:
    """One object of a run's listing. ``name`` None: the legacy fixed key (no stamp).

    ``stored_at``: when the store created the object, by the store's own clock (S3's
    ``LastModified``, the file's mtime as the filesystem set it); None when the store
    did not say (an object of unknown age: A17's bound counts it, never chooses it).
    The stamp's ``at`` is the writer's clock: shown, never used for an age (issue 26)."""

    name: str | None
    bytes: int
    stamp: BankStamp | None = None
    stored_at: datetime | None = None


class Listing(list[StoredObject]):
    """A run's objects as one listing gave them, and ``now``: the store's own time taken
    in the same conversation (S3: the ``Date`` of the LIST response; files: a fresh
    file's mtime), None when it did not say (then no object has a known age). Ages are
    ``now - stored_at``, both by the store's clock, never a process's (issue 26)."""

    now: datetime | None

    def __init__(self, objects: Iterable[StoredObject] = (), now: datetime | None = None) -> None:
        super().__init__(objects)
        self.now = now


def listed_now(listing: Sequence[StoredObject]) -> datetime | None:
    """The store's time of a listing (None: a plain sequence, a store that did not say)."""
    return listing.now if isinstance(listing, Listing) else None


def execution_label(state: ScratchState) -> str:
    """The latest execution as the timeline names it today: ``@<position>`` of its
    ``run_started`` / ``run_resumed`` (a position of an append-only timeline names one
    execution for good); "" when none started, or the timeline could not be read.
    (A18's execution id replaces this once teardowns record it.)"""
    latest = state.latest_execution
    if latest is None:
        return ""
    return state.latest_execution_id or f"@{latest.position}"  # A18: its id, once its start names it


def named_objects(records: Iterable[Record]) -> frozenset[str | None]:
    """Every object a banked record names (None: the legacy key)."""
    return frozenset(r.object for r in records if isinstance(r, ScratchBanked) and r.banked)


def needed_objects(state: ScratchState, retain: int = RETAIN_CHECKPOINTS) -> frozenset[str | None]:
    """The objects the run still needs: the one its current bank names, if any, and those
    of the last ``retain`` checkpoints' banks retention keeps (K8, ADR 0013)."""
    kept = {k.object for k in retained(state.history, retain)}
    return frozenset(kept if state.bank is None else {*kept, state.bank.record.object})


def unreferenced(records: Sequence[Record], listing: Iterable[StoredObject]) -> tuple[StoredObject, ...]:
    """The run's objects that no record names (a legacy object too, when no legacy record does)."""
    named = named_objects(records)
    return tuple(o for o in listing if o.name not in named)


@attrs.frozen
class Reconciliation:
    """What N3 makes of a run's unreferenced objects before a resume decides.

    ``record``: the one provably the latest execution's own teardown, to be recorded;
    ``unproven``: objects that may be that teardown's but cannot be proved (refuse by
    name); ``others``: unreferenced objects of earlier executions (shown, bounded).
    """

    latest_execution: str
    record: StoredObject | None = None
    unproven: tuple[StoredObject, ...] = ()
    others: tuple[StoredObject, ...] = ()


def reconcile(
    state: ScratchState, records: Sequence[Record], listing: Iterable[StoredObject]
) -> Reconciliation:
    """Sort the unreferenced objects (N3, A16-A18) of a run read whole (``reconciled``)."""
    return _sort(state, unreferenced(records, listing))


def reconciled(state: ScratchState, listing: Iterable[StoredObject]) -> Reconciliation:
    """N3 from the fold alone (its ``named_objects``): a snapshot and the records after it
    decide as the whole timeline would (issue 26: no decision pays a full read)."""
    return _sort(state, tuple(o for o in listing if o.name not in state.named_objects))


def _sort(state: ScratchState, loose: tuple[StoredObject, ...]) -> Reconciliation:
    """Only while the latest execution may still be banking (no teardown record and no
    host-backed restore after its start) can an unreferenced object be its teardown's;
    the stamp must name that execution, and be the only one."""
    latest = execution_label(state)
    if not loose or not state.may_still_be_banking or not latest:
        return Reconciliation(latest, others=loose)
    mine = tuple(o for o in loose if o.stamp is not None and o.stamp.execution == latest and _whole(o))
    unknown = tuple(o for o in loose if o.stamp is None or not o.stamp.execution)
    others = tuple(o for o in loose if o not in mine and o not in unknown)
    if len(mine) == 1 and not unknown:
        return Reconciliation(latest, record=mine[0], others=others)
    return Reconciliation(latest, unproven=mine + unknown, others=others)


def _whole(found: StoredObject) -> bool:
    """The object is what its stamp says: its name's digest, its size."""
    stamp = found.stamp
    return (
        stamp is not None
        and found.name is not None
        and digest_of(found.name) == stamp.sha256
        and found.bytes == stamp.bytes > 0
    )


def reconciled_record(found: StoredObject) -> ScratchBanked:
    """The teardown record N3 writes for an object proved to be the latest execution's."""
    stamp = found.stamp
    assert stamp is not None
    assert found.name is not None
    return ScratchBanked(
        banked=True,
        empty=False,
        unknown=False,
        bytes=stamp.bytes,
        reason=f"reconciled (N3): stored by execution {stamp.execution}'s teardown, never recorded",
        sha256=stamp.sha256,
        manifest_sha256=stamp.manifest_sha256 or None,
        object=found.name,
    )


def over_bound(
    loose: Sequence[StoredObject],
    now: datetime | None,
    *,
    keep: int = UNREFERENCED_KEEP,
    age: timedelta = UNREFERENCED_AGE,
) -> tuple[StoredObject, ...]:
    """A17's bound: past ``keep`` unreferenced objects, the oldest ones older than ``age``,
    by the store's clock at both ends (issue 26): each object's ``stored_at`` against the
    store's ``now`` of the same listing, never the writer's stamp nor the pruner's clock
    (two processes an hour apart would sweep a put still on its way to its record).
    Objects of unknown age (no ``stored_at``, or no ``now``) count but are never chosen."""
    if now is None:
        return ()
    aged = sorted(
        (o for o in loose if o.stored_at is not None),
        key=lambda o: _utc(o.stored_at),  # type: ignore[arg-type]
    )
    excess = len(loose) - keep
    chosen: list[StoredObject] = []
    for found in aged:
        if len(chosen) >= excess:
            break
        assert found.stored_at is not None
        if _utc(now) - _utc(found.stored_at) >= age:
            chosen.append(found)
    return tuple(chosen)


def _utc(at: datetime) -> datetime:
    """A time without a zone is read as UTC (a stamp written by a clock that gave none)."""
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def stamp_fields(stamp: BankStamp) -> dict[str, str]:
    """A stamp as flat strings (S3 object metadata, the filesystem's sidecar)."""
    return {
        "run": stamp.run_id,
        "execution": stamp.execution,
        "bytes": str(stamp.bytes),
        "sha256": stamp.sha256,
        "manifest-sha256": stamp.manifest_sha256,
        "at": "" if stamp.at is None else stamp.at.isoformat(),
    }


def stamp_of(fields: Mapping[str, str]) -> BankStamp | None:
    """A stamp read back from its flat strings; None when it is not a whole stamp
    (an object written before stamps, or metadata someone else wrote)."""
    try:
        at = fields.get("at") or ""
        return BankStamp(
            run_id=fields["run"],
            execution=fields.get("execution", ""),
            bytes=int(fields["bytes"]),
            sha256=fields["sha256"],
            manifest_sha256=fields.get("manifest-sha256", ""),
            at=datetime.fromisoformat(at) if at else None,
        )
    except (KeyError, ValueError, TypeError):
        return None
