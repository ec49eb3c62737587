"""Named errors: each carries a stable code and a remedy an operator can act on.

The tree (adapters add their own leaves under these, translated at their edge)::

    ScratchbankError
    ├── TimelineUnreadable        code TIMELINE_UNREADABLE   (R15, A6)
    ├── TimelineConflict          code TIMELINE_CONFLICT     (optimistic concurrency lost)
    ├── TimelineWriteFailed       code TIMELINE_WRITE_FAILED (T8: the record is retried)
    ├── TimelineBusy              code TIMELINE_BUSY         (load, not R15: call again later)
    ├── BankError
    │   ├── BankGone              code BANK_GONE             (X4: the bank is not there)
    │   ├── BankReadFailed        code BANK_READ_FAILED      (X5: read again)
    │   ├── BankWriteFailed       code BANK_WRITE_FAILED     (T8/T10: retry may cure)
    │   ├── BankMismatch          code BANK_MISMATCH         (X4: not the bank the record names)
    │   ├── InvalidBankObject     code INVALID_BANK_OBJECT   (A17: a name outside the run's bank prefix)
    │   ├── BankUnrecorded        code BANK_UNRECORDED       (N3: a stored bank no record names, unproven)
    │   ├── CheckpointBankSwept   code CHECKPOINT_BANK_SWEPT (K7: a rewind's own bank is past retention)
    │   └── HostileArchive        code HOSTILE_ARCHIVE       (X2/X4: refused on the host)
    │       └── UnreadableArchive code ARCHIVE_UNREADABLE    (X2/X4/T6: the parser itself failed)
    ├── SandboxError
    │   ├── SandboxGone           code SANDBOX_GONE          (T19: cannot even list)
    │   ├── ExecFailed            code EXEC_FAILED           (T8: an exec blip)
    │   ├── ArchiveFailed         code ARCHIVE_FAILED        (T8: tar failed in the sandbox)
    │   │   └── HostArchiveFailed code HOST_ARCHIVE_FAILED   (T8: the host could not keep the stream)
    │   ├── RestoreRefused        code RESTORE_REFUSED       (X2/X4: the sandbox's tar refused)
    │   └── StreamBroken          code STREAM_BROKEN         (X5: transport broke)
    │       └── OutputOverBound   code SANDBOX_OUTPUT_OVER_BOUND (X4: the sandbox said too much)
    ├── DestinationRefused        code DESTINATION_REFUSED   (X6: the host directory cannot take it)
    │   └── NoSpaceAtDestination  code NO_SPACE_AT_DESTINATION (X6: less free space than declared)
    ├── InvalidRunId              code INVALID_RUN_ID
    ├── InvalidCheckpoint         code INVALID_CHECKPOINT    (ADR 0013: a stamp with no lineage)
    ├── RunNotFound               code RUN_NOT_FOUND         (the timeline has never seen the run)
    ├── NoRestoreTarget           code NO_RESTORE_TARGET     (A15: a restore needs a sandbox or a host dir)
    ├── ResumeSuperseded          code RESUME_SUPERSEDED     (C6/C7: another resume or attempt has the run)
    ├── Fenced                    code FENCED                (a stale lease holder's write, refused)
    ├── LeaseLost                 code LEASE_LOST            (L5: the run's lease lapsed or was taken)
    ├── RunLocked                 code RUN_LOCKED            (A16: another holder is live; retry)
    ├── LockLost                  code LOCK_LOST             (A16: the grant lapsed, was taken over or broken)
    ├── LockUnavailable           code LOCK_UNAVAILABLE      (A16: the lock's store cannot be reached)
    ├── QueueUnavailable          code QUEUE_UNAVAILABLE     (the delivery queue cannot be reached)
    └── SurfaceError              (the operator surfaces: CLI, HTTP API, bootstrap)
        ├── ConfigInvalid         code CONFIG_INVALID        (a URL, sandbox, port or home that cannot work)
        ├── HomeNotFound          code HOME_NOT_FOUND        (no explicit home and none found from here)
        ├── NotAuthorized         code NOT_AUTHORIZED        (HTTP 401: a write without the bearer token)
        ├── SandboxNotAllowed     code SANDBOX_NOT_ALLOWED   (HTTP 403: not in the server's allow-list)
        ├── HostNotAllowed        code HOST_NOT_ALLOWED      (HTTP 421: a Host the server does not serve)
        ├── BodyTooLarge          code BODY_TOO_LARGE        (HTTP 413: a body past the server's limit)
        └── InvalidRequest        code INVALID_REQUEST       (HTTP 422: an unknown or ill-typed body field)

Errors are values the domain can name; raising and catching them happens in the
application layer and at adapter edges. The domain raises only TimelineUnreadable,
from the wire decoder, because a record it cannot read must never be read as absent.
"""

from __future__ import annotations

from typing import Literal


class ScratchbankError(Exception):
    """Base of every error scratchbank raises on purpose.

    Raised when: a named failure is met. Not raised for: programming errors
    (those stay TypeError / ValueError and are bugs).
    """

    code: str = "SCRATCHBANK_ERROR"
    remedy: str = "see the message"
    #: the same call, made again later, may succeed (nothing was decided or written)
    retryable: bool = False

    def __init__(self, message: str, *, remedy: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if remedy is not None:
            self.remedy = remedy

    def remedy_in(self, surface: Literal["cli", "http", "mcp", "python"] = "python") -> str:
        """The remedy in the words of ``surface`` (cli, http, mcp, python): ``remedy`` is
        the CLI's (its flags); an engine calling the library reads Python names."""
        from .remedy import error_remedy

        return error_remedy(self, surface)

    def __str__(self) -> str:
        """What an engine embedding the library sees: the remedy in Python words."""
        return f"{self.code}: {self.message} (remedy: {self.remedy_in('python')})"


class TimelineUnreadable(ScratchbankError):
    """The run's timeline cannot be read, or holds a known record that is malformed.

    Raised when: the store cannot be read, a line is not JSON, a known record lacks a
    field or carries one of the wrong type, or a record is of a newer version than this
    build knows. Not raised for: record types this build does not know (they are kept
    as UnknownRecord and passed over by the fold).
    """

    code = "TIMELINE_UNREADABLE"
    remedy = "repair or restore the run's timeline, then resume again; nothing was moved"

    def __init__(self, message: str, *, position: int | None = None, line: int | None = None) -> None:
        where = f"record {position + 1}: " if position is not None else ""
        where = f"line {line}: " if line is not None else where
        super().__init__(where + message)
        self.position = position
        self.line = line


class TimelineConflict(ScratchbankError):
    """Another writer appended to the run's timeline first.

    Raised when: an append expected the timeline at one length and found it longer.
    Not raised for: an unreadable store (TimelineUnreadable).
    """

    code = "TIMELINE_CONFLICT"
    remedy = "read the timeline again and decide on what it now holds"


class TimelineWriteFailed(ScratchbankError):
    """Appending to the timeline failed for a reason other than a conflict (store outage).

    Raised when: the store is unreachable or refuses the write. Not raised for: another
    writer winning the race (TimelineConflict).
    """

    code = "TIMELINE_WRITE_FAILED"
    remedy = "check the timeline store; the record is retried within its budget"


class TimelineBusy(ScratchbankError):
    """The timeline store is busy: no call slot (or its writer lock) came free in time.

    Raised when: this process already has its bound of timeline calls in flight and none
    ended within the call's deadline, or SQLite's single writer stayed locked that long
    (ADR 0010). Not raised for: a store that cannot be read (TimelineUnreadable, R15) or
    that refused a write (TimelineWriteFailed). Retryable: nothing was read or written.
    """

    code = "TIMELINE_BUSY"
    remedy = "the timeline store is under load, not broken: call again; nothing was read or written"


class InvalidRunId(ScratchbankError):
    """A run id that could address something outside its run's own place.

    Raised when: the id is empty, too long, or holds characters outside
    [A-Za-z0-9._-] or is '.' / '..'. Not raised for: ids of runs that do not exist.
    """

    code = "INVALID_RUN_ID"
    remedy = "use the run id the engine assigned: letters, digits, '.', '_' and '-' only"


class InvalidCheckpoint(ScratchbankError):
    """An engine handed a checkpoint stamp that names no lineage (ADR 0013).

    Raised when: a ``Checkpoint`` is built from an empty lineage or one holding an empty
    or non-string id. Not raised for: a checkpoint read from the wire (that is
    TimelineUnreadable, A6).
    """

    code = "INVALID_CHECKPOINT"
    remedy = "hand the run's checkpoint ids from its start, oldest first, none of them empty"


class BankError(ScratchbankError):
    """A bank store failure."""

    code = "BANK_ERROR"


class BankGone(BankError):
    """The run's bank is not in the store (S3: only NoSuchKey; filesystem: no file).

    Raised when: the store answers that the object does not exist. Not raised for: a
    missing bucket, a bare 404, a 5xx or a network error (those are BankReadFailed).
    """

    code = "BANK_GONE"
    remedy = "relaunch the run fresh, or resume accepting the scratch's loss"


class BankReadFailed(BankError):
    """Reading the bank failed on the way; a later read may succeed (X5)."""

    code = "BANK_READ_FAILED"
    remedy = "resume again once the store answers; the runner redelivers"


class BankWriteFailed(BankError):
    """Writing or deleting the bank failed; a retry on the same archive may cure it."""

    code = "BANK_WRITE_FAILED"
    remedy = "check the bank store's reachability and space"


class BankMismatch(BankError):
    """The stored bank is not the one the timeline recorded (size or digest differ).

    Raised when: a bank was replaced without its record landing (a teardown killed
    between upload and record), or the object changed in the store. Not raised for:
    a bank that is gone (BankGone). Such a bank is never restored as if recorded.
    """

    code = "BANK_MISMATCH"
    remedy = "relaunch the run fresh, or resume accepting the scratch's loss"


class InvalidBankObject(BankError):
    """A bank object's name that is not ``banks/<sha256>.tgz`` (A17, ADR 0006).

    Raised when: a record, a caller or a store listing names an object outside the run's
    bank prefix (a path, another run's key, a digest that is not 64 hex digits). Not raised
    for: a record without a name (it names the legacy key).
    """

    code = "INVALID_BANK_OBJECT"
    remedy = "the record or the store was altered; repair the timeline or relaunch the run fresh"


class BankUnrecorded(BankError):
    """A stored bank that no record names and that cannot be proved to be the latest
    execution's own teardown (N3, ADR 0006): resuming would ignore it in silence.

    Raised when: an engine-side resume finds, while the latest execution wrote no teardown
    record, two or more unrecorded objects stamped by that execution, or one whose stamp
    names no execution. Not raised for: exactly one such object stamped by the latest
    execution (it is recorded), nor for unrecorded objects of earlier executions (shown by
    ``status``, swept past the bound).
    """

    code = "BANK_UNRECORDED"
    remedy = (
        "look at the named objects with `status`; delete from the store those that are not the "
        "run's latest scratch and resume again, or resume accepting the scratch's loss "
        "(--accept-scratch-loss) to go on without them"
    )


class CheckpointBankSwept(BankError):
    """A rewind to a checkpoint whose own bank retention swept (ADR 0013, K7).

    Raised when: a resume names a checkpoint a stamped teardown banked at, and that bank
    is no longer among the last ``retain`` checkpoints' banks retention keeps. Not raised
    for: a checkpoint that never had a bank of its own (the run's current bank decides,
    K1-K5), nor once the scratch's loss is accepted (the current bank then decides).
    """

    code = "CHECKPOINT_BANK_SWEPT"
    remedy = (
        "the scratch of that checkpoint is no longer kept; resume accepting the scratch's loss "
        "(--accept-scratch-loss) to go on with the bank the run holds now, or relaunch the run "
        "fresh; keep more checkpoints' banks with a higher retention"
    )


class HostileArchive(BankError):
    """A bank the host-side check refused: it must not be extracted anywhere.

    Raised when: the archive breaks the allow-list (absolute or '..' names, links out,
    devices, duplicates, bombs, trailing data, corrupt gzip, size or digest mismatch,
    a header field off its grammar or range, a PAX key off the allow-list). Not raised
    for: a bank that is gone (BankGone) or a store read that failed (BankReadFailed).
    """

    code = "HOSTILE_ARCHIVE"
    remedy = "relaunch the run fresh, or resume accepting the scratch's loss"


class UnreadableArchive(HostileArchive):
    """The archive made the host's parser itself fail (a bug met by hostile bytes).

    Raised when: any exception other than a named refusal escapes the gzip or tar
    parser (an overflow, a decode error, an index error): the one boundary in
    TarReader/GzipReader turns it into this refusal. Not raised for: the allow-list's
    named refusals (HostileArchive), nor a failure of what consumes the parsed stream
    (a broken pipe into a sandbox stays what it is).
    """

    code = "ARCHIVE_UNREADABLE"


class DestinationRefused(ScratchbankError):
    """A restore into a host directory could not create the tree there (X6).

    Raised when: the destination's parent cannot be opened, an entry cannot be created
    (permissions, a name the filesystem refuses, disk full mid-way), or the swap into
    place fails; the destination is left as it was. Not raised for: a bank the host
    check refused (HostileArchive), which never reaches the destination.
    """

    code = "DESTINATION_REFUSED"
    remedy = "fix the host directory's permissions or space, or resume accepting the scratch's loss"


class NoSpaceAtDestination(DestinationRefused):
    """The host directory's filesystem has less free space than the bank declares (X6).

    Raised when: free space (for the caller's user) at the destination's parent is
    below the bank's declared uncompressed total, checked before anything is created.
    Not raised for: a disk that fills while extracting (DestinationRefused).
    """

    code = "NO_SPACE_AT_DESTINATION"
    remedy = "free space on the host directory's filesystem, or resume accepting the scratch's loss"


class SandboxError(ScratchbankError):
    """A sandbox failure."""

    code = "SANDBOX_ERROR"


class SandboxGone(SandboxError):
    """The sandbox no longer exists: its scratch cannot even be listed (T19)."""

    code = "SANDBOX_GONE"
    remedy = "nothing to do: the teardown records 'unknown' and an earlier bank still decides"


class ExecFailed(SandboxError):
    """A command could not be run in the sandbox; another try may cure it (T8)."""

    code = "EXEC_FAILED"
    remedy = "check the sandbox engine; banking retries within its budget"


class ArchiveFailed(SandboxError):
    """tar failed in the sandbox for a reason other than a race (T8: tried again)."""

    code = "ARCHIVE_FAILED"
    remedy = "see the tar output in the message; banking retries within its budget"


class HostArchiveFailed(ArchiveFailed):
    """The host could not keep the archive it was streamed: its temporary file could not be
    written (disk full, a quota) or a lane compressing or checking it failed.

    Raised when: HostArchive.finish finds a lane that failed on the way. Not raised for: an
    archive the host refused on its allow-list (that is a refusal, recorded as such), nor
    for tar's own failures in the sandbox (ArchiveFailed). A subclass of ArchiveFailed so
    that banking tries again within its budget (T8), as for a failed tar.
    """

    code = "HOST_ARCHIVE_FAILED"
    remedy = "free space in the host's temporary directory (TMPDIR); banking retries within its budget"


class RestoreRefused(SandboxError):
    """The sandbox's tar refused the bank: the scratch cannot be created, a member
    cannot be recreated, or the disk is full (X2). Not raised for a broken stream."""

    code = "RESTORE_REFUSED"
    remedy = "free space or fix the scratch's permissions; or resume accepting the scratch's loss"


class StreamBroken(SandboxError):
    """The byte stream to or from the sandbox broke before its end (X5)."""

    code = "STREAM_BROKEN"
    remedy = "resume again; the runner redelivers"


class OutputOverBound(StreamBroken):
    """A sandbox sent more than the host expects of that stream: a listing past what the
    manifest's entries can take, a report past its fixed size, output from a step that
    should print nothing. The exec is cut at the bound; nothing past it is kept.

    Raised when: a stream's bound is passed (the sandbox's own fault: a restore reads it
    as a refusal in the sandbox, X4, not a stream to read again). A StreamBroken so that
    every step that survives a broken stream survives this one. Not raised for: a
    stream that broke or stalled (StreamBroken), stderr (a capped tail, never an error).
    """

    code = "SANDBOX_OUTPUT_OVER_BOUND"
    remedy = (
        "the sandbox printed more than it should: inspect its binaries and its workload; "
        "nothing past the bound was kept"
    )


class SandboxNotStarted(SandboxError):
    """A fresh sandbox for a run did not come up (a pod that never ran its container).

    Raised when: a provider's start gives up; the attempt's runner redelivers (X5).
    Nothing was claimed in the sandbox: its subclasses say why by name."""

    code = "SANDBOX_NOT_STARTED"
    remedy = "check the sandbox platform (the message names the reason); the runner redelivers"


class PodImagePull(SandboxNotStarted):
    """The pod's image cannot be pulled (ErrImagePull, ImagePullBackOff, InvalidImageName)."""

    code = "POD_IMAGE_PULL"
    remedy = "fix the pod template's image or its pull secret; the runner redelivers"


class PodUnschedulable(SandboxNotStarted):
    """No node can take the pod (PodScheduled False, reason Unschedulable)."""

    code = "POD_UNSCHEDULABLE"
    remedy = "lower the pod template's requests or its node selector, or add nodes"


class PodEvicted(SandboxNotStarted):
    """The node evicted the pod (phase Failed, reason Evicted), or it failed before running."""

    code = "POD_EVICTED"
    remedy = "give the pod template's node more room; the runner redelivers"


class PodDeleted(SandboxNotStarted):
    """The pod was deleted by someone else while it was starting."""

    code = "POD_DELETED"
    remedy = "find out who deletes the runner's pods (an operator, a controller); the runner redelivers"


class PodStartTimeout(SandboxNotStarted):
    """The pod's container was not running within the start deadline."""

    code = "POD_START_TIMEOUT"
    remedy = "raise SCRATCHBANK_POD_START_SECONDS or check the cluster's events; the runner redelivers"


class RunNotFound(ScratchbankError):
    """The timeline holds no record of this run.

    Raised when: a resume or a status names a run the timeline has never seen; nothing is
    written (no phantom run). Not raised for: a run whose timeline cannot be read
    (TimelineUnreadable).
    """

    code = "RUN_NOT_FOUND"
    remedy = "check the run id and the timeline the command points at (SCRATCHBANK_TIMELINE / --home)"


class NoRestoreTarget(ScratchbankError):
    """A resume that would restore the bank was given nowhere to restore it (A15).

    Raised when: the decision is to restore and the call names neither a sandbox nor a
    host directory, and does not say it runs without a sandbox on purpose; nothing is
    written and the bank stays as it was. Not raised for: an engine that resumes without
    a sandbox on purpose (that is X4's "no sandbox").
    """

    code = "NO_RESTORE_TARGET"
    remedy = "name where to restore: --sandbox docker:NAME | podman:NAME | k8s:NAMESPACE/POD | local:DIR"


class ResumeSuperseded(ScratchbankError):
    """This resume lost its run to another resume, a newer attempt or a teardown (C6, C7).

    Raised when: the resume's claim (its first append at the position it read) or a later
    write at the position it last wrote finds the timeline moved on; nothing more is
    written. Not raised for: a store outage (TimelineWriteFailed).
    """

    code = "RESUME_SUPERSEDED"
    remedy = "nothing to do: another resume holds the run; check its status"


class Fenced(ScratchbankError):
    """A write carried a fencing token older than one the run's timeline already accepted.

    Raised when: a runner whose lease lapsed (paused, cut off) writes after the new
    holder's first write. Not raised for: a plain optimistic-concurrency conflict between
    writers of one lease (TimelineConflict).
    """

    code = "FENCED"
    remedy = "nothing to do: a newer lease holder owns the run"


class AttemptReused(ScratchbankError):
    """A resume was queued with an attempt id the run was already queued for (C5).

    Raised when: a caller-supplied attempt id names an earlier ``attempt_queued`` of the
    run; nothing is written or published (the queue would de-duplicate the delivery while
    the caller is told "queued"). Not raised for: a fresh id (``new_attempt``).
    """

    code = "ATTEMPT_REUSED"
    remedy = "queue the resume again with a fresh attempt id (or none: one is made)"


class SurfaceError(ScratchbankError):
    """A refusal by an operator surface (CLI, HTTP API, bootstrap) before any use case runs.

    Raised when: never itself, only as one of its leaves below. Not raised for: a use
    case's own refusals (RunNotFound, NoRestoreTarget, a refusal decision).
    """

    code = "SURFACE_ERROR"


class ConfigInvalid(SurfaceError):
    """The configuration names something that cannot work; nothing was opened or written.

    Raised when: a timeline or bank URL has an unknown scheme or no path/bucket, the home
    is not a directory (``SCRATCHBANK_HOME=/dev/null``), a sandbox spec is not one of
    ``docker:NAME | podman:NAME | k8s:NAMESPACE/POD | local:DIR``, a port is outside
    1-65535, or the HTTP API would listen beyond loopback without a token. Not raised
    for: a store that is well named but unreachable (TimelineUnreadable, BankReadFailed).
    """

    code = "CONFIG_INVALID"
    remedy = "fix the setting the message names (see `scratchbank --help` and the README's Operators section)"


class HomeNotFound(SurfaceError):
    """No scratchbank home: none was given and none was found from the working directory.

    Raised when: neither ``--home`` nor ``SCRATCHBANK_HOME`` nor ``SCRATCHBANK_TIMELINE``
    is set and no parent of the working directory holds ``var/scratchbank``, or the home
    or its timeline named does not exist (a read never creates one). Not raised for: an
    existing home whose timeline has never seen the run (RunNotFound).
    """

    code = "HOME_NOT_FOUND"
    remedy = "pass --home DIR or set SCRATCHBANK_HOME to the folder holding timeline.db and banks/"


class NotAuthorized(SurfaceError):
    """A call that writes came without the server's bearer token, or with another one.

    Raised when: ``POST /runs/{run}/resume`` lacks ``Authorization: Bearer TOKEN`` or the
    token differs (compared in constant time). Not raised for: reads (``GET .../status``).
    """

    code = "NOT_AUTHORIZED"
    remedy = "send Authorization: Bearer <token> with the token the server was started with"


class SandboxNotAllowed(SurfaceError):
    """The call named a sandbox that the server's configuration does not let callers name.

    Raised when: the body's ``sandbox`` matches none of the server's allowed patterns
    (``SCRATCHBANK_API_SANDBOXES``). Not raised for: an allowed sandbox that does not exist
    (SandboxGone).
    """

    code = "SANDBOX_NOT_ALLOWED"
    remedy = "name a sandbox the server's operator allows (--allow-sandbox / SCRATCHBANK_API_SANDBOXES)"


class HostNotAllowed(SurfaceError):
    """The request's Host header names a host this server does not serve (DNS rebinding).

    Raised when: the Host header is not one of the server's allowed hosts. Not raised
    for: a request with an allowed Host on any path.
    """

    code = "HOST_NOT_ALLOWED"
    remedy = "call the server by the address it listens on (or add the name to SCRATCHBANK_API_HOSTS)"


class BodyTooLarge(SurfaceError):
    """A request body past the server's limit; it was not read further.

    Raised when: the declared or streamed body exceeds the limit (64 KiB by default). Not
    raised for: a small body that is malformed (InvalidRequest).
    """

    code = "BODY_TOO_LARGE"
    remedy = "send a smaller body: a resume takes a few boolean fields and a sandbox name"


class InvalidRequest(SurfaceError):
    """A request body that is not JSON, has a field the API does not know, or a wrong type.

    Raised when: validation fails; the message names each field. Not raised for: a valid
    body that the resume refuses (that is a decision).
    """

    code = "INVALID_REQUEST"
    remedy = "send only the fields the OpenAPI document lists (/openapi.json), with their types"


class LeaseLost(ScratchbankError):
    """The runner's lease on a run lapsed, was taken by another runner, or vanished (L5).

    Raised when: a refresh or release finds the lease at another revision or gone.
    Not raised for: a lease held by another runner at acquire time (acquire answers
    None: the delivery backs off, L4).
    """

    code = "LEASE_LOST"
    remedy = "nothing to do: the runner cancels its run context; another runner takes the run"


class QueueUnavailable(ScratchbankError):
    """The delivery queue (or the lease store next to it) cannot be reached.

    Raised when: the server does not answer or refuses a publish, fetch or ack.
    Not raised for: a duplicate publication (publish answers False) or an empty fetch.
    """

    code = "QUEUE_UNAVAILABLE"
    remedy = "check the NATS server the queue URL names (SCRATCHBANK_QUEUE, --queue); deliveries wait"


class RunLocked(ScratchbankError):
    """Another holder has the run's lock and is provably live: its lease has not expired (A16).

    Raised when: a resume acquires the run's lock while another execution (or a teardown
    still banking, or an operator's resume) holds it, after waiting its ``lock_wait``.
    Not raised for: a lapsed holder (its lease expired: it is taken over) nor for a
    missing teardown record alone. Retryable: nothing was read or written.
    """

    code = "RUN_LOCKED"
    remedy = (
        "retry after the holder's lease ends (status shows who holds the lock, since when, with "
        "which token); if the holder is gone for good, an operator breaks it: status RUN --break-lock"
    )
    retryable = True

    def __init__(self, message: str, *, holder: str = "", token: int = 0, remedy: str | None = None) -> None:
        super().__init__(message, remedy=remedy)
        self.holder, self.token = holder, token


class LockLost(ScratchbankError):
    """A grant of the run's lock is no longer the lock's: it lapsed and was taken over, or
    an operator broke it (A16: the old holder is fenced).

    Raised when: a refresh or a hand-over finds another token in the lock's row.
    Not raised for: a release (idempotent).
    """

    code = "LOCK_LOST"
    remedy = "nothing to do: a newer holder owns the run; this execution stops writing"


class LockUnavailable(ScratchbankError):
    """The store of the run's lock cannot be reached or answered out of its deadline (A16).

    Raised when: the lock's database (SQLite file, PostgreSQL) fails a call. Not raised
    for: a lock held by another (RunLocked). Nothing was decided or written.
    """

    code = "LOCK_UNAVAILABLE"
    remedy = "check the lock's store (the timeline's database); resume again once it answers"
    retryable = True
