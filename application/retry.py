"""The one retry helper every use case uses: budgets and doubling capped pauses.

A budget bounds how long a step may keep trying (T8: banking 5 min, records 30 s);
each try gets a deadline (cancellation.py) from the budget that is left. Budgets are
read on the use case's ``Clock`` (testable without waiting).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import attrs

from .cancellation import Deadline, calls_within
from .ports import Clock

T = TypeVar("T")

#: No call waits less than this, even when the budget is almost spent: a call with
#: no time at all would fail for a reason that is not the transport's.
FLOOR_SECONDS = 1.0


@attrs.frozen
class Pauses:
    """Doubling pauses, capped (the ADR: 1 s doubling; records capped at 8 s)."""

    first: float = 1.0
    cap: float = 8.0

    def __iter__(self) -> Iterator[float]:
        pause = self.first
        while True:
            yield pause
            pause = min(pause * 2, self.cap)


@attrs.frozen
class Budget:
    """How long a step may keep trying, on the use case's clock, from ``started``."""

    clock: Clock
    started: float
    seconds: float

    @classmethod
    def start(cls, clock: Clock, seconds: float) -> Budget:
        return cls(clock, clock.monotonic(), seconds)

    def left(self) -> float:
        return max(0.0, self.started + self.seconds - self.clock.monotonic())

    def allows_pause(self, pause: float) -> bool:
        """Is there time for this pause and another try after it?"""
        return self.clock.monotonic() + pause <= self.started + self.seconds

    def call_deadline(self, cap: float | None = None) -> Deadline:
        """A deadline for one call: the budget that is left (at least FLOOR_SECONDS), capped."""
        seconds = max(self.left(), FLOOR_SECONDS)
        return Deadline.after(min(seconds, cap) if cap is not None else seconds)


def retry_within(
    budget: Budget,
    call: Callable[[Deadline], T],
    *,
    retry_on: tuple[type[BaseException], ...],
    pauses: Pauses = Pauses(),
    tries: int | None = None,
    on_failure: Callable[[BaseException], None] | None = None,
) -> T:
    """Call until it succeeds, the budget (or ``tries``) runs out, or it raises something
    that is not in ``retry_on`` (raised at once). The last retryable error is raised when
    the budget is spent. Each call gets a deadline from the budget that is left.
    """
    for made, pause in enumerate(pauses, start=1):
        deadline = budget.call_deadline()
        try:
            with calls_within(deadline):
                return call(deadline)
        except retry_on as error:
            if on_failure is not None:
                on_failure(error)
            if (tries is not None and made >= tries) or not budget.allows_pause(pause):
                raise
        budget.clock.sleep(pause)
    raise AssertionError("unreachable: pauses never end")  # pragma: no cover
