"""The records of a run's timeline that the scratch rules read, as frozen values.

Each record has a stable wire name (the ADR's own: ``node_finished``,
``sandbox_scratch_banked``, ...) and a version. The wire codec (``wire.py``) reads
the field specs declared here, so a field's wire name, type and whether it is
required live next to the field itself. Records are keyword-only so that adding an
optional field later never reorders a constructor.

Why plain values and not eventsourcing aggregates: an engine that already keeps an
event log implements the timeline port over its own log; the fold must not care
where records came from.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar

import attrs

from .checkpoints import Checkpoint

# Field kinds the codec understands. "?" marks a field that may be absent or null.
BOOL, INT, STR, STRS, STATUS, TIME = "bool", "int", "str", "strs", "status", "time"
CHECKPOINT = "checkpoint"  # a Checkpoint: on the wire, its lineage as a list of ids (ADR 0013)
#: a rewind's replayed passes (K9): on the wire, an object {node: [pass, ...]} of positive ints
PASSES = "passes"

#: per node, the passes a rewind replays (K9), sorted by node: hashable and canonical
Passes = tuple[tuple[str, tuple[int, ...]], ...]


def passes_of(value: Mapping[str, Any] | Passes | None) -> Passes | None:
    """A rewind's replayed passes in their canonical form (sorted nodes, sorted passes)."""
    if value is None:
        return None
    pairs = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(node), tuple(sorted(set(ps)))) for node, ps in pairs))


def wire(
    kind: str,
    *,
    name: str | None = None,
    required: bool = True,
    default: Any = attrs.NOTHING,
) -> Any:
    """Declare a record field with its wire name, kind and presence rule."""
    meta = {"wire_kind": kind, "wire_name": name, "required": required}
    if default is attrs.NOTHING and not required:
        default = None
    return attrs.field(default=default, metadata=meta)


class RunStatus(enum.Enum):
    """A run's status as the engine reports it."""

    QUEUED = "queued"
    RUNNING = "running"
    PAUSED = "paused"
    FAILED = "failed"
    FINISHED = "finished"
    CANCELLED = "cancelled"


@attrs.frozen(kw_only=True)
class Record:
    """Base of every timeline record. ``at`` is when the engine wrote it, if it said."""

    WIRE: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    at: datetime | None = wire(TIME, required=False)


@attrs.frozen(kw_only=True)
class RunStarted(Record):
    """A first execution of the run began (a new sandbox; R10 reads it)."""

    WIRE = "run_started"
    execution: str | None = wire(STR, required=False)


@attrs.frozen(kw_only=True)
class RunResumed(Record):
    """A resume began a new execution, with the consents it was given (C3)."""

    WIRE = "run_resumed"
    attempt: str | None = wire(STR, required=False)
    force: bool = wire(BOOL, required=False, default=False)
    accept_scratch_loss: bool = wire(BOOL, required=False, default=False)
    #: the execution this resume starts (A18); None on records written before it was named
    execution: str | None = wire(STR, required=False)
    #: the execution (its id, or ``@N`` its start) whose teardown record was missing when
    #: this resume decided (A16): a bank it lands later is not this resume's to restore
    without_teardown: str | None = wire(STR, required=False)


@attrs.frozen(kw_only=True)
class NodeFinished(Record):
    """A node's finish, with where it ran as the executing workflow said (R3).

    ``in_sandbox`` / ``on_cycle`` are the metadata written at finish time
    (``_in_sandbox``, ``_on_cycle``); None means the writer did not record them and
    the reader falls back to the record's kind, then to the current workflow.
    """

    WIRE = "node_finished"
    VERSION = 2
    node: str = wire(STR)
    succeeded: bool = wire(BOOL)
    kind: str | None = wire(STR, required=False)
    answered: bool = wire(BOOL, required=False, default=False)
    in_sandbox: bool | None = wire(BOOL, name="_in_sandbox", required=False)
    on_cycle: bool | None = wire(BOOL, name="_on_cycle", required=False)
    #: K9 (v2): which pass of this node this finish ends, 1 up, unique among the node's
    #: passes in the run's lineage (a loop's iteration, a fan-out's branch in finish
    #: order); None: the writer did not say, and a rewind cannot take it back by pass
    pass_: int | None = wire(INT, name="_pass", required=False)


@attrs.frozen(kw_only=True)
class RunRewound(Record):
    """A rewind, naming the nodes it dropped and which of them lie on a cycle (R6).

    ``on_cycle`` None means the writer did not say; the reader falls back to the
    nodes' finish metadata, then the workflow, then counts the node as on a cycle.
    ``replayed`` (v2, K9) names, for a dropped node on a cycle or a fan-out, the passes
    (their ``node_finished._pass``) the resumed run takes back and runs again; a pass
    it does not name (an earlier one, an in-flight branch the run lets finish) is kept.
    """

    WIRE = "run_rewound"
    VERSION = 2
    dropped_nodes: tuple[str, ...] = wire(STRS)
    on_cycle: tuple[str, ...] | None = wire(STRS, name="_on_cycle", required=False)
    replayed: Passes | None = attrs.field(
        default=None,
        converter=passes_of,
        metadata={"wire_kind": PASSES, "wire_name": "_replayed_passes", "required": False},
    )

    @functools.cached_property
    def _lookup(self) -> tuple[frozenset[str], frozenset[str] | None, dict[str, frozenset[int]]]:
        """Sets of the dropped nodes, the nodes on a cycle and each node's replayed passes,
        built once: a wide rewind is read in time linear in its size (K9)."""
        cycles = None if self.on_cycle is None else frozenset(self.on_cycle)
        named = {node: frozenset(passes) for node, passes in self.replayed or ()}
        return frozenset(self.dropped_nodes), cycles, named

    def drops(self, node: str) -> bool:
        """Did this rewind drop ``node``?"""
        return node in self._lookup[0]

    def cycles(self, node: str) -> bool | None:
        """Does this rewind say ``node`` lies on a cycle? None: it does not say (R6)."""
        cycles = self._lookup[1]
        return None if cycles is None else node in cycles

    def replays(self, node: str, pass_: int | None) -> bool | None:
        """K9: does this rewind take back ``node``'s pass ``pass_``? None: it does not say
        (no passes named for the node, or the finish carries no pass): R6 decides."""
        if self.replayed is None or pass_ is None or not self.drops(node):
            return None
        passes = self._lookup[2].get(node)
        return None if passes is None else pass_ in passes


@attrs.frozen(kw_only=True)
class ScratchBanked(Record):
    """What one teardown did with the scratch (T6).

    Exactly one outcome holds: ``banked`` (an archive is stored), ``empty`` (nothing
    to keep; any earlier bank was deleted), ``unknown`` (the scratch could not even
    be listed), ``finished`` (a finished run keeps no bank, T5) — or none of them: the
    scratch held files that could not be banked, and ``reason`` says why (R1).
    """

    WIRE = "sandbox_scratch_banked"
    #: v2 (ADR 0006): ``object`` names the bank object; v1 records read as naming the legacy key
    #: v3 (ADR 0013): ``checkpoint`` stamps where the run stood; older records carry none
    VERSION = 3
    banked: bool = wire(BOOL)
    empty: bool = wire(BOOL)
    unknown: bool = wire(BOOL)
    bytes: int = wire(INT)
    reason: str = wire(STR, required=False, default="")
    finished: bool = wire(BOOL, required=False, default=False)
    raced: tuple[str, ...] = wire(STRS, required=False, default=())
    raced_count: int = wire(INT, required=False, default=0)
    unquiesced: bool = wire(BOOL, required=False, default=False)
    quiesce_reason: str = wire(STR, required=False, default="")
    sha256: str | None = wire(STR, required=False)
    manifest_entries: int | None = wire(INT, required=False)
    manifest_bytes: int | None = wire(INT, required=False)
    manifest_sha256: str | None = wire(STR, required=False)
    #: the bank object this record names (A17, ADR 0006): ``banks/<sha256>.tgz`` beneath
    #: the run; None on a record written before objects had names (v1): the legacy key
    object: str | None = wire(STR, required=False)
    #: the checkpoint the run stood at when it banked (ADR 0013, K1-K5); None: unstamped
    checkpoint: Checkpoint | None = wire(CHECKPOINT, required=False)
    #: the execution this teardown banked (A18); None on records written before it was named
    execution: str | None = wire(STR, required=False)

    def outcomes(self) -> int:
        """How many of the exclusive outcomes this record claims (valid: 0 or 1)."""
        return sum((self.banked, self.empty, self.unknown, self.finished))

    @property
    def files_unbanked(self) -> bool:
        """The teardown saw files it could not bank (R1)."""
        return self.outcomes() == 0


@attrs.frozen(kw_only=True)
class ScratchRestored(Record):
    """What one resume did about the bank (X1, R13, X6)."""

    WIRE = "sandbox_scratch_restored"
    #: v2 (ADR 0013): ``checkpoint`` names the checkpoint the resume restored for
    #: v3 (ADR 0013, K6): ``bank`` names the teardown record whose bank it restored
    VERSION = 3
    restored: bool = wire(BOOL)
    stale: bool = wire(BOOL)
    accepted: bool = wire(BOOL)
    bytes: int = wire(INT, required=False, default=0)
    reason: str = wire(STR, required=False, default="")
    host_backed: bool = wire(BOOL, required=False, default=False)
    raced: tuple[str, ...] = wire(STRS, required=False, default=())
    #: the checkpoint the resume ran from (ADR 0013): the restored scratch is now its
    checkpoint: Checkpoint | None = wire(CHECKPOINT, required=False)
    #: the position (0-based) of the ``sandbox_scratch_banked`` record whose bank was
    #: restored (K6: a rewind's own, older bank); None: the current bank, or an older record
    bank: int | None = wire(INT, required=False)


@attrs.frozen(kw_only=True)
class SandboxShared(Record):
    """A child was adopted into its parent's sandbox (S2).

    ``scratch_container_local`` None: an engine without the lineage record wrote it;
    the child's lone resume is then not refused (the ADR's "not covered").
    """

    WIRE = "sandbox_shared"
    scratch_container_local: bool | None = wire(BOOL, required=False)
    parent_copy_based: bool = wire(BOOL, required=False, default=False)
    parent_run: str | None = wire(STR, required=False)


@attrs.frozen(kw_only=True)
class ScratchForsaken(Record):
    """A lone child's resume ran past its adoption's refusal, with these consents (S4)."""

    WIRE = "scratch_forsaken"
    forced: bool = wire(BOOL)
    accepted: bool = wire(BOOL)


@attrs.frozen(kw_only=True)
class AttemptQueued(Record):
    """A resume was published and queued the run for this attempt (C5, C6)."""

    WIRE = "attempt_queued"
    #: v2 (ADR 0013): ``checkpoint``, the checkpoint the queued resume is from (republished with it)
    VERSION = 2
    attempt: str = wire(STR)
    force: bool = wire(BOOL, required=False, default=False)
    accept_scratch_loss: bool = wire(BOOL, required=False, default=False)
    checkpoint: Checkpoint | None = wire(CHECKPOINT, required=False)


@attrs.frozen(kw_only=True)
class AttemptClaimed(Record):
    """The engine claimed the queued run for this attempt (C4, C5)."""

    WIRE = "attempt_claimed"
    attempt: str = wire(STR)


@attrs.frozen(kw_only=True)
class RunStatusChanged(Record):
    """The run's status changed."""

    WIRE = "run_status_changed"
    status: RunStatus = wire(STATUS)


@attrs.frozen(kw_only=True)
class UnknownRecord(Record):
    """A record of a type this build does not read: kept, never dropped, passed over."""

    WIRE = ""
    type: str
    data: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class LeaseTaken(Record):
    """A runner took the run's lease: its first write carries its fencing token.

    ``token`` grows with every new holder (the lease store's revision when it was
    taken); a write by a holder with an older token after this record is refused.
    """

    WIRE = "lease_taken"
    holder: str = wire(STR)
    token: int = wire(INT)
    attempt: str | None = wire(STR, required=False)


@attrs.frozen(kw_only=True)
class ResumeRefused(Record):
    """A detached runner's refusal, in the run's log (R12), with the hint of remedy() (C10)."""

    WIRE = "resume_refused"
    code: str = wire(STR)
    rule: str = wire(STR)
    hint: str = wire(STR)
    attempt: str | None = wire(STR, required=False)


@attrs.frozen(kw_only=True)
class OrphanSwept(Record):
    """The orphan sweeper took a queued attempt no runner claimed within the cutoff (L4):
    it published the attempt's delivery again (``parked`` False) or, when that one too
    went unclaimed past the cutoff, parked the run (``parked`` True)."""

    WIRE = "orphan_swept"
    attempt: str = wire(STR)
    parked: bool = wire(BOOL)
    reason: str = wire(STR, required=False, default="")


KNOWN_RECORDS: tuple[type[Record], ...] = (
    RunStarted,
    RunResumed,
    NodeFinished,
    RunRewound,
    ScratchBanked,
    ScratchRestored,
    SandboxShared,
    ScratchForsaken,
    AttemptQueued,
    AttemptClaimed,
    RunStatusChanged,
    LeaseTaken,
    ResumeRefused,
    OrphanSwept,
)
