"""Sandboxes driven by the in-sandbox scripts: one implementation of the Sandbox port
for every engine, which only has to say how to run a shell script in its sandbox.

The scripts (``scripts/*.sh``) are POSIX sh that runs under BusyBox and GNU alike. They
are passed as ``sh -c SCRIPT`` so that stdin stays free for the data stream. What the
scripts report is read in script_reports.py, the restore's wire protocol is
restore_wire.py, and what an exec may send back (its bounds, its result) is
exec_output.py.
"""

from __future__ import annotations

import abc
import contextlib
import os
import secrets
import tempfile
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import BinaryIO

import attrs

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

from .exec_output import LIST_BYTES, QUIET_BYTES, REPORT_BYTES, Bounded, ExecResult
from .restore_wire import (
    DISCARDED,
    TAR_REFUSED,
    FramedStream,
    _Conversation,
    _staged_header,
    _ThenVerdict,
    commit_notes,
    listing_bound,
    write_listing,
    write_modes,
)
from .script_reports import (
    QuiesceHead,
    archive_report,
    bank_exit,
    bank_status,
    confirmed,
    quiesce_verdict,
    unconfirmed,
)


def script(name: str) -> str:
    return (resources.files("scratchbank.adapters") / "scripts" / name).read_text()


QUIESCE, ARCHIVE, RESTORE = script("quiesce.sh"), script("archive.sh"), script("restore.sh")
if os.environ.get("SCRATCHBANK_RESTORE_TRACE"):  # each stage's end time on stderr (bench/profiling only)
    RESTORE = "SCRATCHBANK_TRACE=1\n" + RESTORE
LIST = RESTORE  # ``restore.sh list SCRATCH``: the tree in the stage's NUL-safe format
#: quiesce, archive and continue in one exec (T11-T16): bank.sh over the other two's functions
BANK = "SCRATCHBANK_LIBRARY=1\n" + QUIESCE + "\n" + ARCHIVE + "\n" + script("bank.sh")

#: The variable that marks every process of one call (``ScriptedSandbox.call``).
TOKEN_VAR = "SCRATCHBANK_EXEC"
#: After a cut: end every process whose environment carries the call's token, by a fresh
#: exec (its own shell and pipeline carry no token). /proc/PID/environ is the
#: environment a process was started with: a script cannot shed it by unsetting a variable.
#: A process caught inside an execve reads an empty environ for a moment (its new memory has
#: no environment yet): a detached ``setsid sh -c 'sleep 1000'`` was missed that way (3 cut
#: calls in 30 on the Kubernetes double), so passes repeat until one, the second at least,
#: kills nothing.
REAP = f"""me=$$
pass=0
while [ "$pass" -lt 20 ]; do
    pass=$((pass + 1))
    hit=""
    for d in /proc/[0-9]*; do
        p=${{d#/proc/}}
        [ "$p" = "$me" ] && continue
        tr '\\000' '\\n' <"$d/environ" 2>/dev/null | grep -qx "{TOKEN_VAR}=$1" || continue
        kill -KILL "$p" 2>/dev/null && hit=1
    done
    [ -z "$hit" ] && [ "$pass" -ge 2 ] && break
    sleep 0.05 2>/dev/null || sleep 1
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


#: A call given no deadline ends by this many seconds (a stalled transport is cut).
EXEC_SECONDS = 600.0


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
        return quiesce_verdict(done.exit_code, lines, done.err)

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
            return QuiescedArchive(unconfirmed(head.report, error.message[:200]), None, False, error)
        if head.report is None:
            why = f"the bank script sent no quiesce report (exit {done.exit_code}): {done.err[-500:]}"
            raise StreamBroken(why)
        status, stderr = bank_status(done.stderr)
        continued = status in ("continued", "nothing stopped")
        rc, verdict = bank_exit(done.exit_code)
        report = confirmed(head.report, head.code, verdict, done.exit_code)
        try:
            return QuiescedArchive(report, archive_report(rc, stderr), continued)
        except ArchiveFailed as error:
            return QuiescedArchive(report, None, continued, error)

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
                if (staged.received, staged.digest) != (framed.sent, framed.digest):
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
        if (staged.received, staged.digest) != (framed.sent, framed.digest):
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
