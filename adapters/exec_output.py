"""What an exec into a sandbox may send back, bounded by its purpose (ADR 0008): the
bounds of each stream, the bounded sink, the collector every transport hands an exec's
stdout and stderr to, the exec's result, and how sandbox text is escaped for a record.
"""

from __future__ import annotations

import attrs

from scratchbank.application.ports import ByteSink
from scratchbank.domain.errors import OutputOverBound

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
#: text of the sandbox's in a record or a log: escaped, its last this many characters
SAID_CHARS = 2000


def said(raw: bytes, limit: int = SAID_CHARS) -> str:
    """Text a sandbox sent, as a record or a log may hold it: its tail, decoded, every
    control or undecodable byte escaped (a NUL, an ANSI escape, a newline that would forge
    a log line), cut to ``limit`` characters."""
    text = raw[-4 * limit :].decode("utf-8", "backslashreplace").strip()
    escaped = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return escaped[-limit:]


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
