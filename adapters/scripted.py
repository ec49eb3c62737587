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
import io
import json
import os
import re
import secrets
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib import resources
from typing import BinaryIO

import attrs

from scratchbank.application.ports import (
    ArchiveReport,
    ByteSink,
    Decide,
    QuiescedArchive,
    QuiesceReport,
    SandboxFacts,
    StagedRestore,
)
from scratchbank.application.retry import Deadline
from scratchbank.domain.errors import ArchiveFailed, RestoreRefused, ScratchbankError, StreamBroken


def script(name: str) -> str:
    return (resources.files("scratchbank.adapters") / "scripts" / name).read_text()


QUIESCE, ARCHIVE, RESTORE = script("quiesce.sh"), script("archive.sh"), script("restore.sh")
LIST = RESTORE  # ``restore.sh list SCRATCH``: the tree in the stage's NUL-safe format
#: quiesce, archive and continue in one exec (T11-T16): bank.sh over the other two's functions
BANK = "SCRATCHBANK_LIBRARY=1\n" + QUIESCE + "\n" + ARCHIVE + "\n" + script("bank.sh")

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


@attrs.frozen
class ExecResult:
    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace").strip()


class Output:
    """Where an exec's channels go: stdout to the caller's sink (or captured when none),
    stderr kept to its last MiB. One collector for every streaming transport."""

    KEEP = 1 << 20

    def __init__(self, stdout: ByteSink | None) -> None:
        self._captured = io.BytesIO() if stdout is None else None
        self._sink: ByteSink = stdout if stdout is not None else self._captured  # type: ignore[assignment]
        self._err = bytearray()

    def stdout(self, data: bytes) -> None:
        self._sink.write(data)

    def stderr(self, data: bytes) -> None:
        self._err += data
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
    said = ("refused: ", "unquiesced: ")
    reasons = tuple(line.split(": ", 1)[1] for line in lines if line.startswith(said))
    stopped = next((int(line.split()[1]) for line in lines if line.startswith("stopped ")), 0)
    if exit_code == 0:
        return QuiesceReport(True, False, (), stopped)
    if exit_code == QUIESCE_REFUSED:
        return QuiesceReport(False, True, reasons or ("refused",))
    if exit_code == QUIESCE_PARTIAL:
        return QuiesceReport(False, False, reasons, stopped)
    detail = err or "\n".join(lines)
    return QuiesceReport(False, False, (f"quiesce exited {exit_code}: {detail!r}",))


def archive_report(exit_code: int, stderr: bytes) -> ArchiveReport:
    """archive.sh's exit code and tar's warnings as an ArchiveReport, or ArchiveFailed."""
    if exit_code == EMPTY:
        return ArchiveReport(empty=True)
    err = stderr.decode("utf-8", "replace").strip()
    if exit_code == CANNOT_LIST:
        raise ArchiveFailed(f"cannot list the scratch: {err}")
    raced, neutral, other = read_tar_stderr(stderr)
    if exit_code == 0 or (exit_code == 1 and raced and not other):
        return ArchiveReport(False, tuple(raced), tuple(neutral + other))
    raise ArchiveFailed(f"tar exited {exit_code}: {err[-2000:]}")


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

    LIMIT = 1 << 20
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
                raise StreamBroken("the bank script's quiesce report never ended")
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

    @abc.abstractmethod
    def run(
        self,
        source: str,
        args: Sequence[str],
        *,
        stdin: BinaryIO | None = None,
        stdout: ByteSink | None = None,
        user: str | None = None,
        deadline: Deadline | None = None,
    ) -> ExecResult:
        """Run ``sh -c source scratchbank args...`` in the sandbox.

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
        done = self.run(QUIESCE, args, user=self.admin_user, deadline=deadline)
        return quiesce_report(done.exit_code, done.stdout.decode("utf-8", "replace").splitlines(), done.err)

    def continue_processes(self, *, deadline: Deadline | None = None) -> None:
        self.run(QUIESCE, ["cont"], user=self.admin_user, deadline=deadline)

    def archive(
        self, dest: ByteSink, *, compress: bool, verify: bool, deadline: Deadline | None = None
    ) -> ArchiveReport:
        args = [self.facts.scratch, "z" if compress else "raw", "1" if verify else "0"]
        done = self.run(ARCHIVE, args, stdout=dest, user=self.admin_user, deadline=deadline)
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
            done = self.run(BANK, args, stdout=head, user=self.admin_user, deadline=deadline)
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
        self, src: BinaryIO, *, compressed: bool, listing: ByteSink, need_bytes: int = 0
    ) -> StagedRestore:
        token = secrets.token_hex(8)
        framed = FramedStream(src)
        args = ["stage", self.facts.scratch, token, "z" if compressed else "raw", str(need_bytes)]
        with tempfile.TemporaryFile() as raw:
            try:
                done = self.run(RESTORE, args, stdin=framed, stdout=raw)  # type: ignore[arg-type]
            except BaseException:
                self._discard(token)
                raise
            if done.exit_code == TAR_REFUSED:
                raise RestoreRefused(f"the sandbox's tar refused the bank: {done.err[-2000:]}")
            if done.exit_code != 0:
                self._discard(token)
                raise StreamBroken(f"restore stream broke (exit {done.exit_code}): {done.err[-2000:]}")
            staged = _staged_header(raw, token)
            if (staged.received, staged.sha256) != (framed.sent, framed.sha256):
                self._discard(token)
                raise StreamBroken(f"the sandbox read {staged.received} bytes, {framed.sent} were sent")
            write_listing(raw, listing)
        return staged

    def commit_restore(self, staged: StagedRestore, *, dir_modes: Iterable[tuple[str, int]] = ()) -> str:
        """Apply the directory modes, move the staged tree into place; a note on what
        stayed behind (or "")."""
        with tempfile.TemporaryFile() as modes:
            write_modes(dir_modes, modes)
            done = self.run(
                RESTORE,
                ["commit", self.facts.scratch, staged.token],
                stdin=FramedStream(modes),  # type: ignore[arg-type]
            )
        if done.exit_code != 0:
            raise RestoreRefused(f"moving the restored tree into place failed: {done.err[-2000:]}")
        return commit_notes(done)

    def discard_restore(self, staged: StagedRestore) -> None:
        self._discard(staged.token)

    def restore_in_one_exec(
        self, src: BinaryIO, *, compressed: bool, need_bytes: int, decide: Decide
    ) -> str | None:
        """Stage, list, take the host's verdict and commit or discard: one exec (the
        script waits on stdin for the verdict ``decide`` gives once the listing is in)."""
        token = secrets.token_hex(8)
        framed = FramedStream(src)
        stdin = _ThenVerdict(framed)
        args = ["stage", self.facts.scratch, token, "z" if compressed else "raw", str(need_bytes), "converse"]
        with tempfile.TemporaryFile() as raw, tempfile.TemporaryFile() as modes:
            talk = _Conversation(
                raw, lambda: self._verdict(raw, token, framed, decide, modes, stdin), give_up=stdin.discard
            )
            try:
                done = self.run(RESTORE, args, stdin=stdin, stdout=talk)  # type: ignore[arg-type]
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
            self.run(RESTORE, ["discard", self.facts.scratch, token])

    def list_scratch(self) -> list[str]:
        """The scratch's tree as sorted manifest lines (see manifest.py); [] when absent."""
        with tempfile.TemporaryFile() as raw, tempfile.TemporaryFile() as lines:
            done = self.run(LIST, ["list", self.facts.scratch], stdout=raw, user=self.admin_user)
            if done.exit_code != 0:
                return []
            raw.seek(0)
            write_listing(raw, lines)
            lines.seek(0)
            return sorted(line.decode("ascii").rstrip("\n") for line in lines)


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
    notes = [line for line in done.err.splitlines() if line.startswith("scratchbank: note:")]
    return "; ".join(notes)[:2000]


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
    """stdout of a conversing restore: kept whole in ``raw``; once the staged header and
    the whole listing are in, ``then`` runs (in the reading thread). What it raises is
    kept (``error``) and answered with a discard, never raised into the transport."""

    HEAD = 512

    def __init__(self, raw: BinaryIO, then: Callable[[], None], *, give_up: Callable[[], None]) -> None:
        self._raw, self._then, self._give_up = raw, then, give_up
        self._head = bytearray()
        self._need: int | None = None
        self.got = 0
        self.answered = False
        self.error: BaseException | None = None

    def write(self, data: bytes) -> int:
        self._raw.write(data)
        self.got += len(data)
        if not self.answered:
            if self._need is None and len(self._head) < self.HEAD:
                self._head += data[: self.HEAD - len(self._head)]
                self._need = self._needed()
            if self._need is not None and self.got >= self._need:
                self._answer()
        return len(data)

    def _needed(self) -> int | None:
        """Bytes of output up to the listing's end, once its two head lines are in."""
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
        return len(lines[0]) + len(lines[1]) + 2 + stats + names

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


def write_listing(raw: BinaryIO, out: ByteSink) -> None:
    """restore.sh's listing (the byte counts of stats and names, "MODEHEX SIZE" lines,
    NUL-separated names in the same order), read from ``raw``'s current position,
    written to ``out`` as manifest lines, in bounded memory (two cursors over one file)."""
    stats_bytes, names_bytes = _tree_sizes(raw.readline(40))
    fd, at = raw.fileno(), raw.tell()
    stats = _records(fd, at, at + stats_bytes, b"\n")
    for name in _records(fd, at + stats_bytes, at + stats_bytes + names_bytes, b"\x00"):
        stat_line = next(stats, None)
        if stat_line is None:
            raise StreamBroken("the sandbox's listing has more names than entries")
        out.write(_manifest_line(stat_line, name).encode("ascii") + b"\n")
    if next(stats, None) is not None:
        raise StreamBroken("the sandbox's listing has more entries than names")


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
    return json.dumps([path, kind, 0 if kind == "dir" else int(words[1])])
