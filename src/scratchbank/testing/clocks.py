"""A clock for tests: budgets run out without waiting, records carry a known time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class ManualClock:
    """The Clock port, advanced only by ``sleep`` (and ``advance``): every pause is kept.

    ``now()`` is a fixed UTC epoch plus the time slept, so a record's ``at`` says which
    try wrote it.
    """

    EPOCH = datetime(2026, 11, 30, tzinfo=UTC)

    def __init__(self) -> None:
        self.elapsed = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.elapsed

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.elapsed += seconds

    def advance(self, seconds: float) -> None:
        self.elapsed += seconds

    def now(self) -> datetime:
        return self.EPOCH + timedelta(seconds=self.elapsed)
