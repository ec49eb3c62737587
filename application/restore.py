"""The restore (X1-X6): bring a bank back safely into a RestoreTarget (application/ports.py):
a sandbox's scratch (``SandboxTarget``, here) or a host directory (the adapter
adapters/host_directory.py: checked whole first, then written under directory fds into
a fresh sibling and swapped into place). ``restore_bank`` turns whatever a target meets
into a named RestoreAttempt (``attempt_of``: the one table for restore and resume).

Into a sandbox, as ONE pipeline (issue 14 item 2): the store streams the bank into
the host check (size and digest as recorded, gunzip, the allow-list), whose accepted
members are re-serialised as a canonical archive and written into a pipe that the
sandbox's exec reads, all at once: a producer thread runs fetch, check and canonical
writer (zlib and hashlib release the GIL) while the transport streams. Nothing is
staged in full on the host. It is safe because the sandbox extracts into a fresh
staging directory that only moves into place after the host's verdict: the stream
checked whole (size, digest, manifest), what the sandbox read is what was sent, and
the staged tree's listing equals the manifest (compared on the host, on disk). A host
refusal met mid-stream ends the stream and discards the staging directory, and is
reported REFUSED_ON_HOST, never as a broken stream. Any refusal leaves the scratch
byte for byte as it was.
"""

from __future__ import annotations

import contextlib
import enum
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO, TypeVar, cast

import attrs

from scratchbank.domain.errors import (
    BankGone,
    BankMismatch,
    BankReadFailed,
    DestinationRefused,
    ExecFailed,
    HostileArchive,
    InvalidBankObject,
    LeaseLost,
    OutputOverBound,
    RestoreRefused,
    SandboxGone,
    ScratchbankError,
    StreamBroken,
    TimelineUnreadable,
    TimelineWriteFailed,
)
from scratchbank.domain.fold import Bank
from scratchbank.domain.records import ScratchBanked
from scratchbank.domain.restore import RestoreAttempt, RestoreResult
from scratchbank.domain.resume_gate import ResumeDecision
from scratchbank.domain.teardown import CAP_BYTES

from .bank_format.bank_check import BankCheck
from .bank_format.listing import load_listing
from .bank_format.reader import Limits
from .bank_format.spill_log import Manifest
from .bank_format.writer import CanonicalWriter, dir_modes
from .cancellation import Cancel
from .ports import BankStore, Decide, Progress, RestoresInOneExec, RestoreTarget, Sandbox, StagedRestore

__all__ = ["CHOSEN", "GZIP_BELOW", "SandboxTarget", "restore_bank", "stream_gzip_level"]

T = TypeVar("T")


class Choose(enum.Enum):
    """The restore stream's form left to ``stream_gzip_level`` (the engine, the bank)."""

    BY_ENGINE_AND_BANK = "by engine and bank"


CHOSEN = Choose.BY_ENGINE_AND_BANK

#: Per sandbox engine (``SandboxFacts.engine``): the largest bank ratio (the bank's stored
#: gzip bytes over its manifest's file bytes) at which the canonical stream goes into the
#: sandbox gzipped (ISA-L level 1 on the host, ``tar xzf`` inside); above it, or for an
#: engine not named here, a plain tar. Measured per engine (ADR 0003, addendum 2026-12-02:
#: the figures): gzip pays where the transport costs more per byte than the host's
#: deflate and the sandbox's inflate, and only on a bank that compresses. The local
#: sandbox (a pipe) stays plain: 18 MiB / 2,901 files, 5 interleaved runs, plain 6.1 s
#: median, gzip level 1 7.2 s. A caller may force a form (``gzip_level`` an int or None).
GZIP_BELOW: dict[str, float] = {"docker": 0.6, "kubernetes": 0.8}


#: restore.sh's words for a sandbox that cannot inflate a gzipped stream (it exits 20
#: before reading it): the chosen form then falls back to a plain tar.
NO_GUNZIP = "no gunzip in this sandbox"


def stream_gzip_level(engine: str, bank: ScratchBanked) -> int | None:
    """The restore stream's gzip level into a sandbox of ``engine`` for ``bank`` (None: a
    plain tar): level 1 when the engine's transport is worth it (``GZIP_BELOW``) and the
    bank compresses at least that well; a record without its manifest's bytes: plain."""
    below = GZIP_BELOW.get(engine)
    if below is None or not bank.manifest_bytes:
        return None
    return 1 if bank.bytes <= below * bank.manifest_bytes else None


def restore_bank(
    run_id: str,
    decision: ResumeDecision,
    *,
    store: BankStore,
    sandbox: Sandbox | None = None,
    into: RestoreTarget | None = None,
    cap: int = CAP_BYTES,
    progress: Progress | None = None,
    gzip_level: int | Choose | None = CHOSEN,
    cancel: Cancel | None = None,
) -> RestoreAttempt:
    """Try to restore the decision's bank; say what happened as a RestoreAttempt (X1-X6).

    ``into``: the restore target (a host directory's adapter, a sandbox's SandboxTarget);
    ``sandbox``: the same as ``into=SandboxTarget(sandbox, gzip_level)`` when ``into`` is None.
    ``gzip_level``: the stream's form, forced (an int, None a plain tar) or ``CHOSEN`` by
    the sandbox's engine and the bank (``stream_gzip_level``).
    ``cap``: the most bytes fetched, never below the bank's recorded size (a bank the host
    banked under a larger teardown cap is restored, not refused as over the cap).
    ``cancel``: the lease's run context (L5). Once cut, the stream stops at its next
    member or chunk and the staged tree is discarded (LEASE_LOST, read again: X5); cut before,
    nothing is fetched.
    """
    assert decision.bank is not None
    # The host itself measured and recorded this many bytes when it banked (under the
    # teardown's cap, which may be larger than a restore's default): never refuse them.
    cap = max(cap, decision.bank.record.bytes)
    if into is None and sandbox is not None:
        into = SandboxTarget(sandbox, gzip_level)
    if into is None:
        return RestoreAttempt(RestoreResult.NO_SANDBOX, detail="the resume runs without a sandbox")
    if cancel is not None and cancel.is_set():
        return attempt_of(lease_cut(cancel))
    try:
        return into.restore(run_id, decision.bank, store=store, cap=cap, progress=progress, cancel=cancel)
    except ScratchbankError as error:
        return attempt_of(error)


@attrs.frozen
class SandboxTarget:
    """A sandbox's scratch as a RestoreTarget: the one pipeline of this module's docstring
    (``gzip_level``: the canonical stream's, None a plain tar, ``CHOSEN`` by
    ``stream_gzip_level`` for the sandbox's engine and the bank)."""

    sandbox: Sandbox
    gzip_level: int | Choose | None = CHOSEN

    @property
    def hands_over(self) -> bool:
        return False

    def restore(
        self,
        run_id: str,
        bank: Bank,
        *,
        store: BankStore,
        cap: int,
        progress: Progress | None = None,
        cancel: Cancel | None = None,
    ) -> RestoreAttempt:
        level = self.level_for(bank)

        def attempt_at(gzip_level: int | None) -> RestoreAttempt:
            return _into_sandbox(
                run_id,
                bank,
                self.sandbox,
                store=store,
                cap=cap,
                progress=progress,
                gzip_level=gzip_level,
                cancel=cancel,
            )

        attempt = attempt_at(level)
        if (
            level is not None
            and isinstance(self.gzip_level, Choose)
            and attempt.result is RestoreResult.STREAM_BROKEN
            and NO_GUNZIP in attempt.detail
        ):
            # The sandbox refused the gzipped stream before reading it or making anything
            # (restore.sh's probe): the chosen form falls back to a plain tar, once.
            attempt = attempt_at(None)
        return attempt

    def level_for(self, bank: Bank) -> int | None:
        """The stream's gzip level for ``bank``: as forced, or chosen (``stream_gzip_level``)."""
        if isinstance(self.gzip_level, Choose):
            return stream_gzip_level(self.sandbox.facts.engine, bank.record)
        return self.gzip_level


#: Named failures -> what they mean for the restore (X4: the bank is lost; X5: read again).
_RESULTS: tuple[tuple[type[ScratchbankError], RestoreResult], ...] = (
    (OutputOverBound, RestoreResult.REFUSED_IN_SANDBOX),  # before StreamBroken: the sandbox's own fault
    (BankGone, RestoreResult.GONE),
    (BankReadFailed, RestoreResult.READ_FAILED),
    (HostileArchive, RestoreResult.REFUSED_ON_HOST),
    (BankMismatch, RestoreResult.REFUSED_ON_HOST),
    (InvalidBankObject, RestoreResult.REFUSED_ON_HOST),  # A17: a name out of the bank prefix
    (DestinationRefused, RestoreResult.REFUSED_ON_HOST),
    (RestoreRefused, RestoreResult.REFUSED_IN_SANDBOX),
    (TimelineUnreadable, RestoreResult.READ_FAILED),
    (TimelineWriteFailed, RestoreResult.READ_FAILED),
    (StreamBroken, RestoreResult.STREAM_BROKEN),
    (ExecFailed, RestoreResult.STREAM_BROKEN),
    (SandboxGone, RestoreResult.STREAM_BROKEN),
)


def attempt_of(error: BaseException) -> RestoreAttempt:
    """The RestoreAttempt a failure stands for: the one table for restore and resume alike.

    A named failure reads as its kind (X4 loses the bank, X5 reads again); any other
    named failure reads again (X5); anything unnamed is UNEXPECTED (parked like X5).
    """
    if not isinstance(error, ScratchbankError):
        return RestoreAttempt(RestoreResult.UNEXPECTED, detail=f"{type(error).__name__}: {error}")
    for kind, result in _RESULTS:
        if isinstance(error, kind):
            return RestoreAttempt(result, detail=f"{error.code}: {error.message}")
    return RestoreAttempt(RestoreResult.READ_FAILED, detail=f"{error.code}: {error.message}")


# -- into a sandbox: one pipeline ---------------------------------------------------------------
class _PipeOut:
    """The write end of the pipe into the sandbox; remembers that the reader went away.

    Buffered: the canonical writer hands over a 512-byte header per member, and one
    write each woke the reading thread for nothing (measured: 0.2 s of 1.3 s of host CPU
    on the 3,649-member source tree)."""

    BUFFER = 1 << 18

    def __init__(self, fd: int) -> None:
        self._file = os.fdopen(fd, "wb", buffering=self.BUFFER)
        self.broken = False
        self.bytes = 0

    def write(self, data: bytes) -> int:
        try:
            self._file.write(data)
        except OSError:
            self.broken = True
            raise
        self.bytes += len(data)
        return len(data)

    def close(self) -> None:
        try:
            self._file.close()  # flushes what is buffered
        except OSError:
            self.broken = True


@attrs.define
class _Produced:
    """What the producer thread ended with."""

    manifest: Manifest | None = None
    error: BaseException | None = None
    bytes: int = 0


def lease_cut(cancel: Cancel) -> LeaseLost:
    return LeaseLost(f"the restore was cut: {cancel.why or 'the run context was cancelled'}")


def unless_cut(cancel: Cancel | None, call: Callable[[T], None]) -> Callable[[T], None]:
    """``call``, refusing (LEASE_LOST) once the run context is cut (L5): the check's member
    and data callbacks ride it, so the bank's stream stops at its next member or chunk."""
    if cancel is None:
        return call

    def guarded(item: T) -> None:
        if cancel.is_set():
            raise lease_cut(cancel)
        call(item)

    return guarded


def _produce(
    run_id: str,
    check: BankCheck,
    store: BankStore,
    writer: CanonicalWriter,
    out: _PipeOut,
    cap: int,
    result: _Produced,
) -> None:
    try:
        # A17: exactly the object the record names (None: a record from before objects had names)
        store.fetch(run_id, check, max_bytes=cap, name=check.record.object)  # type: ignore[arg-type]  # fetch only writes
        result.manifest = check.finish()
        writer.finish()
        result.bytes = writer.bytes
    except BaseException as error:  # reported by the caller, which decides what it means
        result.error = error
    finally:
        out.close()


@contextlib.contextmanager
def _pipeline(
    run_id: str,
    bank: Bank,
    store: BankStore,
    cap: int,
    progress: Progress | None,
    gzip_level: int | None,
    cancel: Cancel | None = None,
) -> Iterator[tuple[BinaryIO, _Produced, BankCheck, _PipeOut, threading.Thread]]:
    read_fd, write_fd = os.pipe()
    out = _PipeOut(write_fd)
    # No digest here: the framing's (the sandbox adapter's) is the stream's one (issue 24)
    writer = CanonicalWriter(out, gzip_level=gzip_level, writable_dirs=True, digest=False)  # type: ignore[arg-type]
    check = BankCheck(
        bank.record,
        limits=Limits(),
        cap=cap,
        on_member=unless_cut(cancel, writer.member),
        on_data=unless_cut(cancel, writer.data),
        progress=progress,
    )
    result = _Produced()
    thread = threading.Thread(
        target=_produce, args=(run_id, check, store, writer, out, cap, result), daemon=True
    )
    src = os.fdopen(read_fd, "rb")
    thread.start()
    try:
        yield src, result, check, out, thread
    finally:
        src.close()  # a producer still writing gets EPIPE and ends
        thread.join()
        check.close()


def _into_sandbox(
    run_id: str,
    bank: Bank,
    sandbox: Sandbox,
    *,
    store: BankStore,
    cap: int,
    progress: Progress | None,
    gzip_level: int | None,
    cancel: Cancel | None = None,
) -> RestoreAttempt:
    with _pipeline(run_id, bank, store, cap, progress, gzip_level, cancel) as (
        src,
        result,
        check,
        out,
        thread,
    ):
        refused: list[RestoreAttempt] = []

        def decide(staged: StagedRestore, listing: BinaryIO) -> Iterable[tuple[str, int]] | None:
            """The host's verdict on the staged tree: the stream whole, then the listing."""
            thread.join()  # the stream has ended: the producer has too
            verdict = _verdict(result, out, None, staged)
            if verdict is None and cancel is not None and cancel.is_set():  # L5: never committed once cut
                verdict = attempt_of(lease_cut(cancel))
            if verdict is None:
                comparison = load_listing(check.log, listing)
                if comparison.same:
                    return dir_modes(check.log)
                why = (
                    f"partial restore: {comparison.missing} expected entries missing or different, "
                    f"{comparison.unexpected} unexpected"
                )
                verdict = RestoreAttempt(RestoreResult.REFUSED_IN_SANDBOX, detail=why)
            refused.append(verdict)
            return None

        need = bank.record.manifest_bytes or 0
        try:
            note = _in_one_exec(sandbox).restore_in_one_exec(
                src,
                compressed=gzip_level is not None,
                need_bytes=need,
                decide=decide,
                entries=bank.record.manifest_entries,
            )
        except (RestoreRefused, StreamBroken, ExecFailed, SandboxGone) as error:
            if refused:
                return refused[0]
            src.close()
            thread.join()
            return _verdict(result, out, error, None) or attempt_of(error)
        if note is None:
            return refused[0] if refused else RestoreAttempt(RestoreResult.STREAM_BROKEN, detail="discarded")
        if progress is not None:
            progress("restored", bank.record.bytes, bank.record.bytes)
        return RestoreAttempt(RestoreResult.RESTORED, bank.record.bytes, detail=note)


def _in_one_exec(sandbox: Sandbox) -> RestoresInOneExec:
    """The sandbox itself when it restores in one exec, else its two phases as one call.

    Asked by attribute, not ``isinstance`` on the Protocol: from Python 3.12 that reads
    attributes statically, and a forwarding proxy (a decorator, a timing wrapper) would
    silently lose the one exec."""
    if getattr(sandbox, "restore_in_one_exec", None) is not None:
        return cast(RestoresInOneExec, sandbox)
    return _TwoPhases(sandbox)


@attrs.frozen
class _TwoPhases:
    """``restore_in_one_exec`` over stage_restore, then commit_restore or discard_restore."""

    sandbox: Sandbox

    def restore_in_one_exec(
        self,
        src: BinaryIO,
        *,
        compressed: bool,
        need_bytes: int,
        decide: Decide,
        entries: int | None = None,
    ) -> str | None:
        with tempfile.TemporaryFile() as listing:
            staged = self.sandbox.stage_restore(
                src, compressed=compressed, listing=listing, need_bytes=need_bytes
            )
            try:
                listing.seek(0)
                modes = decide(staged, listing)
            except BaseException:
                _discard(self.sandbox, staged)
                raise
        if modes is None:
            _discard(self.sandbox, staged)
            return None
        try:
            return self.sandbox.commit_restore(staged, dir_modes=modes) or ""
        except ScratchbankError:
            _discard(self.sandbox, staged)  # a refused commit moved nothing: the staged tree goes
            raise


def _verdict(
    result: _Produced, out: _PipeOut, sandbox_error: ScratchbankError | None, staged: StagedRestore | None
) -> RestoreAttempt | None:
    """The host's verdict first (a host refusal is never a broken stream), then the sandbox's."""
    producer = result.error
    if producer is not None and not (out.broken and sandbox_error is not None):
        if isinstance(producer, ScratchbankError):
            return attempt_of(producer)
        return RestoreAttempt(RestoreResult.READ_FAILED, detail=f"reading the bank failed: {producer!r:.300}")
    if sandbox_error is not None:
        return attempt_of(sandbox_error)
    assert staged is not None
    # The digest is checked by the adapter against its framing's (taken once, on the host)
    if staged.received != result.bytes:
        return RestoreAttempt(
            RestoreResult.STREAM_BROKEN,
            detail=f"the sandbox read {staged.received} bytes, not the {result.bytes} sent",
        )
    return None


def _discard(sandbox: Sandbox, staged: StagedRestore | None) -> None:
    if staged is None:
        return
    with contextlib.suppress(ScratchbankError):
        sandbox.discard_restore(staged)
