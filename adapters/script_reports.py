"""What the bank-side scripts (quiesce.sh, archive.sh, bank.sh) report, read into typed
reports and named errors: their exit codes, tar's warnings, the quiesce report at the
head of bank.sh's stdout and its status line at the end of its stderr.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from scratchbank.application.ports import (
    ArchiveReport,
    ByteSink,
    QuiesceReport,
)
from scratchbank.domain.errors import (
    ArchiveFailed,
    OutputOverBound,
)

from .exec_output import REPORT_BYTES, said

EMPTY, CANNOT_LIST = 10, 12
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


def quiesce_report(exit_code: int, lines: Sequence[str], err: str = "") -> QuiesceReport:
    """quiesce.sh's exit code and report lines as a QuiesceReport (T12, T13)."""
    tags = ("refused: ", "unquiesced: ")
    reasons = tuple(said(line.split(": ", 1)[1].encode(), 300) for line in lines if line.startswith(tags))
    # the script's own count is its last line: an earlier "stopped N" is no count of ours
    counts = [int(m.group(1)) for m in map(_STOPPED.match, lines) if m is not None]
    stopped = counts[-1] if counts else 0
    if exit_code == 0:
        return QuiesceReport(True, False, (), stopped)
    if exit_code == QUIESCE_REFUSED:
        return QuiesceReport(False, True, reasons or ("refused",))
    if exit_code == QUIESCE_PARTIAL:
        return QuiesceReport(False, False, reasons, stopped)
    detail = err or said("\n".join(lines).encode(), 500)
    return QuiesceReport(False, False, (f"quiesce exited {exit_code}: {detail}",))


_STOPPED = re.compile(r"^stopped (\d{1,9})$")
_VERDICT = re.compile(r"^scratchbank-quiesced (\d{1,3})$")


def quiesce_verdict(exit_code: int, lines: Sequence[str], err: str = "") -> QuiesceReport:
    """quiesce.sh stop's stdout: the report up to its first "scratchbank-quiesced CODE" line
    (every line after it, the watchdog's, is no report line of the quiesce: H4), whose
    CODE must be the exit code; no verdict line is no quiesce."""
    at = next((i for i, line in enumerate(lines) if _VERDICT.match(line)), None)
    if at is None:
        if exit_code == 0:
            return QuiesceReport(False, False, ("the quiesce exited 0 without its verdict line",))
        return quiesce_report(exit_code, lines, err)
    said_code = int(lines[at].rsplit(" ", 1)[1])
    if said_code != exit_code:
        why = f"the quiesce's verdict line says {said_code}, its exit code is {exit_code}"
        return QuiesceReport(False, False, (why,))
    return quiesce_report(exit_code, lines[:at], err)


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


#: bank.sh's exit code: archive.sh's status + 32 x the quiesce's verdict (index)
_BANK_VERDICTS = (0, QUIESCE_PARTIAL, QUIESCE_REFUSED)


def bank_exit(exit_code: int) -> tuple[int, int | None]:
    """bank.sh's exit code as (archive.sh's status, the quiesce's verdict); the verdict is
    None when the status was too large to carry it (126, 127, a signal's 128+)."""
    if 0 <= exit_code < 32 * len(_BANK_VERDICTS):
        return exit_code % 32, _BANK_VERDICTS[exit_code // 32]
    return exit_code, None


def confirmed(report: QuiesceReport, code: int | None, verdict: int | None, exit_code: int) -> QuiesceReport:
    """The report of bank.sh's verdict line (``code``) when the bank's exit code (set by its
    shell alone) confirms it; else unquiesced, named: a verdict line written ahead of the
    script's by another process of its user (PID 1 never stops), or no verdict in the exit
    code to confirm a quiesced line (H4)."""
    if verdict is not None and verdict == code:
        return report
    if verdict is None:
        if not report.quiesced:
            return report
        why = f"the bank's exit code {exit_code} carries no verdict to confirm its quiesced line"
    else:
        why = (
            f"the quiesce's verdict line says {code}, the bank's exit code says {verdict}: "
            "a line the script did not write (H4)"
        )
    return QuiesceReport(False, False, (why,))


def unconfirmed(report: QuiesceReport, why: str) -> QuiesceReport:
    """The report of a bank exec cut before its exit code: a quiesced verdict line is then
    confirmed by nothing (a process of the script's user can write one, then stop the
    script until the call is cut: H4), so it reads unquiesced, named; what it says was
    stopped is kept (T14)."""
    if not report.quiesced:
        return report
    return QuiesceReport(
        False,
        False,
        (f"the bank exec was cut before its exit code confirmed its verdict: {why}",),
        report.stopped,
    )


class QuiesceHead:
    """bank.sh's stdout: the quiesce report, up to its "scratchbank-quiesced CODE" line,
    read into ``report``; every byte after it (the tar stream) passed on to ``dest``."""

    LIMIT = REPORT_BYTES
    _END = re.compile(
        rb"(?:^|\n)scratchbank-quiesced (\d{1,3})\n"
    )  # as _VERDICT: int() of 4301 digits raises

    def __init__(self, dest: ByteSink) -> None:
        self._dest = dest
        self._head = bytearray()
        self.report: QuiesceReport | None = None
        #: the verdict line's code, once read
        self.code: int | None = None

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
        self.code = int(end.group(1))
        self.report = quiesce_report(self.code, lines)
        rest = bytes(self._head[end.end() :])
        self._head.clear()
        if rest:
            self._dest.write(rest)
        return len(data)
