"""A call's deadline, enforced from outside the call: cut the transport when it passes.

Blocking reads on sockets, websockets and pipes cannot be given an overall deadline
one ``recv`` at a time (a trickle resets every timeout). So each streaming exec arms a
watchdog: at the deadline it cuts the transport (shuts the socket down, kills the
process group), the blocked read returns or fails at once, and the call raises its
named error knowing the cut was the deadline's (``fired``), not the peer's. A deadline
riding a run context is cut the same way the moment that context is cancelled (L5).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from types import TracebackType
from typing import IO

from scratchbank.application.cancellation import Deadline


class Watchdog:
    """Calls ``cut`` once when ``deadline`` passes, unless the call ended first."""

    def __init__(self, deadline: Deadline, cut: Callable[[], None]) -> None:
        self.deadline = deadline
        self.fired = False
        self._cut = cut
        self._lock = threading.Lock()
        self._done = False
        self._timer = threading.Timer(deadline.left(), self._fire)
        self._timer.daemon = True
        self._unhook: Callable[[], None] = lambda: None

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
        with contextlib.suppress(Exception):  # the transport may already be closed
            self._cut()

    def cut_now(self) -> None:
        """Cut at once (a writer thread whose source failed: the reader must stop too)."""
        with contextlib.suppress(Exception):
            self._cut()

    def __enter__(self) -> Watchdog:
        self._timer.start()
        self._unhook = self.deadline.on_cancel(self._fire)  # L5: a cancel cuts at once
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()
        self._unhook()


class Feeder(threading.Thread):
    """A thread that feeds an exec from a source. A source that fails keeps its error
    (raised by the caller as StreamBroken) and cuts the exec at once: the reader must
    not wait for bytes that will never come. One place for every transport."""

    CHUNK = 1 << 20

    def __init__(self, src: IO[bytes], dog: Watchdog) -> None:
        super().__init__(daemon=True)
        self.src, self.dog = src, dog
        self.error: BaseException | None = None
        # What is there, not a full chunk: a command's output is passed on as it comes
        # (a buffered pipe's read(n) would wait for n bytes or the end, and a command
        # that waits on the host after writing, as a restore does, would wait forever).
        self._take = getattr(src, "read1", None) or src.read

    def _read(self) -> bytes:
        try:
            return self._take(self.CHUNK)
        except BaseException as error:
            self.error = error
            self.dog.cut_now()
            raise
