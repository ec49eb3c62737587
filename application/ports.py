"""Every port the use cases drive, in one module. Each has one contract test suite
every adapter passes.

Ports are Protocols so that an engine can implement one over what it already has
(its own event log, its own object store) without inheriting from us. Here: the
timeline and snapshot store, the bank store, the sandbox (and its quiesced pass,
``quiesce_and_archive``, the helper the contracts and the teardown share), the restore
target a resume restores into (a sandbox's scratch or a host directory), the run lock;
the runner's ports (a delivery queue, a lease, a sandbox provider, an engine); the clock;
the gzip compressor; a restore's progress callback.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable

import attrs

from scratchbank.domain.admission import Consents
from scratchbank.domain.checkpoints import Checkpoint
from scratchbank.domain.errors import ArchiveFailed, ExecFailed, SandboxGone, ScratchbankError, StreamBroken
from scratchbank.domain.fold import Bank
from scratchbank.domain.objects import BankStamp, StoredObject
from scratchbank.domain.records import Record
from scratchbank.domain.restore import RestoreAttempt

from .cancellation import Cancel, Deadline


class Timeline(Protocol):
    """A run's records, in order, appended with optimistic concurrency.

    ``read`` raises TimelineUnreadable when the store cannot be read or a known record
    is malformed; it never answers an empty history for a history it could not read
    (R15). ``append`` raises TimelineConflict when ``expected`` is given and the
    timeline no longer has that many records (another writer won). Either may raise
    TimelineBusy when the store is merely under load (retryable, never R15).
    """

    def read(self, run_id: str) -> Sequence[Record]: ...

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        """Append records; return the timeline's new length."""
        ...


class SnapshotStore(Protocol):
    """Where folded states are cached for long timelines. A cache: losing it costs time.

    ``load`` returns (position, data) of the latest snapshot, or None. ``read_after``
    yields the records after the first ``position`` ones, possibly lazily (a fold over it
    then holds what the store hands over at a time; errors are raised while iterating).
    """

    def load_snapshot(self, run_id: str) -> tuple[int, dict[str, Any]] | None: ...

    def save_snapshot(self, run_id: str, position: int, data: dict[str, Any]) -> None: ...

    def read_after(self, run_id: str, position: int) -> Iterable[Record]: ...


class Placed(str):
    """A put's answer: the object's name, and whether this put created it (``created``).
    False: the object was there already (another put of the same content created it,
    maybe an older one a prune may be deleting), or the store cannot tell. A teardown
    whose put created its object, named by no record before its own, skips A17's look
    after its record (ADR 0006: no prune can have taken it)."""

    created: bool

    def __new__(cls, name: str, created: bool = False) -> Placed:
        placed = super().__new__(cls, name)
        placed.created = created
        return placed


@attrs.frozen
class StoredBank:
    """What a store holds for a run: how many bytes, and their SHA-256."""

    bytes: int
    sha256: str


class BankStore(Protocol):
    """Where banks are kept: content-named, create-only objects beneath each run (A17,
    ADR 0006), swept with the run (T3).

    An object's ``name`` is ``banks/<sha256>.tgz`` relative to its run; ``None`` names
    the run's legacy fixed key (a bank recorded before objects had names).

    Contract (``scratchbank.testing.contracts.check_bank_store``):
    - ``put`` creates the object named by ``sha256`` from a host file and returns its
      name; it never replaces an object (create-only: S3 ``If-None-Match``, a hard link on
      files); an existing object of that name is the same content and the put succeeds
      (idempotent). A reader sees the whole object or none. ``stamp`` is kept with the
      object (N3). Failures raise BankWriteFailed, and so does a put still unfinished at
      its ``deadline`` (None: the store's own default); a put that lands after it only
      leaves an object no record names. A ``Placed`` answer says whether this put
      created the object (a plain name: it cannot tell, read as "it was there").
    - ``fetch`` streams exactly the named object into ``dest`` and returns its size and
      digest; BankGone only when the store says it does not exist, BankReadFailed for
      any failure a later read may cure (a kept checksum that does not match, its
      ``deadline``), HostileArchive past ``max_bytes`` (never reads more than max + 1),
      InvalidBankObject for a name that is not a bank object's.
    - ``delete`` removes one object (and any dead put's temporary file of the run);
      ``sweep`` removes everything of the run. Both are idempotent.
    - ``stat`` says what the store holds under a name (size and SHA-256) without
      handing the bytes over, or None; BankReadFailed when it cannot tell.
    - ``objects`` lists the run's objects with their stamps (the legacy key with none);
      those in ``named`` (the names the caller's records give, whose stamps it never
      reads) may come without theirs (S3: no HEAD each; issue 26). Each bank object's
      ``stored_at`` is when the store created it, and the answer a ``Listing`` whose
      ``now`` is the store's time in the same conversation, both by the store's own clock
      (S3: ``LastModified`` and the LIST's ``Date``; files: mtimes), never a process's:
      A17's bound ages by them alone. A store that cannot say leaves them None (nothing
      it lists is ever swept as aged); a re-put of an existing object keeps its time.
    - ``keeps_banks`` False: a store that keeps none (T20 names it).
    """

    keeps_banks: bool

    def put(
        self,
        run_id: str,
        archive: Path,
        *,
        sha256: str,
        stamp: BankStamp | None = None,
        deadline: Deadline | None = None,
    ) -> str: ...

    def fetch(
        self,
        run_id: str,
        dest: BinaryIO,
        *,
        max_bytes: int,
        name: str | None = None,
        deadline: Deadline | None = None,
    ) -> StoredBank: ...

    def delete(self, run_id: str, name: str | None = None) -> None: ...

    def sweep(self, run_id: str) -> None: ...

    def stat(self, run_id: str, name: str | None = None) -> StoredBank | None: ...

    def objects(self, run_id: str, *, named: Collection[str | None] = ()) -> Sequence[StoredObject]: ...


class ForwardingBankStore:
    """A bank store passing every call to ``inner`` after ``before(call, run_id)``: a
    proxy (the fenced store, a test's held store) overrides only ``before``."""

    #: the calls that write the store (``before`` sees these names, and the reads')
    WRITES = frozenset({"put", "delete", "sweep"})

    def __init__(self, inner: BankStore) -> None:
        self.inner, self.keeps_banks = inner, inner.keeps_banks

    def before(self, call: str, run_id: str) -> None:
        """Ahead of every call (``put``, ``fetch``, ``delete``, ``sweep``, ``stat``,
        ``objects``); raising refuses it, the inner store untouched."""

    def put(
        self,
        run_id: str,
        archive: Path,
        *,
        sha256: str,
        stamp: BankStamp | None = None,
        deadline: Deadline | None = None,
    ) -> str:
        self.before("put", run_id)
        return self.inner.put(run_id, archive, sha256=sha256, stamp=stamp, deadline=deadline)

    def fetch(
        self,
        run_id: str,
        dest: BinaryIO,
        *,
        max_bytes: int,
        name: str | None = None,
        deadline: Deadline | None = None,
    ) -> StoredBank:
        self.before("fetch", run_id)
        return self.inner.fetch(run_id, dest, max_bytes=max_bytes, name=name, deadline=deadline)

    def delete(self, run_id: str, name: str | None = None) -> None:
        self.before("delete", run_id)
        self.inner.delete(run_id, name)

    def sweep(self, run_id: str) -> None:
        self.before("sweep", run_id)
        self.inner.sweep(run_id)

    def stat(self, run_id: str, name: str | None = None) -> StoredBank | None:
        self.before("stat", run_id)
        return self.inner.stat(run_id, name)

    def objects(self, run_id: str, *, named: Collection[str | None] = ()) -> Sequence[StoredObject]:
        self.before("objects", run_id)
        return self.inner.objects(run_id, named=named)


@attrs.frozen
class SandboxFacts:
    """What the domain needs to know of a sandbox, read when it started (T1, T11)."""

    scratch: str
    host_backed: bool
    process_isolated: bool
    isolation: str  # why: "own PID namespace", "--pid=host", "Podman pidns=host", ...
    engine: str = ""


@attrs.frozen
class QuiesceReport:
    """What the quiesce did: refused before any signal, stopped all, or partial (T12, T13)."""

    quiesced: bool
    refused: bool
    reasons: tuple[str, ...] = ()
    stopped: int = 0


@attrs.frozen
class ArchiveReport:
    """What tar saw: empty, or files (with the members it caught racing), and notices."""

    empty: bool
    raced: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()


@attrs.frozen
class QuiescedArchive:
    """One quiesced pass (T11-T14): what the quiesce did, what tar saw, and whether
    anything is left stopped for the caller to continue.

    ``archive`` is None when tar gave no archive: ``failure`` says why (ArchiveFailed,
    or the transport's error once the quiesce had reported); the quiesce stands either way.
    ``continued``: nothing is left stopped (the sandbox continued the processes itself
    after a pass that did not race, or the quiesce refused before any signal); False
    leaves ``continue_processes`` to the caller (T14).
    """

    quiesce: QuiesceReport
    archive: ArchiveReport | None
    continued: bool
    failure: ScratchbankError | None = None


class ByteSink(Protocol):
    """Where a stream of bytes goes (a file, or a sink that inspects it on the way)."""

    def write(self, data: bytes, /) -> int: ...


@attrs.frozen
class StagedRestore:
    """A bank extracted into a fresh directory beside the scratch, not yet in place.

    ``token`` names the staging directory; ``received`` and ``digest`` are what the
    sandbox read from the stream (its byte count and MD5: the host compares them with
    what it sent; ADR 0003, the restore stream's digest).
    """

    token: str
    received: int
    digest: str


class Sandbox(Protocol):
    """A running sandbox, as banking and restoring need it.

    Contract (``scratchbank.testing.contracts.SandboxContract``):
    - ``quiesce`` stops every other process, or reports why it could not; it never
      raises for a refusal (that is a report), only for a sandbox that is gone
      (SandboxGone) or an exec that failed (ExecFailed).
    - ``continue_processes`` continues whatever the quiesce stopped; idempotent.
    - ``archive`` streams the scratch as a tar (gzip'd when ``compress``) into ``dest``;
      raises ArchiveFailed for a tar failure that is not a race, SandboxGone when the
      sandbox is gone (T19).
    - Every call that takes a ``deadline`` ends by it (plus the transport's grace):
      StreamBroken when a stream was cut, ExecFailed otherwise; a writer thread's error
      is raised, never swallowed (``check_stall`` proves it per transport).
    - ``stage_restore`` reads ``src`` to its end and, in one exec, extracts it into a
      fresh staging directory beside the scratch (never into the scratch), digests what
      it read and writes the staged tree to ``listing``: one manifest line
      (``json.dumps([path, kind, size])``, see bank_format/manifest_line.py) per entry, in any order.
      The scratch is not touched. ``need_bytes`` (the bank's declared total) is
      checked against the free space first: less is a RestoreRefused. Raises
      RestoreRefused when tar refused the stream (nothing stays staged) and
      StreamBroken when the stream did not arrive whole (X2).
    - ``commit_restore`` moves a staged tree into place as the scratch;
      ``discard_restore`` removes it (idempotent). Until one of them runs, the scratch
      is byte for byte as it was.
    - ``list_scratch`` lists the scratch as sorted manifest lines (names may hold any
      byte but NUL and ``/``).
    """

    facts: SandboxFacts

    def quiesce(
        self, *, budget_seconds: int, wait_seconds: int, deadline: Deadline | None = None
    ) -> QuiesceReport: ...

    def continue_processes(self, *, deadline: Deadline | None = None) -> None: ...

    def archive(
        self, dest: ByteSink, *, compress: bool, verify: bool, deadline: Deadline | None = None
    ) -> ArchiveReport: ...

    def stage_restore(
        self, src: BinaryIO, *, compressed: bool, listing: ByteSink, need_bytes: int = 0
    ) -> StagedRestore: ...

    def commit_restore(
        self, staged: StagedRestore, *, dir_modes: Iterable[tuple[str, int]] = ()
    ) -> str | None:
        """Apply ``dir_modes`` ((path, mode), deepest first; "" the root: the stream
        carried directories u+rwx) and move the staged tree into place; a note on
        anything left behind (X4: the restore is done once the tree is in place).
        Raises RestoreRefused when nothing was moved."""
        ...

    def discard_restore(self, staged: StagedRestore) -> None: ...

    def list_scratch(self) -> list[str]: ...


class QuiescingSandbox(Protocol):
    """A Sandbox that quiesces, archives and continues in one call (one exec for the
    scripted sandboxes). Optional: ``teardown.quiesce_and_archive`` builds the same call
    from ``quiesce`` and ``archive`` for a sandbox without it.

    Contract (``SandboxContract``): quiesce as ``quiesce`` does, archive into ``dest``
    verifying unless every process stopped, and continue the processes itself only
    after a pass that did not race (``QuiescedArchive.continued``); a race or a failure
    leaves them stopped for the caller, which may tar again first (T16) and continues
    them (T14). A failing archive is a report (``failure``), never a lost quiesce; only
    an exec that broke before the quiesce reported raises.
    """

    def quiesce_and_archive(
        self,
        dest: ByteSink,
        *,
        budget_seconds: int,
        wait_seconds: int,
        compress: bool,
        deadline: Deadline | None = None,
    ) -> QuiescedArchive: ...


#: The host's verdict on a staged tree (its StagedRestore and its listing, a file of
#: manifest lines): the directory modes to commit with (deepest first), or None to
#: discard it. Called once, from whichever thread reads the exec's output.
Decide = Callable[[StagedRestore, BinaryIO], Iterable[tuple[str, int]] | None]


@runtime_checkable
class RestoresInOneExec(Protocol):
    """A sandbox that stages, waits for the host's verdict and commits or discards, all
    in ONE exec (stage_restore + commit_restore / discard_restore without the second
    exec's cost). Same guarantees as the two calls: until ``decide`` answers with modes,
    the scratch is byte for byte as it was; a None verdict (or ``decide`` raising, or
    the exec ending before it answered) leaves nothing staged."""

    def restore_in_one_exec(
        self,
        src: BinaryIO,
        *,
        compressed: bool,
        need_bytes: int,
        decide: Decide,
        entries: int | None = None,
    ) -> str | None:
        """The commit's note ("" when none) once the tree is in place; None when the
        host's verdict discarded it. Raises as stage_restore and commit_restore do, and
        re-raises what ``decide`` raised (after discarding). ``entries`` (the manifest's,
        None when unknown) bounds the listing the sandbox may send: past it,
        OutputOverBound (a refusal in the sandbox)."""
        ...


class RestoreTarget(Protocol):
    """Where a resume restores a checked bank (X1-X6): a sandbox's scratch
    (``restore.SandboxTarget`` over the Sandbox port's restore calls) or a host directory
    (``adapters.host_directory.HostDirectory``). The use cases hold one and never the Path.

    Contract (``scratchbank.testing.contracts.RestoreTargetContract``, every target):
    - ``restore`` fetches exactly the object the record names (A17) from ``store``, never
      more than ``cap`` bytes, checks it (size and digest as recorded, gunzip, the
      allow-list, the manifest) and puts its tree in place; it answers RESTORED with the
      bank's bytes and a note on anything left behind ("" when none).
    - A refusal (a named error raised, or an attempt that is not RESTORED) leaves the
      target byte for byte as it was: nothing is moved into place before the verdict.
    - ``cancel`` cut (L5): the restore stops at its next member or chunk, LEASE_LOST, and
      nothing is moved into place.
    - ``hands_over``: the restored tree leaves scratchbank's care (a host directory: X6,
      the scratch will never bank again); False for a sandbox.
    """

    @property
    def hands_over(self) -> bool: ...

    def restore(
        self,
        run_id: str,
        bank: Bank,
        *,
        store: BankStore,
        cap: int,
        progress: Progress | None = None,
        cancel: Cancel | None = None,
    ) -> RestoreAttempt: ...


# ---- The run's lock (A16, ADR 0007) ----------------------------------------------------


@attrs.frozen
class LockGrant:
    """A held lease on a run's lock: ``token`` grows with every new holder (and with an
    operator's break), so a grant whose token is no longer the lock's is fenced.
    ``since`` and ``expires`` are the lock store's own clock (PostgreSQL's ``now()``)."""

    run_id: str
    holder: str
    token: int
    since: datetime
    expires: datetime


@attrs.frozen
class LockHolder:
    """What ``status`` shows of a run's lock: who holds it, since when, with which token,
    and whether the lease is still live by the store's clock (False: lapsed, takeable)."""

    holder: str
    token: int
    since: datetime
    expires: datetime
    live: bool


class RunLock(Protocol):
    """One live holder per run at a time; a holder that stops refreshing lapses (A16).

    Contract (``scratchbank.testing.contracts.RunLockContract``):
    - ``acquire`` answers a grant, or None while another holder is live (its lease not
      expired by the store's clock); it excludes other threads of this process as well
      as other processes; a lapsed lease is taken over with a greater token.
    - ``refresh`` extends the lease; LockLost once the grant's token is not the lock's
      (taken over after a lapse, or broken).
    - ``release`` is idempotent and never releases another holder's lease.
    - ``holder`` says who holds the lock (live or lapsed), None when nobody ever did or
      the last holder released it.
    - ``break_lock`` (an operator's action) ends whatever lease is there and bumps the
      token, so the old holder's next refresh is LockLost; it answers what it broke.
    - Every call ends by the store's deadline: LockUnavailable, never a hang.
    """

    def acquire(self, run_id: str, holder: str, *, ttl: float) -> LockGrant | None: ...

    def refresh(self, grant: LockGrant, *, ttl: float) -> LockGrant: ...

    def release(self, grant: LockGrant) -> None: ...

    def holder(self, run_id: str) -> LockHolder | None: ...

    def break_lock(self, run_id: str, *, by: str) -> LockHolder | None: ...


#: What one try of a quiesced pass may fail with and be tried again (T8).
TRY_FAILURES = (SandboxGone, ExecFailed, StreamBroken, ArchiveFailed)


def quiesce_and_archive(
    sandbox: Sandbox,
    dest: ByteSink,
    *,
    budget_seconds: int,
    wait_seconds: int,
    compress: bool,
    deadline: Deadline | None = None,
) -> QuiescedArchive:
    """One quiesced pass (T11-T14): the sandbox's own call where it offers one
    (``QuiescingSandbox``), else ``quiesce`` then ``archive`` (verifying unless every
    process stopped), which leaves continuing to the caller.

    Asked by attribute, not ``isinstance``: a proxy that forwards through ``__getattr__``
    (a timing wrapper) offers it too."""
    own = getattr(sandbox, "quiesce_and_archive", None)
    if callable(own):
        done: QuiescedArchive = own(
            dest,
            budget_seconds=budget_seconds,
            wait_seconds=wait_seconds,
            compress=compress,
            deadline=deadline,
        )
        return done
    report = sandbox.quiesce(budget_seconds=budget_seconds, wait_seconds=wait_seconds, deadline=deadline)
    try:
        archived = sandbox.archive(dest, compress=compress, verify=not report.quiesced, deadline=deadline)
    except TRY_FAILURES as error:
        return QuiescedArchive(report, None, report.refused, error)
    return QuiescedArchive(report, archived, report.refused)


# --- The runner's ports: a delivery queue, a lease, a sandbox provider, an engine. Each has
# a real adapter over a server (NATS JetStream for the queue and the lease) and an
# in-process one for the embedded default; both pass the same contract tests. The runner
# is synchronous: an adapter over an async client runs its own loop.


@attrs.frozen
class ResumeDelivery:
    """One published resume: the run, the attempt it was published for, its consents (C5).

    ``msg_id`` de-duplicates a publication the publisher sent twice. ``republished``
    counts the orphan sweeper's publications of the same attempt (a new message id,
    the same resume: the same attempt and consents).
    """

    run_id: str
    attempt: str
    consents: Consents = Consents()
    republished: int = 0
    #: the checkpoint the engine resumes from (ADR 0013); None: the events decide (K5)
    checkpoint: Checkpoint | None = None

    @property
    def msg_id(self) -> str:
        again = f".r{self.republished}" if self.republished else ""
        return f"{self.run_id}.{self.attempt}{again}"


class Inbound(Protocol):
    """A delivery as the runner holds it until it acks or naks it."""

    delivery: ResumeDelivery
    deliveries: int  # how many times it was delivered, this one included (1-based)

    def ack(self) -> None: ...

    def nak(self, delay: float) -> None:
        """Deliver it again after ``delay`` seconds."""
        ...

    def in_progress(self) -> None:
        """Tell the queue the runner is still working on it (resets its ack wait)."""
        ...


class DeliveryQueue(Protocol):
    """Where resumes are published and from which runners fetch them.

    Contract: ``publish`` answers False for a publication it already holds (same
    ``msg_id``); a fetched delivery not acked is delivered again (after ``nak``'s delay,
    or after the ack wait); an acked one never is.
    """

    def publish(self, delivery: ResumeDelivery) -> bool: ...

    def fetch(self, timeout: float) -> Inbound | None: ...


@attrs.frozen
class LeaseGrant:
    """A held lease: ``token`` is its fencing token (grows with each new holder);
    ``revision`` is what the next refresh compares and sets."""

    run_id: str
    holder: str
    token: int
    revision: int


class OutboxListing(Protocol):
    """The timeline's outbox: runs queued and unclaimed since at or before ``before``."""

    def queued_unclaimed(self, before: datetime) -> Sequence[str]: ...


class Lease(Protocol):
    """One holder per run at a time; an unrefreshed lease lapses.

    Contract: ``acquire`` answers None while another holder's lease is alive; a lapsed
    lease can be taken, with a token greater than every earlier holder's. ``refresh``
    raises LeaseLost once the lease lapsed and was taken (or vanished). ``release``
    is idempotent and never releases another holder's lease.
    """

    def acquire(self, run_id: str, holder: str) -> LeaseGrant | None: ...

    def refresh(self, grant: LeaseGrant) -> LeaseGrant: ...

    def release(self, grant: LeaseGrant) -> None: ...


class SandboxProvider(Protocol):
    """Starts a fresh sandbox for a run, and tears one down.

    ``orphans`` finds the run's sandboxes this provider did not start: those a runner
    whose lease lapsed left behind (killed or cut off before its teardown). The new
    holder banks them when that is safe, then stops them, before its own claim.
    """

    def start(self, run_id: str, attempt: str | None = None) -> Sandbox: ...

    def stop(self, sandbox: Sandbox) -> None: ...

    def orphans(self, run_id: str) -> Sequence[Sandbox]: ...


class EngineEnd(enum.Enum):
    """How the engine returned: a park or failure can be resumed (L2 arms its ceiling)."""

    PARKED = "parked"
    FAILED = "failed"
    FINISHED = "finished"
    CANCELLED = "cancelled"

    @property
    def resume_can_wait(self) -> bool:
        return self is not EngineEnd.FINISHED


class Engine(Protocol):
    """Continues a run inside a sandbox until it parks, fails, finishes or is cancelled.

    Every write goes through ``timeline`` (the runner hands a fenced one). ``cancel``
    is set when the runner loses its lease (L5).
    """

    def continue_run(
        self, run_id: str, *, sandbox: Sandbox, timeline: Timeline, cancel: threading.Event
    ) -> EngineEnd: ...


# --- Time, as the use cases see it: a port so that budgets are testable without waiting.
#
# ``monotonic`` and ``sleep`` measure budgets; ``wait`` is a sleep an event ends early
# (the lease keeper's interval, until it is stopped); ``now`` stamps the records a use case
# writes (``at``, in UTC), so that a record says when it was written by the clock the
# engine gave, never by a clock the record's reader cannot see.


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait until ``event`` is set or ``seconds`` pass on this clock; is it set?"""
        ...

    def now(self) -> datetime:
        """The wall-clock time in UTC (timezone-aware)."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)

    def now(self) -> datetime:
        return datetime.now(UTC)


# --- The gzip compressor a bank is written with (bank_format/gzip_codec.py holds the codecs).


class Compressor(Protocol):
    """What zlib's and isal_zlib's compress objects share."""

    def compress(self, data: bytes, /) -> bytes: ...

    def flush(self) -> bytes: ...


#: A restore's progress callback: (phase, bytes done, bytes in all).
Progress = Callable[[str, int, int], None]
