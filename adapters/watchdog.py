"""A call's deadline, enforced from outside the call: cut the transport when it passes.

Blocking reads on sockets, websockets and pipes cannot be given an overall deadline
one ``recv`` at a time (a trickle resets every timeout). So each streaming exec arms a
watchdog: at the deadline it cuts the transport (shuts the socket down, kills the
process group), the blocked read returns or fails at once, and the call raises its
named error knowing the cut was the deadline's (``fired``), not the peer's. A deadline
riding a run context is cut the same way the moment that context is cancelled (L5).

Every cut is armed on one alarm thread per process (``ALARMS``): a timer thread per call
made each caller wait for its thread to start, which under load held the event store's
slots (issue 26). The event store arms its calls' cuts on it directly; a stream uses a
``Watchdog``. Execs do not use either: the exec pump (exec_pump.py) rides a
``CancelScope``, which owns the deadline, the cancel and the feeding thread.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable

from scratchbank.application.cancellation import Deadline


class Alarm:
    """One call's cut, armed on the process's ``Alarms``: ``fired`` once it ran."""

    __slots__ = ("at", "cut", "done", "fired", "lock")

    def __init__(self, at: float, cut: Callable[[], None]) -> None:
        self.at, self.cut = at, cut
        self.fired = self.done = False
        self.lock = threading.Lock()

    def fire(self) -> None:
        with self.lock:
            if self.done:
                return
            self.fired = True
        with contextlib.suppress(Exception):  # the connection may already be gone
            self.cut()

    def disarm(self) -> None:
        with self.lock:
            self.done = True


class Alarms:
    """Every call's cut on one thread per process. Disarmed alarms are dropped when their
    time comes; an alarm with no finite time is never armed (it never fires on its own)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Alarm]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, cut: Callable[[], None]) -> Alarm:
        alarm = Alarm(time.monotonic() + seconds, cut)
        if not math.isfinite(alarm.at):
            return alarm
        with self._cond:
            if self._thread is None or not self._thread.is_alive():  # first call (or a forked child)
                self._thread = threading.Thread(target=self._run, name="timeline-alarms", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, (alarm.at, next(self._order), alarm))
            if self._heap[0][2] is alarm:
                self._cond.notify()
        return alarm

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                alarm = heapq.heappop(self._heap)[2]
            alarm.fire()


ALARMS = Alarms()


class Watchdog:
    """Calls ``cut`` once when ``deadline`` passes, or at once when it is cancelled, unless
    the block ended first."""

    def __init__(self, deadline: Deadline, cut: Callable[[], None]) -> None:
        self.deadline = deadline
        self._cut = cut
        self._alarm = Alarm(math.inf, cut)  # replaced by the armed one on entry
        self._unhook: Callable[[], None] = lambda: None

    @property
    def fired(self) -> bool:
        return self._alarm.fired

    def cut_now(self) -> None:
        """Cut at once (a writer thread whose source failed: the reader must stop too)."""
        with contextlib.suppress(Exception):
            self._cut()

    def __enter__(self) -> Watchdog:
        self._alarm = ALARMS.arm(self.deadline.left(), self._cut)
        self._unhook = self.deadline.on_cancel(self._alarm.fire)  # L5: a cancel cuts at once
        return self

    def __exit__(self, *exc: object) -> None:
        """However the block ended: the alarm is disarmed, a cut after this is no one's."""
        self._alarm.disarm()
        self._unhook()
