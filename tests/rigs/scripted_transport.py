"""A scripted transport for the exec pump (no engine): stalled and failing streams, a recording
sandbox, and the check that no thread is left.

First written for tests/rules/test_[HLX]*.py: One exec pump for every transport (issue 25, build
item 0; ADR 0008): the pump owns stdin's feeding, the bounded sinks, the deadline and the cut; a
transport supplies only send/receive/cut. Driven here through a scripted transport (no engine): the
engines' own runs are tests/test_deadlines.py, test_hostile_sandbox.py and test_sandboxes.py."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator

import pytest

from scratchbank.adapters.exec_output import Bounded, ExecResult
from scratchbank.adapters.exec_pump import InputClosed, pump
from scratchbank.adapters.scripted import Exec, ScriptedSandbox
from scratchbank.application.cancellation import Deadline
from scratchbank.domain.errors import StreamBroken

HUNG = 30.0


class Scripted:
    """An exec whose output is ``chunks``; then, when ``hold``, it holds its output open
    (a detached child kept the pipe) until cut. ``reads`` stdin when ``reads`` is set."""

    def __init__(
        self, chunks: list[tuple[int, bytes]], *, hold: bool = False, reads: bool = True, code: int = 0
    ) -> None:
        self.chunks, self.hold, self.reads, self.code = list(chunks), hold, reads, code
        self.wants_input = True
        self.cuts = 0
        self.received = bytearray()
        self.closed_input = self.stopped = self.closed = False
        self._cut = threading.Event()
        self._stop = threading.Event()

    def send(self, chunk: bytes) -> None:
        if not self.reads:  # a peer that stopped reading: the send blocks until told
            self._stop.wait(HUNG)
            raise InputClosed("not read")
        self.received += chunk

    def close_input(self) -> None:
        self.closed_input = True

    def stop_input(self) -> None:
        self.stopped = True
        self._stop.set()

    def receive(self) -> tuple[int, bytes] | None:
        if self.chunks:
            return self.chunks.pop(0)
        if self.hold:
            self._cut.wait(HUNG)
        return None

    def cut(self) -> None:
        self.cuts += 1
        self._cut.set()
        self._stop.set()

    def exit_code(self) -> int:
        return self.code

    def close(self) -> None:
        self.closed = True


class Stalled(io.RawIOBase):
    """A source that gives its bytes, then blocks until the host answers (a restore's
    verdict); ``abandon`` is how the pump says the exec has ended."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.answered = threading.Event()

    def read(self, n: int = -1) -> bytes:
        if self.data:
            out, self.data = self.data, b""
            return out
        self.answered.wait(HUNG)
        return b""

    def abandon(self) -> None:
        self.answered.set()


class Failing(io.RawIOBase):
    def read(self, n: int = -1) -> bytes:
        raise OSError("the bank store's stream dropped")


def drive(started: Scripted, stdin: object, stdout: Bounded | None, deadline: Deadline) -> ExecResult:
    """``pump`` one call whose Exec carries these streams and this deadline."""
    return pump(started, Exec("", stdin=stdin, stdout=stdout, deadline=deadline))  # type: ignore[arg-type]


@pytest.fixture
def no_thread_left() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    assert set(threading.enumerate()) <= before, "a thread outlived its call"


#: the exec's parts as a signature: a function taking them all repeats what ``Exec`` holds
EXEC_PARTS = {"stdin", "stdout", "user", "deadline"}


class Recording(ScriptedSandbox):
    """A sandbox whose transport records each Exec (and fails the first when told)."""

    def __init__(self, fail: bool = False) -> None:
        self.seen: list[Exec] = []
        self.fail = fail
        self.list_bytes = 7

    def execute(self, exec_: Exec) -> ExecResult:
        self.seen.append(exec_)
        if self.fail and len(self.seen) == 1:
            raise StreamBroken("cut")
        return ExecResult(0)
