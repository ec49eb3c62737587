"""Time, as the use cases see it: a port so that budgets are testable without waiting.

``monotonic`` and ``sleep`` measure budgets; ``now`` stamps the records a use case
writes (``at``, in UTC), so that a record says when it was written by the clock the
engine gave, never by a clock the record's reader cannot see.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def now(self) -> datetime:
        """The wall-clock time in UTC (timezone-aware)."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def now(self) -> datetime:
        return datetime.now(UTC)
