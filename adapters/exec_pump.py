"""One exec pump for every transport (local, Docker/Podman, Kubernetes): ADR 0008.

The caller's ``Exec`` (what to run: source, args, streams, user, deadline, token) is one
value from ScriptedSandbox.call through the transport's ``execute`` into ``pump``.
A transport supplies only the primitives of one started exec (``Started``): ``send`` a
chunk of stdin, ``close_input``, ``receive`` the next chunk of output, ``cut`` it, and
read its ``exit_code``. The pump owns everything else, once: feeding stdin from the
caller's source on a thread of the call's ``CancelScope``, draining stdout and stderr
into the bounded sinks (``Output``), the deadline and the run context's cancel (the
scope cuts the exec the moment either passes), and naming what went wrong. The call
returns by its deadline whatever holds the exec's output (a child that detached and
kept the pipe, a peer that stopped reading): the cut unblocks ``receive`` and ``send``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import IO, Protocol

from scratchbank.application.cancellation import CancelScope, deadline_of
from scratchbank.domain.errors import ExecFailed, ScratchbankError, StreamBroken

from .exec_output import ExecResult, Output
from .scripted import EXEC_SECONDS, Exec

#: What the pump feeds in one ``send`` (a transport may frame it smaller).
CHUNK = 1 << 20
STDOUT, STDERR = 1, 2
#: how long a call waits, once its exec ended or was cut, for its stdin feeder to stop
GRACE = 1.0


class InputClosed(Exception):
    """``send``: the exec stopped reading its stdin (it exited, refused, or was cut).

    Not an error of the call's: the exec's exit status says why."""


class Started(Protocol):
    """One started exec, as a transport drives it. ``cut`` may be called from any thread
    at any time, more than once; it must make a blocked ``receive`` or ``send`` return
    (``receive``: None, or raise; ``send``: raise InputClosed) and end the exec's work."""

    #: does the pump feed stdin through ``send``? (False: the transport wired it itself)
    wants_input: bool

    def send(self, chunk: bytes) -> None: ...

    def close_input(self) -> None:
        """Every byte of stdin was sent: tell the exec (EOF) where the transport can."""

    def stop_input(self) -> None:
        """The exec's output ended: nobody reads more stdin; unblock a ``send``."""

    def receive(self) -> tuple[int, bytes] | None:
        """The next output chunk as (STDOUT or STDERR, bytes); None once output ended.
        Raises StreamBroken (or a ScratchbankError) when the transport broke."""
        ...

    def cut(self) -> None: ...

    def exit_code(self) -> int:
        """Once output ended: the exec's exit code (or a named error: no status)."""
        ...

    def close(self) -> None:
        """Release the transport (after the call, whatever happened)."""


class _Feeder:
    """Feeds one exec's stdin from a source; a failing source keeps its error and cuts."""

    def __init__(self, src: IO[bytes], exec_: Started) -> None:
        self.src, self.exec = src, exec_
        self.error: BaseException | None = None
        self.sent_all = False
        self.halt = threading.Event()
        # What is there, not a full chunk: a command's output is passed on as it comes
        # (a buffered pipe's read(n) waits for n bytes or the end; a restore waits on the
        # host after writing).
        self._take: Callable[[int], bytes] = getattr(src, "read1", None) or src.read

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                chunk = self._take(CHUNK)
            except BaseException as error:  # the source failed: nobody waits for the rest
                self.error = error
                self.exec.cut()
                return
            if not chunk:
                break
            if self.halt.is_set():
                return
            try:
                self.exec.send(chunk)
            except InputClosed:
                return  # the exec stopped reading: its exit status says why
        else:
            return
        self.sent_all = True
        try:
            self.exec.close_input()
        except InputClosed:
            return


def pump(exec_: Started, what: Exec, *, stdout: bool = True, name: str = "exec") -> ExecResult:
    """Drive one started exec of ``what`` to its end (or its cut) and return what it said:
    stdin fed from ``what.stdin`` (when the transport wants it), stdout into ``what.stdout``
    (``stdout=False``: the transport wired it itself), by ``what.deadline`` (None:
    EXEC_SECONDS).

    Raises: the sink's OutputOverBound (or any ScratchbankError of a sink) after cutting
    the exec; StreamBroken when the source failed, the transport broke, or the deadline
    cut a streaming call (ExecFailed for a call without streams); the transport's named
    errors from ``exit_code``. ``exec_`` is closed on every path.
    """
    stdin, deadline = what.stdin, deadline_of(what.deadline, EXEC_SECONDS)
    streaming = what.streaming  # a stream wired by the transport itself counts too
    output = Output(what.stdout if stdout else None)
    feeder = _Feeder(stdin, exec_) if stdin is not None and exec_.wants_input else None
    live = [True]  # a cut ends the exec only while it is ours to end (not once it exited)
    try:
        with CancelScope(deadline, name=name, grace=GRACE) as scope:
            scope.on_cut(lambda: exec_.cut() if live[0] else None)
            if feeder is not None:
                scope.start(feeder.run, "stdin")
            try:
                _drain(exec_, output)
            except ScratchbankError:
                exec_.cut()
                if scope.fired:
                    raise _cut_error(streaming) from None
                if feeder is not None and feeder.error is not None:
                    raise _source_error(feeder.error) from None
                raise
            except Exception as error:  # a sink that failed on the host side
                exec_.cut()
                if scope.fired:
                    raise _cut_error(streaming) from None
                raise StreamBroken(f"the stream broke on the host side: {error!r}") from error
            finally:
                if feeder is not None:  # the output ended: nobody reads more stdin
                    feeder.halt.set()
                    exec_.stop_input()
                    _abandon(stdin)
            if scope.fired:
                raise _cut_error(streaming)
            if feeder is not None and feeder.error is not None:
                raise _source_error(feeder.error)
            try:
                code = exec_.exit_code()
            except ScratchbankError:
                if scope.fired:
                    raise _cut_error(streaming) from None
                raise
            if scope.fired:
                raise _cut_error(streaming)
            live[0] = False
            # the exec has ended: its feeder gets the grace, never the deadline, to stop
            scope.cut("the exec ended")
            return output.result(code)
    finally:
        exec_.close()


def _abandon(src: object) -> None:
    """A source that blocks until the host answers (a restore's verdict) may offer
    ``abandon``: the exec has ended, so the read in progress returns."""
    abandon = getattr(src, "abandon", None)
    if callable(abandon):
        abandon()


def _source_error(error: BaseException) -> StreamBroken:
    return StreamBroken(f"stdin stream broke: {error!r}")


def _drain(exec_: Started, output: Output) -> None:
    while (got := exec_.receive()) is not None:
        channel, data = got
        if channel == STDOUT:
            output.stdout(data)
        else:
            output.stderr(data)


def _cut_error(streaming: bool) -> ScratchbankError:
    why = "the exec did not end within its deadline: cut"
    return StreamBroken(why) if streaming else ExecFailed(why)
