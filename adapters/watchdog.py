"""A call's deadline, enforced from outside the call: cut the transport when it passes.

Blocking reads on sockets, websockets and pipes cannot be given an overall deadline
one ``recv`` at a time (a trickle resets every timeout). So each streaming exec arms a
watchdog: at the deadline it cuts the transport (shuts the socket down, kills the
process group), the blocked read returns or fails at once, and the call raises its
named error knowing the cut was the deadline's (``fired``), not the peer's. A deadline
riding a run context is cut the same way the moment that context is cancelled (L5).

Execs do not use it directly: the exec pump (exec_pump.py) rides a ``CancelScope``,
which owns the deadline, the cancel and the feeding thread. The stores' streams do.
A watchdog starts no thread: its cut is an alarm on the process's one alarm thread
(alarms.py), the one the timeline's store calls use; a cut that comes due runs on a
cutter thread, so one that blocks holds up no other watchdog's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from scratchbank.application.cancellation import Deadline

from .alarms import ALARMS, Alarm, Alarms


class Watchdog:
    """Calls ``cut`` once when ``deadline`` passes, unless the call ended first."""

    def __init__(self, deadline: Deadline, cut: Callable[[], None], *, alarms: Alarms = ALARMS) -> None:
        self.deadline = deadline
        self.fired = False
        self._cut = cut
        self._lock = threading.Lock()
        self._done = False
        self._alarms = alarms
        self._alarm: Alarm | None = None
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
        self._alarm = self._alarms.arm(self.deadline.left(), self._fire)
        self._unhook = self.deadline.on_cancel(self._fire)  # L5: a cancel cuts at once
        return self

    def __exit__(self, *exc: object) -> None:
        """However the block ended: the alarm is disarmed, a cut after this is no one's."""
        with self._lock:
            self._done = True
        if self._alarm is not None:
            self._alarm.disarm()
        self._unhook()
