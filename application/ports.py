"""The ports the use cases drive. Each has one contract test suite every adapter passes.

Ports are Protocols so that an engine can implement one over what it already has
(its own event log, its own object store) without inheriting from us.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable

import attrs

from scratchbank.domain.errors import ScratchbankError
from scratchbank.domain.objects import BankStamp, StoredObject
from scratchbank.domain.records import Record

from .retry import Deadline


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
      leaves an object no record names.
    - ``fetch`` streams exactly the named object into ``dest`` and returns its size and
      digest; BankGone only when the store says it does not exist, BankReadFailed for
      any failure a later read may cure (a kept checksum that does not match, its
      ``deadline``), HostileArchive past ``max_bytes`` (never reads more than max + 1),
      InvalidBankObject for a name that is not a bank object's.
    - ``delete`` removes one object (and any dead put's temporary file of the run);
      ``sweep`` removes everything of the run. Both are idempotent.
    - ``stat`` says what the store holds under a name (size and SHA-256) without
      handing the bytes over, or None; BankReadFailed when it cannot tell.
    - ``objects`` lists the run's objects with their stamps (the legacy key with none).
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

    def objects(self, run_id: str) -> Sequence[StoredObject]: ...


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

    ``token`` names the staging directory; ``received`` and ``sha256`` are what the
    sandbox read from the stream (the host compares them with what it sent).
    """

    token: str
    received: int
    sha256: str


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
      (``json.dumps([path, kind, size])``, see manifest.py) per entry, in any order.
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
