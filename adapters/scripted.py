"""Sandboxes driven by the in-sandbox scripts: one implementation of the Sandbox port
for every engine, which only has to say how to run a shell script in its sandbox.

The scripts (``scripts/*.sh``) are POSIX sh that runs under BusyBox and GNU alike. They
are passed as ``sh -c SCRIPT`` so that stdin stays free for the data stream. This
module reads their exit codes and output into typed reports and named errors.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import os
import re
import secrets
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib import resources
from typing import BinaryIO

import attrs

from scratchbank.application.bank_format.manifest_line import line_of
from scratchbank.application.cancellation import Deadline
from scratchbank.application.ports import (
    ArchiveReport,
    ByteSink,
    Decide,
    QuiescedArchive,
    QuiesceReport,
    SandboxFacts,
    StagedRestore,
)
from scratchbank.domain.errors import (
    ArchiveFailed,
    OutputOverBound,
    RestoreRefused,
    SandboxGone,
    ScratchbankError,
    StreamBroken,
)


def script(name: str) -> str:
    return (resources.files("scratchbank.adapters") / "scripts" / name).read_text()


QUIESCE, ARCHIVE, RESTORE = script("quiesce.sh"), script("archive.sh"), script("restore.sh")
LIST = RESTORE  # ``restore.sh list SCRATCH``: the tree in the stage's NUL-safe format
#: quiesce, archive and continue in one exec (T11-T16): bank.sh over the other two's functions
BANK = "SCRATCHBANK_LIBRARY=1\n" + QUIESCE + "\n" + ARCHIVE + "\n" + script("bank.sh")

#: The variable that marks every process of one call (``ScriptedSandbox.call``).
TOKEN_VAR = "SCRATCHBANK_EXEC"
#: After a cut: end every process whose environment carries the call's token, by a fresh
#: exec (its own shell and pipeline carry no token). /proc/PID/environ is the
#: environment a process was started with: a script cannot shed it by unsetting a variable.
REAP = f"""me=$$
for d in /proc/[0-9]*; do
    p=${{d#/proc/}}
    [ "$p" = "$me" ] && continue
    tr '\\000' '\\n' <"$d/environ" 2>/dev/null | grep -qx "{TOKEN_VAR}=$1" && kill -KILL "$p" 2>/dev/null
done
exit 0
"""
#: how long a reap may take after a cut (on top of the cut call's deadline)
REAP_SECONDS = 5.0


def command(source: str, args: Sequence[str], token: str | None = None) -> list[str]:
    """The argv of a script's exec: ``sh -c source scratchbank args...``, started by
    ``env`` with the call's token in its environment when there is one (every transport)."""
    head = ["env", f"{TOKEN_VAR}={token}"] if token else []
    return [*head, "sh", "-c", source, "scratchbank", *args]


def _words(args: Iterable[str]) -> tuple[str, ...]:
    return tuple(args)


@attrs.frozen
class Exec:
    """What to run in a sandbox, as one value from the caller through the exec pump to
    the transport: ``sh -c source scratchbank args...`` as ``user`` (None: the sandbox's
    default), ``stdin`` streamed in and stdout into ``stdout`` when given (else captured),
    ended by ``deadline`` (None: EXEC_SECONDS), under ``token`` (ScriptedSandbox.call)."""

    source: str
    args: tuple[str, ...] = attrs.field(default=(), converter=_words)
    stdin: BinaryIO | None = None
    stdout: ByteSink | None = None
    user: str | None = None
    deadline: Deadline | None = None
    token: str | None = None

    @property
    def argv(self) -> list[str]:
        """The command a transport starts (``command``)."""
        return command(self.source, self.args, self.token)

    @property
    def streaming(self) -> bool:
        """Does a stream cross the transport (a cut is StreamBroken, not ExecFailed)?"""
        return self.stdin is not None or self.stdout is not None


EMPTY, CANNOT_LIST = 10, 12
#: A call given no deadline ends by this many seconds (a stalled transport is cut).
EXEC_SECONDS = 600.0
STREAM_BROKE, TAR_REFUSED, DISCARDED = 20, 21, 22
QUIESCE_REFUSED, QUIESCE_PARTIAL = 3, 4

_RACED = re.compile(
    r"^tar: (\./.*): (file changed as we read it|File removed before we read it|"
    r"No such file or directory)$"
)
_OURS = re.compile(r"^scratchbank: raced: (\./.*)$")
_NEUTRAL = (
    re.compile(r"^tar: \./.*: socket ignored$"),
    re.compile(r"^command terminated with exit code \d+$"),
    re.compile(r"^tar: error exit delayed from previous errors$"),
    re.compile(r"^tar: Exiting with failure status due to previous errors$"),
)


# -- what a sandbox may send: every stream bounded by its purpose (ADR 0008) ------------------
#: stderr: the last 64 KiB are kept (a tail: never an error, never more)
STDERR_TAIL = 64 << 10
#: stdout of a call given no sink (a transport's safety net; the scripts' calls pass tighter)
CAPTURE_BYTES = 1 << 20
#: stdout of steps that should print nothing (continue, commit, discard): past it, cut
QUIET_BYTES = 4 << 10
#: the quiesce report (a few lines per process that would not stop; fixed)
REPORT_BYTES = 64 << 10
#: list_scratch, which has no manifest to go by
LIST_BYTES = 64 << 20
#: a listing line's stats ("MODEHEX SIZE\n") and name ("./" + 4096 bytes + NUL) at most
ENTRY_BYTES = 32 + 4100
#: text of the sandbox's in a record or a log: escaped, its last this many characters
SAID_CHARS = 2000


def said(raw: bytes, limit: int = SAID_CHARS) -> str:
    """Text a sandbox sent, as a record or a log may hold it: its tail, decoded, every
    control or undecodable byte escaped (a NUL, an ANSI escape, a newline that would forge
    a log line), cut to ``limit`` characters."""
    text = raw[-4 * limit :].decode("utf-8", "backslashreplace").strip()
    escaped = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return escaped[-limit:]


def listing_bound(entries: int | None) -> int:
    """The bytes a restore's listing may take: what ``entries`` entries can need, twice
    over (implicit parents), at least 1 MiB; LIST_BYTES when the count is not known."""
    if entries is None:
        return LIST_BYTES
    return max(1 << 20, 2 * entries * ENTRY_BYTES)


class Bounded:
    """A sink that takes at most ``limit`` bytes (into ``keep``, or kept in memory); one
    byte more raises OutputOverBound, which every transport lets through as it is after
    cutting the exec, so the host never holds more than the bound."""

    def __init__(self, limit: int, what: str, keep: ByteSink | None = None) -> None:
        self.limit, self.what, self._keep = limit, what, keep
        self._kept = bytearray()
        self.size = 0

    def write(self, data: bytes, /) -> int:
        self.size += len(data)
        if self.size > self.limit:
            raise OutputOverBound(f"{self.what} passed its bound of {self.limit} bytes: the exec was cut")
        if self._keep is not None:
            self._keep.write(data)
        else:
            self._kept += data
        return len(data)

    def getvalue(self) -> bytes:
        return bytes(self._kept)


@attrs.frozen
class ExecResult:
    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def err(self) -> str:
        """stderr's tail as a record may hold it (escaped, cut)."""
        return said(self.stderr)


class Output:
    """Where an exec's channels go: stdout to the caller's sink (or captured, bounded, when
    none), stderr kept to its last STDERR_TAIL bytes. One collector for every transport."""

    KEEP = STDERR_TAIL

    def __init__(self, stdout: ByteSink | None) -> None:
        self._captured = Bounded(CAPTURE_BYTES, "the exec's stdout") if stdout is None else None
        self._sink: ByteSink = stdout if stdout is not None else self._captured  # type: ignore[assignment]
        self._err = bytearray()

    def stdout(self, data: bytes) -> None:
        self._sink.write(data)

    def stderr(self, data: bytes) -> None:
        self._err += data[-self.KEEP :]
        del self._err[: max(0, len(self._err) - self.KEEP)]

    def result(self, exit_code: int) -> ExecResult:
        captured = self._captured.getvalue() if self._captured is not None else b""
        return ExecResult(exit_code, captured, bytes(self._err))


def read_tar_stderr(stderr: bytes) -> tuple[list[str], list[str], list[str]]:
    """Split tar's warnings into raced members, neutral notices and anything else."""
    raced: list[str] = []
    neutral: list[str] = []
    other: list[str] = []
    for line in stderr.decode("utf-8", "surrogateescape").splitlines():
        if not line.strip():
            continue
        match = _RACED.match(line) or _OURS.match(line)
        if match:
            if match.group(1) not in raced:
                raced.append(match.group(1))
        elif any(p.match(line) for p in _NEUTRAL):
            neutral.append(line)
        else:
            other.append(line)
    return raced, neutral, other


def _mode_kind(mode_hex: str) -> str:
    fmt = int(mode_hex, 16) & 0o170000
    return {0o100000: "file", 0o040000: "dir", 0o120000: "symlink", 0o010000: "fifo"}.get(fmt, "other")


def quiesce_report(exit_code: int, lines: Sequence[str], err: str = "") -> QuiesceReport:
    """quiesce.sh's exit code and report lines as a QuiesceReport (T12, T13)."""
    tags = ("refused: ", "unquiesced: ")
    reasons = tuple(said(line.split(": ", 1)[1].encode(), 300) for line in lines if line.startswith(tags))
    counts = (_STOPPED.match(line) for line in lines)
    stopped = next((int(m.group(1)) for m in counts if m is not None), 0)
    if exit_code == 0:
        return QuiesceReport(True, False, (), stopped)
    if exit_code == QUIESCE_REFUSED:
        return QuiesceReport(False, True, reasons or ("refused",))
    if exit_code == QUIESCE_PARTIAL:
        return QuiesceReport(False, False, reasons, stopped)
    detail = err or said("\n".join(lines).encode(), 500)
    return QuiesceReport(False, False, (f"quiesce exited {exit_code}: {detail}",))


_STOPPED = re.compile(r"^stopped (\d{1,9})$")


def archive_report(exit_code: int, stderr: bytes) -> ArchiveReport:
    """archive.sh's exit code and tar's warnings as an ArchiveReport, or ArchiveFailed."""
    if exit_code == EMPTY:
        return ArchiveReport(empty=True)
    err = said(stderr)
    if exit_code == CANNOT_LIST:
        raise ArchiveFailed(f"cannot list the scratch: {err}")
    raced, neutral, other = read_tar_stderr(stderr)
    if exit_code == 0 or (exit_code == 1 and raced and not other):
        notices = [said(line.encode("utf-8", "surrogateescape"), 300) for line in neutral + other]
        return ArchiveReport(False, tuple(raced), tuple(notices[:100]))
    raise ArchiveFailed(f"tar exited {exit_code}: {err}")


_STATUS = b"scratchbank-bank: "
_TRAILER = re.compile(rb"^command terminated with exit code \d+$")  # kubectl exec's, after ours


def bank_status(stderr: bytes) -> tuple[str, bytes]:
    """bank.sh's status (its last stderr line, written once tar has ended: no member name
    can stand in for it; only an exec transport's trailer may follow) and the stderr
    without it, tar's. ("", stderr) when it has none."""
    lines = stderr.rstrip(b"\n").split(b"\n")
    at = len(lines) - 1
    while at > 0 and _TRAILER.match(lines[at]):
        at -= 1
    if not lines[at].startswith(_STATUS):
        return "", stderr
    return lines[at][len(_STATUS) :].decode("ascii", "replace"), b"\n".join(lines[:at] + lines[at + 1 :])


class QuiesceHead:
    """bank.sh's stdout: the quiesce report, up to its "scratchbank-quiesced CODE" line,
    read into ``report``; every byte after it (the tar stream) passed on to ``dest``."""

    LIMIT = REPORT_BYTES
    _END = re.compile(rb"(?:^|\n)scratchbank-quiesced (\d+)\n")

    def __init__(self, dest: ByteSink) -> None:
        self._dest = dest
        self._head = bytearray()
        self.report: QuiesceReport | None = None

    def write(self, data: bytes, /) -> int:
        if self.report is not None:
            self._dest.write(data)
            return len(data)
        self._head += data
        end = self._END.search(self._head)
        if end is None:
            if len(self._head) > self.LIMIT:
                raise OutputOverBound(
                    f"the bank script's quiesce report passed its bound of {self.LIMIT} bytes"
                )
            return len(data)
        lines = self._head[: end.start()].decode("utf-8", "replace").splitlines()
        self.report = quiesce_report(int(end.group(1)), lines)
        rest = bytes(self._head[end.end() :])
        self._head.clear()
        if rest:
            self._dest.write(rest)
        return len(data)


class ScriptedSandbox(abc.ABC):
    """The Sandbox port over ``run``; an engine adapter implements ``run`` and ``facts``."""

    facts: SandboxFacts
    #: the user the quiesce and archive run as (None: the sandbox's default user)
    admin_user: str | None = None
    #: bounds of what the scripts may print (ADR 0008); past one, OutputOverBound
    list_bytes: int = LIST_BYTES
    quiet_bytes: int = QUIET_BYTES
    report_bytes: int = REPORT_BYTES

    def _quiet(self, what: str) -> Bounded:
        return Bounded(self.quiet_bytes, what)

    def run(
        self,
        source: str,
        args: Sequence[str] = (),
        *,
        stdin: BinaryIO | None = None,
        stdout: ByteSink | None = None,
        user: str | None = None,
        deadline: Deadline | None = None,
        token: str | None = None,
    ) -> ExecResult:
        """``execute`` one command, unreaped (tests, the reference engine's nodes)."""
        how = Exec(source, args, stdin=stdin, stdout=stdout, user=user, deadline=deadline, token=token)
        return self.execute(how)

    def call(self, exec_: Exec) -> ExecResult:
        """``execute`` a script as one cancellable unit: it starts with a token in its
        environment (inherited by every process it starts, a child that detached with
        setsid too), and when the call is cut or fails, a fresh exec ends every process
        that carries the token (REAP): nothing a cut call started keeps writing the
        scratch. A sandbox that is gone needs no reaping."""
        token = secrets.token_hex(8)
        try:
            return self.execute(attrs.evolve(exec_, token=token))
        except SandboxGone:
            raise
        except Exception:
            self._reap(token, exec_.user)
            raise

    def _reap(self, token: str, user: str | None) -> None:
        reaper = Exec(
            REAP,
            (token,),
            stdout=self._quiet("the reaper's output"),
            user=user,
            deadline=Deadline.after(REAP_SECONDS),
        )
        with contextlib.suppress(Exception):
            self.execute(reaper)

    @abc.abstractmethod
    def execute(self, exec_: Exec) -> ExecResult:
        """Run ``exec_.argv`` in the sandbox (``sh -c source scratchbank args...``, under
        ``env TOKEN_VAR=token`` when a token is given).

        Streams ``stdin`` in and ``stdout`` out when given (else stdout is captured);
        raises SandboxGone when the sandbox no longer exists, ExecFailed when the command
        could not be run, StreamBroken when the transport broke mid-stream. By
        ``deadline`` (None: the transport's default, ``EXEC_SECONDS``) the call has ended:
        a stream still open is cut (StreamBroken), a command without streams that has
        not answered is given up (ExecFailed). An error of the thread feeding ``stdin``
        is raised as StreamBroken, never swallowed.
        """

    def quiesce(
        self, *, budget_seconds: int, wait_seconds: int, deadline: Deadline | None = None
    ) -> QuiesceReport:
        args = ["stop", str(budget_seconds), str(wait_seconds)]
        report = Bounded(self.report_bytes, "the quiesce report")
        try:
            done = self.call(Exec(QUIESCE, args, stdout=report, user=self.admin_user, deadline=deadline))
        except OutputOverBound as error:  # what it stopped is unknown: the watchdog continues
            return QuiesceReport(False, False, (error.message,))
        lines = report.getvalue().decode("utf-8", "replace").splitlines()
        return quiesce_report(done.exit_code, lines, done.err)

    def continue_processes(self, *, deadline: Deadline | None = None) -> None:
        out = self._quiet("the continue step's output")
        self.call(Exec(QUIESCE, ["cont"], stdout=out, user=self.admin_user, deadline=deadline))

    def archive(
        self, dest: ByteSink, *, compress: bool, verify: bool, deadline: Deadline | None = None
    ) -> ArchiveReport:
        args = [self.facts.scratch, "z" if compress else "raw", "1" if verify else "0"]
        done = self.call(Exec(ARCHIVE, args, stdout=dest, user=self.admin_user, deadline=deadline))
        return archive_report(done.exit_code, done.stderr)

    def quiesce_and_archive(
        self,
        dest: ByteSink,
        *,
        budget_seconds: int,
        wait_seconds: int,
        compress: bool,
        deadline: Deadline | None = None,
    ) -> QuiescedArchive:
        """One exec (bank.sh): quiesce, archive (verifying unless every process stopped),
        and continue when the pass did not race. The quiesce report leads stdout, so an
        exec cut mid-archive still says what it stopped; the script's last stderr line
        says whether it continued (anything else, the host continues: T14)."""
        head = QuiesceHead(dest)
        args = [self.facts.scratch, "z" if compress else "raw", str(budget_seconds), str(wait_seconds)]
        try:
            done = self.call(Exec(BANK, args, stdout=head, user=self.admin_user, deadline=deadline))
        except ScratchbankError as error:
            if head.report is None:
                raise
            return QuiescedArchive(head.report, None, False, error)
        if head.report is None:
            why = f"the bank script sent no quiesce report (exit {done.exit_code}): {done.err[-500:]}"
            raise StreamBroken(why)
        status, stderr = bank_status(done.stderr)
        continued = status in ("continued", "nothing stopped")
        try:
            return QuiescedArchive(head.report, archive_report(done.exit_code, stderr), continued)
        except ArchiveFailed as error:
            return QuiescedArchive(head.report, None, continued, error)

    def stage_restore(
        self,
        src: BinaryIO,
        *,
        compressed: bool,
        listing: ByteSink,
        need_bytes: int = 0,
        entries: int | None = None,
    ) -> StagedRestore:
        """``entries``: the manifest's, bounding the listing (ADR 0008); unknown: LIST_BYTES."""
        token = secrets.token_hex(8)
        framed = FramedStream(src)
        args = ["stage", self.facts.scratch, token, "z" if compressed else "raw", str(need_bytes)]
        with tempfile.TemporaryFile() as raw:
            bound = listing_bound(entries) if entries is not None else self.list_bytes
            out = Bounded(bound, "the restore's listing", keep=raw)
            try:
                done = self.call(Exec(RESTORE, args, stdin=framed, stdout=out))  # type: ignore[arg-type]
            except BaseException:
                self._discard(token)
                raise
            if done.exit_code == TAR_REFUSED:
                raise RestoreRefused(f"the sandbox's tar refused the bank: {done.err[-2000:]}")
            if done.exit_code != 0:
                self._discard(token)
                raise StreamBroken(f"restore stream broke (exit {done.exit_code}): {done.err[-2000:]}")
            try:
                staged = _staged_header(raw, token)
                if (staged.received, staged.sha256) != (framed.sent, framed.sha256):
                    raise StreamBroken(f"the sandbox read {staged.received} bytes, {framed.sent} were sent")
                write_listing(raw, listing)
            except BaseException:
                self._discard(token)
                raise
        return staged

    def commit_restore(self, staged: StagedRestore, *, dir_modes: Iterable[tuple[str, int]] = ()) -> str:
        """Apply the directory modes, move the staged tree into place; a note on what
        stayed behind (or "")."""
        with tempfile.TemporaryFile() as modes:
            write_modes(dir_modes, modes)
            done = self.call(
                Exec(
                    RESTORE,
                    ["commit", self.facts.scratch, staged.token],
                    stdin=FramedStream(modes),  # type: ignore[arg-type]
                    stdout=self._quiet("the commit's output"),
                )
            )
        if done.exit_code != 0:
            raise RestoreRefused(f"moving the restored tree into place failed: {done.err[-2000:]}")
        return commit_notes(done)

    def discard_restore(self, staged: StagedRestore) -> None:
        self._discard(staged.token)

    def restore_in_one_exec(
        self,
        src: BinaryIO,
        *,
        compressed: bool,
        need_bytes: int,
        decide: Decide,
        entries: int | None = None,
    ) -> str | None:
        """Stage, list, take the host's verdict and commit or discard: one exec (the
        script waits on stdin for the verdict ``decide`` gives once the listing is in).
        ``entries`` (the manifest's) bounds the listing; past it, or past QUIET_BYTES
        after the listing it announced, OutputOverBound (ADR 0008)."""
        token = secrets.token_hex(8)
        framed = FramedStream(src)
        stdin = _ThenVerdict(framed)
        args = ["stage", self.facts.scratch, token, "z" if compressed else "raw", str(need_bytes), "converse"]
        with tempfile.TemporaryFile() as raw, tempfile.TemporaryFile() as modes:
            talk = _Conversation(
                raw,
                lambda: self._verdict(raw, token, framed, decide, modes, stdin),
                give_up=stdin.discard,
                bound=listing_bound(entries) if entries is not None else self.list_bytes,
                after=self.quiet_bytes,
                committed=lambda: stdin.committed,
            )
            try:
                done = self.call(Exec(RESTORE, args, stdin=stdin, stdout=talk))  # type: ignore[arg-type]
            except BaseException:
                self._discard(token)
                raise
            finally:
                stdin.discard()  # an exec that ended before the verdict: the feeder goes
        if talk.error is not None:
            self._discard(token)
            raise talk.error
        if done.exit_code == 0 and stdin.committed:
            return commit_notes(done)
        if done.exit_code == DISCARDED and talk.answered and not stdin.committed:
            return None
        self._discard(token)
        if done.exit_code == TAR_REFUSED:
            what = "moving the restored tree into place" if stdin.committed else "the sandbox's tar"
            raise RestoreRefused(f"{what} refused the bank: {done.err[-2000:]}")
        raise StreamBroken(f"restore stream broke (exit {done.exit_code}): {done.err[-2000:]}")

    def _verdict(
        self,
        raw: BinaryIO,
        token: str,
        framed: FramedStream,
        decide: Decide,
        modes: BinaryIO,
        stdin: _ThenVerdict,
    ) -> None:
        """Once the listing is whole: check what was received, ask the host, answer."""
        staged = _staged_header(raw, token)
        if (staged.received, staged.sha256) != (framed.sent, framed.sha256):
            raise StreamBroken(f"the sandbox read {staged.received} bytes, {framed.sent} were sent")
        with tempfile.TemporaryFile() as listing:
            write_listing(raw, listing)
            listing.seek(0)
            verdict = decide(staged, listing)
        if verdict is None:
            stdin.discard()
            return
        write_modes(verdict, modes)
        stdin.answer(modes)

    def _discard(self, token: str) -> None:
        with contextlib.suppress(ScratchbankError):
            out = self._quiet("the discard's output")
            self.call(Exec(RESTORE, ["discard", self.facts.scratch, token], stdout=out))

    def list_scratch(self) -> list[str]:
        """The scratch's tree as sorted manifest lines (see bank_format/manifest_line.py); [] when absent.
        Its listing is bounded by ``list_bytes`` (no manifest to go by): OutputOverBound."""
        with tempfile.TemporaryFile() as raw, tempfile.TemporaryFile() as lines:
            out = Bounded(self.list_bytes, "the scratch's listing", keep=raw)
            done = self.call(Exec(LIST, ["list", self.facts.scratch], stdout=out, user=self.admin_user))
            if done.exit_code != 0:
                return []
            raw.seek(0)
            write_listing(raw, lines)
            lines.seek(0)
            return sorted(line.decode("ascii").rstrip("\n") for line in lines)


class ForwardingSandbox(ScriptedSandbox):
    """A proxy of ``inner``: its facts, its bounds, and every exec over its transport. A
    proxy (the hostile-sandbox kit, a test's) overrides only what it changes."""

    def __init__(self, inner: ScriptedSandbox) -> None:
        self.inner, self.facts, self.admin_user = inner, inner.facts, inner.admin_user
        self.list_bytes, self.quiet_bytes = inner.list_bytes, inner.quiet_bytes
        self.report_bytes = inner.report_bytes

    def execute(self, exec_: Exec) -> ExecResult:
        return self.inner.execute(exec_)


# -- the restore script's framing and listing ------------------------------------------------
_PLAIN = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/+,=@")


def printf_escaped(path: str) -> bytes:
    """A path as one word of ASCII for ``printf %b`` ("." for the root): every byte not
    plainly safe as ``\\0ooo``, so a name may hold a space, a newline, any byte."""
    if not path:
        return b"."
    raw = path.encode("utf-8", "surrogateescape")
    return b"".join(bytes([c]) if c in _PLAIN else b"\\0%03o" % c for c in raw)


def write_modes(dir_modes: Iterable[tuple[str, int]], out: BinaryIO) -> None:
    """The directory modes as restore.sh's commit reads them ("OCTAL ESCAPED-NAME"
    lines, deepest first), then back to the file's start."""
    for path, mode in dir_modes:
        out.write(b"%o %s\n" % (mode, printf_escaped(path)))
    out.seek(0)


def commit_notes(done: ExecResult) -> str:
    """What a commit left behind, from its stderr's note lines ("" when nothing)."""
    lines = done.stderr.split(b"\n")
    notes = [said(line, 300) for line in lines if line.startswith(b"scratchbank: note:")]
    return "; ".join(notes)[:SAID_CHARS]


class FramedStream:
    """``src`` as restore.sh reads it: "data N\\n" + N bytes per frame, then
    "end COUNT SHA256\\n" once ``src`` ends (so no EOF is needed; v4 cannot send one)."""

    FRAME = 1 << 20

    def __init__(self, src: BinaryIO) -> None:
        self._src = src
        self._digest = hashlib.sha256()
        self._out = bytearray()
        self._ended = False
        self.sent = 0

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()

    def read(self, n: int = -1) -> bytes:
        while not self._ended and (n < 0 or len(self._out) < n):
            self._next_frame()
        size = len(self._out) if n < 0 else min(n, len(self._out))
        data = bytes(self._out[:size])
        del self._out[:size]
        return data

    def _next_frame(self) -> None:
        payload = bytearray()
        while len(payload) < self.FRAME:
            chunk = self._src.read(self.FRAME - len(payload))
            if not chunk:
                break
            payload += chunk
        if payload:
            self._digest.update(payload)
            self.sent += len(payload)
            self._out += b"data %d\n" % len(payload) + payload
        else:
            self._out += b"end %d %s\n" % (self.sent, self.sha256.encode())
            self._ended = True


class _ThenVerdict:
    """stdin of a conversing restore: the framed stream, then (blocking until the host
    answers) "commit\n" and the framed directory modes, or "discard\n"."""

    def __init__(self, framed: FramedStream) -> None:
        self._framed = framed
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._tail: FramedStream | None = None
        self._head = b""
        self.committed = False

    def discard(self) -> None:
        self.answer(None)

    #: the exec ended (exec_pump): a read waiting for the verdict returns (a discard)
    abandon = discard

    def answer(self, modes: BinaryIO | None) -> None:
        """The verdict, once (later calls do nothing): modes to commit with, or None."""
        with self._lock:
            if self._ready.is_set():
                return
            if modes is not None:
                self._head, self._tail, self.committed = b"commit\n", FramedStream(modes), True
            else:
                self._head = b"discard\n"
            self._ready.set()

    def read(self, n: int = -1) -> bytes:
        data = self._framed.read(n)
        if data:
            return data
        self._ready.wait()
        if self._head:
            data, self._head = self._head, b""
            return data
        return self._tail.read(n) if self._tail is not None else b""


class _Conversation:
    """stdout of a conversing restore: kept in ``raw`` up to the end of the listing the
    script announced and its "awaiting verdict" line; then ``then`` runs (in the reading
    thread). What it raises is kept (``error``) and answered with a discard, never raised
    into the transport. Bounded (ADR 0008): the listing by ``bound``; any byte between
    the announced listing and that line, or a listing announced past ``bound``, is
    OutputOverBound (the exec is cut, the verdict a discard); after the verdict, output
    past ``after`` bytes is cut too, unless the verdict was commit (then it is dropped:
    the commit's exit status says whether the tree is in place)."""

    HEAD = 512
    MARK = b"scratchbank-awaiting-verdict\n"

    def __init__(
        self,
        raw: BinaryIO,
        then: Callable[[], None],
        *,
        give_up: Callable[[], None],
        bound: int = LIST_BYTES,
        after: int = QUIET_BYTES,
        committed: Callable[[], bool] = lambda: False,
    ) -> None:
        self._raw, self._then, self._give_up = raw, then, give_up
        self._bound, self._after, self._committed = bound, after, committed
        self._head = bytearray()
        self._need: int | None = None
        self.got = 0
        self.answered = False
        self.error: BaseException | None = None

    def write(self, data: bytes) -> int:
        self.got += len(data)
        if self.answered:
            return self._after_verdict(len(data))
        limit = self._bound if self._need is None else self._need
        if self.got > limit:
            what = "announced" if self._need is not None else "its bound"
            self._over(f"the restore script printed past the listing {what} ({limit} bytes)")
        self._raw.write(data)
        if self._need is None and len(self._head) < self.HEAD:
            self._head += data[: self.HEAD - len(self._head)]
            self._need = self._needed()
        if not self.answered and self._need is not None and self.got >= self._need:
            self._raw.flush()
            mark = os.pread(self._raw.fileno(), len(self.MARK), self._need - len(self.MARK))
            if mark != self.MARK:
                self._over("the restore script's listing did not end where it announced")
            self._answer()
        return len(data)

    def _after_verdict(self, n: int) -> int:
        past = self.got - (self._need or 0)
        if past > self._after and not self._committed():
            self._over(f"the restore script printed more than {self._after} bytes after its listing")
        return n

    def _over(self, why: str) -> None:
        error = OutputOverBound(f"{why}: the exec was cut")
        if self.error is None:
            self._fail(error)
        raise error

    def _needed(self) -> int | None:
        """Bytes of output up to the "awaiting verdict" line, once the two head lines are in."""
        lines = bytes(self._head).split(b"\n", 2)
        if len(lines) < 3:
            if len(self._head) >= self.HEAD:
                self._fail(
                    StreamBroken(f"unreadable output of the restore script: {bytes(self._head[:80])!r}")
                )
            return None
        try:
            stats, names = _tree_sizes(lines[1])
        except StreamBroken as error:
            self._fail(error)
            return None
        need = len(lines[0]) + len(lines[1]) + 2 + stats + names + len(self.MARK)
        if need > self._bound:
            self._fail(
                OutputOverBound(
                    f"the restore's listing announces {need} bytes, past its bound of {self._bound}"
                )
            )
            return None
        return need

    def _answer(self) -> None:
        self.answered = True
        self._raw.flush()
        at = self._raw.tell()
        try:
            self._then()
        except BaseException as error:  # raised by the caller once the exec has ended
            self._fail(error)
        finally:
            self._raw.seek(at)

    def _fail(self, error: BaseException) -> None:
        self.error, self.answered = error, True
        self._give_up()


def _staged_header(raw: BinaryIO, token: str) -> StagedRestore:
    raw.seek(0)
    words = raw.readline(200).split()
    if len(words) != 3 or words[0] != b"scratchbank-staged" or not words[1].isdigit():
        raise StreamBroken("the restore script did not confirm what it staged")
    return StagedRestore(token, int(words[1]), words[2].decode("ascii", "replace"))


def _tree_sizes(line: bytes) -> tuple[int, int]:
    """restore.sh's "STATS_BYTES NAMES_BYTES" line."""
    words = line.split()
    if len(words) != 2 or not all(w.isdigit() and len(w) < 16 for w in words):
        raise StreamBroken(f"unreadable listing from the sandbox: {line[:60]!r}")
    return int(words[0]), int(words[1])


_LINES_PER_WRITE = 2048


def write_listing(raw: BinaryIO, out: ByteSink) -> None:
    """restore.sh's listing (the byte counts of stats and names, "MODEHEX SIZE" lines,
    NUL-separated names in the same order), read from ``raw``'s current position,
    written to ``out`` as manifest lines, in bounded memory (two cursors over one file)."""
    stats_bytes, names_bytes = _tree_sizes(raw.readline(40))
    fd, at = raw.fileno(), raw.tell()
    stats = _records(fd, at, at + stats_bytes, b"\n")
    lines: list[str] = []
    for name in _records(fd, at + stats_bytes, at + stats_bytes + names_bytes, b"\x00"):
        stat_line = next(stats, None)
        if stat_line is None:
            raise StreamBroken("the sandbox's listing has more names than entries")
        lines.append(_manifest_line(stat_line, name))
        if len(lines) >= _LINES_PER_WRITE:  # in bulk: one write per batch of lines
            out.write("".join(lines).encode("ascii"))
            lines.clear()
    if next(stats, None) is not None:
        raise StreamBroken("the sandbox's listing has more entries than names")
    if lines:
        out.write("".join(lines).encode("ascii"))


def _records(fd: int, start: int, end: int | None, sep: bytes) -> Iterator[bytes]:
    """Records ending in ``sep`` between two offsets of a file (pread: its own cursor)."""
    pending, offset = b"", start
    while end is None or offset < end:
        chunk = os.pread(fd, 1 << 16 if end is None else min(1 << 16, end - offset), offset)
        if not chunk:
            break
        offset += len(chunk)
        *complete, pending = (pending + chunk).split(sep)
        yield from complete
    if pending:
        raise StreamBroken("the sandbox's listing ends inside an entry")


def _manifest_line(stat_line: bytes, name: bytes) -> str:
    words = stat_line.split()
    if len(words) != 2 or not name.startswith(b"./") or not words[1].isdigit():
        raise StreamBroken(f"unreadable listing entry {stat_line[:60]!r} {name[:60]!r}")
    try:
        kind = _mode_kind(words[0].decode("ascii"))
    except ValueError:
        raise StreamBroken(f"unreadable mode in the listing: {stat_line[:60]!r}") from None
    path = name[2:].decode("utf-8", "surrogateescape")
    return line_of(path, kind, 0 if kind == "dir" else int(words[1])) + "\n"
