"""Time, as the use cases see it: a port so that budgets are testable without waiting.

``monotonic`` and ``sleep`` measure budgets; ``wait`` is a sleep that an event ends
early (a keeper's interval, until it is stopped); ``now`` stamps the records a use case
writes (``at``, in UTC), so that a record says when it was written by the clock the
engine gave, never by a clock the record's reader cannot see.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait until ``event`` is set or ``seconds`` pass on this clock; is it set?"""
        ...

    def now(self) -> datetime:
        """The wall-clock time in UTC (timezone-aware)."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)

    def now(self) -> datetime:
        return datetime.now(UTC)
