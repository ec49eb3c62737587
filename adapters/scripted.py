"""Sandboxes driven by the in-sandbox scripts: one implementation of the Sandbox port
for every engine, which only has to say how to run a shell script in its sandbox.

The scripts (``scripts/*.sh``) are POSIX sh that runs under BusyBox and GNU alike. They
are passed as ``sh -c SCRIPT`` so that stdin stays free for the data stream. This
module reads their exit codes and output into typed reports and named errors.
"""

from __future__ import annotations

import abc
import io
import re
from collections.abc import Sequence
from importlib import resources
from typing import BinaryIO

import attrs

from scratchbank.application.ports import ArchiveReport, ByteSink, QuiesceReport, SandboxFacts
from scratchbank.application.retry import Deadline
from scratchbank.domain.errors import ArchiveFailed, RestoreRefused, StreamBroken


def script(name: str) -> str:
    return (resources.files("scratchbank.adapters") / "scripts" / name).read_text()


QUIESCE, ARCHIVE, RESTORE = script("quiesce.sh"), script("archive.sh"), script("restore.sh")
LIST = r"""set -u
cd "$1/." 2>/dev/null || exit 12
find . -mindepth 1 -exec stat -c '%f|%s|%n' {} + 2>/dev/null
"""

EMPTY, CANNOT_LIST = 10, 12
#: A call given no deadline ends by this many seconds (a stalled transport is cut).
EXEC_SECONDS = 600.0
STREAM_BROKE, TAR_REFUSED = 20, 21
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
        lines = done.stdout.decode("utf-8", "replace").splitlines()
        reasons = tuple(
            line.split(": ", 1)[1] for line in lines if line.startswith(("refused: ", "unquiesced: "))
        )
        stopped = next((int(line.split()[1]) for line in lines if line.startswith("stopped ")), 0)
        if done.exit_code == 0:
            return QuiesceReport(True, False, (), stopped)
        if done.exit_code == QUIESCE_REFUSED:
            return QuiesceReport(False, True, reasons or ("refused",))
        if done.exit_code == QUIESCE_PARTIAL:
            return QuiesceReport(False, False, reasons, stopped)
        why = f"quiesce exited {done.exit_code}: {done.err or done.stdout!r}"
        return QuiesceReport(False, False, (why,))

    def continue_processes(self, *, deadline: Deadline | None = None) -> None:
        self.run(QUIESCE, ["cont"], user=self.admin_user, deadline=deadline)

    def archive(
        self, dest: ByteSink, *, compress: bool, verify: bool, deadline: Deadline | None = None
    ) -> ArchiveReport:
        args = [self.facts.scratch, "z" if compress else "raw", "1" if verify else "0"]
        done = self.run(ARCHIVE, args, stdout=dest, user=self.admin_user, deadline=deadline)
        if done.exit_code == EMPTY:
            return ArchiveReport(empty=True)
        if done.exit_code == CANNOT_LIST:
            raise ArchiveFailed(f"cannot list the scratch: {done.err}")
        raced, neutral, other = read_tar_stderr(done.stderr)
        if done.exit_code == 0 or (done.exit_code == 1 and raced and not other):
            return ArchiveReport(False, tuple(raced), tuple(neutral + other))
        raise ArchiveFailed(f"tar exited {done.exit_code}: {done.err[-2000:]}")

    def restore(self, src: BinaryIO, *, size: int, sha256: str, compressed: bool) -> None:
        args = [self.facts.scratch, str(size), sha256, "z" if compressed else "raw"]
        done = self.run(RESTORE, args, stdin=src)
        if done.exit_code == 0:
            return
        if done.exit_code == TAR_REFUSED:
            raise RestoreRefused(f"the sandbox's tar refused the bank: {done.err[-2000:]}")
        raise StreamBroken(f"restore stream broke (exit {done.exit_code}): {done.err[-2000:]}")

    def list_scratch(self) -> list[str]:
        """The scratch's tree as manifest lines (see tarstream.manifest_lines)."""
        import json

        done = self.run(LIST, [self.facts.scratch], user=self.admin_user)
        lines = []
        for raw in done.stdout.decode("utf-8", "surrogateescape").splitlines():
            mode, size, name = raw.split("|", 2)
            kind = _mode_kind(mode)
            path = name[2:] if name.startswith("./") else name
            lines.append(json.dumps([path, kind, 0 if kind == "dir" else int(size)]))
        return sorted(lines)
