"""One alarm thread per process for every cut at a deadline (issue 26).

A call that cannot be given an overall deadline one ``recv`` at a time (a store's socket,
a stream's body) is cut from outside when its deadline passes. Every such cut, the
timeline's store calls and the stores' ``Watchdog`` alike, is an ``Alarm`` on the one
``ALARMS``: a heap of deadlines served by one daemon thread, started at the first arm (and
again in a forked child). No cut starts a thread of its own: a timer thread per call
started inside the call's slot, and under load every slot holder waited for its thread to
start. A disarmed alarm is dropped when its time comes. A cut that came due runs on a cutter
thread, not on the alarm thread: a cut that blocks (the S3 store's ``body.close()`` when it
finds no socket to shut down) holds its own cutter and no one else's; the next cut due runs
on an idle cutter, or on a new one when every cutter is busy (issue 26), up to ``MAX_CUTTERS``
(a storm of a thousand cuts that block started a thousand threads): past it, a cut waits for
the first cutter free; a cutter that cannot start (the process's thread limit) leaves its cut
to the alarm thread (its RuntimeError killed that thread: no cut ran again). Cuts are rare
(a call past its deadline); an idle cutter waits ``CUTTER_IDLE`` seconds for more, then ends.

The transports' stdin feeders are not alarms: they live in the exec pump (exec_pump.py).
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import math
import os
import threading
import time
import weakref
from collections.abc import Callable

#: The longest the alarm thread waits at once before looking at the clock again: a wait
#: past the platform's timeout (``inf``, a deadline of years) raised and killed the thread.
LONGEST_WAIT = 3600.0
#: How long an idle cutter thread waits for another cut before it ends.
CUTTER_IDLE = 30.0
#: The most cutter threads at once: past it a cut due waits for a cutter to come free.
MAX_CUTTERS = 64


class Alarm:
    """One armed cut: ``fire`` runs it once unless ``disarm`` came first; ``fired`` once it ran."""

    __slots__ = ("at", "cut", "done", "fired", "lock")

    def __init__(self, at: float, cut: Callable[[], None]) -> None:
        self.at, self.cut = at, cut
        self.fired = self.done = False
        self.lock = threading.Lock()

    def fire(self) -> None:
        with self.lock:
            if self.done or self.fired:
                return
            self.fired = True
        with contextlib.suppress(Exception):  # the transport may already be gone
            self.cut()

    def disarm(self) -> None:
        """The call ended: the cut will not run. It lets go of the cut (and so of the
        transport the cut closes over) now, not when its time would have come."""
        with self.lock:
            self.done = True
            self.cut = _nothing


def _nothing() -> None:
    """A disarmed alarm's cut."""


class _Cutters:
    """The threads that run the cuts that came due: a waiting one takes the next, and a new
    one starts when every one is busy (a cut that blocks stalls no other), up to
    ``MAX_CUTTERS``; past that a cut waits for the first cutter free (a storm of cuts that
    block starts no thread per cut). Started lazily; an idle cutter ends after
    ``CUTTER_IDLE`` seconds without a cut."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: collections.deque[Alarm] = collections.deque()
        self._waiting = 0  # cutters waiting for a cut
        self.live = 0  # cutter threads running
        self.started = 0

    def run(self, alarm: Alarm) -> None:
        """Hand ``alarm`` to a waiting cutter, or to a new one; never waits for a cut."""
        with self._cond:
            if len(self._pending) < self._waiting or self.live >= MAX_CUTTERS:
                self._pending.append(alarm)
                self._cond.notify()
                return
            self.live += 1
            self.started += 1
        try:
            threading.Thread(target=self._serve, args=(alarm,), name="scratchbank-cut", daemon=True).start()
        except RuntimeError:  # no thread to be had (the process's limit): cut here, never drop it
            with self._cond:
                self.live -= 1
            alarm.fire()

    def _serve(self, alarm: Alarm) -> None:
        while True:
            alarm.fire()
            with self._cond:
                self._waiting += 1
                while not self._pending:
                    if not self._cond.wait(CUTTER_IDLE) and not self._pending:
                        self._waiting -= 1
                        self.live -= 1
                        return
                alarm = self._pending.popleft()
                self._waiting -= 1


class Alarms:
    """Every cut of the process on one thread: a heap of (time, alarm) by ``clock``
    (``time.monotonic``; a test injects its own and ``poke``s after advancing it)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Alarm]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._cutters = _Cutters()
        _EVERY.add(self)

    def _forked(self) -> None:
        """In a forked child: none of the parent's cuts (its calls are not this process's;
        a cut would shut a descriptor the parent shares), a fresh lock, no thread yet."""
        self._cond = threading.Condition()
        self._heap = []
        self._thread = None
        self._cutters = _Cutters()

    def arm(self, seconds: float, cut: Callable[[], None]) -> Alarm:
        """``cut`` in ``seconds`` (at once when <= 0 or nan, never when inf), on the alarm
        thread, unless disarmed first."""
        now = self.clock()
        at = now + seconds
        alarm = Alarm(now if math.isnan(at) else at, cut)  # a nan in the heap unsorts it
        with self._cond:
            if self._thread is None or not self._thread.is_alive():  # first arm (or a forked child)
                self._thread = threading.Thread(target=self._run, name="scratchbank-alarms", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, (alarm.at, next(self._order), alarm))
            if self._heap[0][2] is alarm:
                self._cond.notify()
        return alarm

    def poke(self) -> None:
        """Look at the clock again now (an injected clock was advanced)."""
        with self._cond:
            self._cond.notify()

    def armed(self) -> int:
        """Alarms still in the heap (disarmed ones leave it when their time comes)."""
        with self._cond:
            return len(self._heap)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > self.clock():
                    self._cond.wait(
                        min(self._heap[0][0] - self.clock(), LONGEST_WAIT) if self._heap else None
                    )
                alarm = heapq.heappop(self._heap)[2]
            if not alarm.done:  # a disarmed one is dropped here, on no cutter
                self._cutters.run(alarm)


_EVERY: weakref.WeakSet[Alarms] = weakref.WeakSet()


def _after_fork() -> None:
    for alarms in list(_EVERY):
        alarms._forked()


os.register_at_fork(after_in_child=_after_fork)

#: The process's one alarm thread (every Watchdog, every timeline call's cut).
ALARMS = Alarms()
