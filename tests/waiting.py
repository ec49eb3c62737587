"""Waiting on a condition, never on the clock: ``eventually`` polls a predicate until it
holds and fails the test, naming what was waited for, if it never does within a bound.

The bound is a ceiling against a hang, not a speed claim: a loaded machine may use most
of it and the test still passes. No test sleeps a fixed time to "let something happen":
it waits for the thing itself (a log line, a record, a file's size) with this helper.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

BOUND = 60.0  # seconds: a ceiling against a hang on a loaded machine, not a timing


class NeverHappened(AssertionError):
    """What a test waited for did not happen within its bound."""


def eventually(
    predicate: Callable[[], T | None],
    *,
    timeout: float = BOUND,
    what: str = "the condition",
    interval: float = 0.05,
    detail: Callable[[], object] | None = None,
) -> T:
    """The predicate's first truthy answer, polled every ``interval`` seconds; raises
    ``NeverHappened`` (naming ``what`` and ``detail()``) once ``timeout`` seconds pass."""
    end = time.monotonic() + timeout
    pause = min(interval, 0.01)
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= end:
            seen = f"; seen: {detail()}" if detail is not None else ""
            raise NeverHappened(f"not within {timeout} s: {what}{seen}")
        time.sleep(pause)
        pause = min(pause * 2, interval)


def holds_throughout(predicate: Callable[[], bool], *, polls: int = 5, interval: float = 0.05) -> bool:
    """Whether ``predicate`` holds on each of ``polls`` checks ``interval`` apart (for a
    claim that something does NOT change: a count of checks, not a timed window)."""
    for i in range(polls):
        if not predicate():
            return False
        if i + 1 < polls:
            time.sleep(interval)
    return True
