"""A clock for tests: budgets run out without waiting, records carry a known time."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

#: A safety net for the test's own waits on other threads (never a timed assertion: a
#: thread that does not come back in this long is a hung test, reported as such).
HUNG_SECONDS = 30.0


class ManualClock:
    """The Clock port, advanced only by ``sleep`` (and ``advance``): every pause is kept.

    ``now()`` is a fixed UTC epoch plus the time slept, so a record's ``at`` says which
    try wrote it. ``wait(event, seconds)`` (a keeper's interval) returns only once the
    event is set or the test has advanced the clock past the waiter's time: no real
    sleeping decides anything. ``until_waiting(n)`` lets a test wait for ``n`` threads
    to be parked in ``wait`` (a keeper back at its interval after a refresh).
    """

    EPOCH = datetime(2026, 11, 30, tzinfo=UTC)

    def __init__(self) -> None:
        self.elapsed = 0.0
        self.slept: list[float] = []
        self._cond = threading.Condition()
        self._untils: list[float] = []  # the time each parked waiter waits for

    def monotonic(self) -> float:
        return self.elapsed

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        with self._cond:
            self.elapsed += seconds
            self._cond.notify_all()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        with self._cond:
            until = self.elapsed + seconds
            self._untils.append(until)
            self._cond.notify_all()
            try:
                # the event is checked at each wake and every few ms (a set() cannot
                # notify this condition); the clock decides when the time is up
                while not event.is_set() and self.elapsed < until:
                    self._cond.wait(0.005)
            finally:
                self._untils.remove(until)
                self._cond.notify_all()
            return event.is_set()

    def until_waiting(self, count: int = 1) -> None:
        """Block until ``count`` threads wait on this clock for a time still to come
        (one the clock was just advanced past is not waiting any more); raises if they
        never do."""
        with self._cond:
            parked = lambda: sum(u > self.elapsed for u in self._untils) >= count  # noqa: E731
            if not self._cond.wait_for(parked, HUNG_SECONDS):
                raise AssertionError(f"{count} waiter(s) never came to the clock")

    def now(self) -> datetime:
        return self.EPOCH + timedelta(seconds=self.elapsed)
