"""One cancellation scope (issue 25, build item 0): a scope owns its deadline, its cancel
and its threads, and joins them on exit; nothing outlives it silently. And
``retry_within``, the one retry loop (its ``again`` and ``stop``)."""

from __future__ import annotations

import threading

import pytest

from scratchbank.application.cancellation import Cancel, CancelScope, Deadline
from scratchbank.application.retry import Budget, Pauses, retry_within
from scratchbank.testing.clocks import ManualClock

#: a safety net for waits on events other threads set (never a timed assertion)
HUNG = 30.0


def test_H7_a_thread_started_in_a_scope_is_joined_at_its_exit() -> None:
    """The body returns before its thread: the exit waits for the thread to end."""
    release, ended = threading.Event(), threading.Event()

    def work() -> None:
        release.wait(HUNG)
        ended.set()

    with CancelScope(60.0, name="t") as scope:
        thread = scope.start(work, "work")
        release.set()
    assert ended.is_set() and not thread.is_alive()
    assert scope.outlived == () and not scope.fired


def test_H7_a_scope_deadline_cancels_its_children() -> None:
    """The deadline passes: the scope's cancel is cut, its hooks run, a nested scope is cut."""
    cut = threading.Event()
    with CancelScope(0.05, name="outer") as outer:
        outer.on_cut(cut.set)
        with CancelScope(parent=outer, name="inner") as inner:
            assert inner.deadline.at <= outer.deadline.at
            scope_thread = inner.start(lambda: inner.cancel.wait(HUNG), "waits-for-the-cut")
        assert inner.fired and inner.cancelled
        assert outer.cancel.wait(HUNG)  # its own deadline, the same instant
    assert outer.fired and cut.is_set() and not scope_thread.is_alive()


def test_H7_an_outer_cancel_cuts_the_scope_at_once() -> None:
    """A run context (the deadline's Cancel) cancelled: the scope and its deadline are cut."""
    run_context = Cancel()
    with CancelScope(Deadline.after(3600.0, run_context), name="s") as scope:
        waiter = scope.start(lambda: scope.cancel.wait(HUNG), "waiter")
        run_context.cut("the lease was lost")
    assert scope.fired and scope.deadline.passed() and not waiter.is_alive()
    assert scope.cancel.why == "the lease was lost"


def test_H7_nested_scopes_an_inner_cut_stays_inner_an_outer_cut_reaches_down() -> None:
    """Cutting an inner scope leaves the outer one running; cutting the outer cuts the inner."""
    with CancelScope(60.0, name="outer") as outer:
        with CancelScope(parent=outer, name="inner") as inner:
            inner.cut("done here")
        assert inner.cancelled and not outer.cancelled
        with CancelScope(parent=outer, name="second") as second:
            waiter = second.start(lambda: second.cancel.wait(HUNG), "waiter")
            outer.cut("the outer scope is cut")
        assert second.fired and second.cancel.why == "the outer scope is cut" and not waiter.is_alive()
    assert not outer.fired


def test_H7_a_scope_exited_by_an_exception_cuts_and_still_joins() -> None:
    """The body raises: the scope cuts (its threads see it) and joins them before the raise."""
    threads: list[threading.Thread] = []
    scope = CancelScope(3600.0, name="s")

    def body() -> None:
        with scope:
            threads.append(scope.start(lambda: scope.cancel.wait(HUNG), "waiter"))
            raise KeyError("boom")

    with pytest.raises(KeyError):
        body()
    assert scope.cancelled and not threads[0].is_alive() and scope.outlived == ()


def test_H7_a_thread_that_will_not_stop_is_named_never_leaked_silently(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A thread that ignores the cut outlives the grace: the scope names it and logs it."""
    stubborn = threading.Event()
    with CancelScope(0.01, name="s", grace=0.05) as scope:
        thread = scope.start(lambda: stubborn.wait(HUNG), "stubborn")
    try:
        assert scope.outlived == ("s:stubborn",)
        assert "s:stubborn" in caplog.text
    finally:
        stubborn.set()
        thread.join(HUNG)


def test_H7_the_deadline_timer_is_joined_too() -> None:
    """No thread of the scope's own (its deadline timer) is left after the exit."""
    before = threading.active_count()
    with CancelScope(3600.0, name="s"):
        pass
    assert threading.active_count() == before


def test_T8_retry_within_tries_again_while_the_result_asks_and_stops_when_told() -> None:
    """``again`` repeats a result; ``stop(pause)`` gives up before a pause; tries bound it."""
    clock = ManualClock()
    made: list[int] = []

    def call(_d: Deadline) -> int:
        made.append(len(made))
        return len(made)

    got = retry_within(Budget.start(clock, 100.0), call, retry_on=(), again=lambda n: n < 3)
    assert got == 3 and clock.slept == [1.0, 2.0]
    made.clear()
    got = retry_within(
        Budget.start(clock, 100.0), call, retry_on=(), again=lambda _n: True, stop=lambda p: p >= 4.0
    )
    assert got == 3 and clock.slept[2:] == [1.0, 2.0]
    made.clear()
    got = retry_within(Budget.start(clock, 100.0), call, retry_on=(), again=lambda _n: True, tries=2)
    assert got == 2


def test_T8_retry_within_does_not_sleep_a_pause_of_zero() -> None:
    """A retry with no pause (a teardown deciding again after a conflict) records no sleep."""
    clock = ManualClock()
    calls = iter([KeyError("a"), KeyError("b"), "ok"])

    def call(_d: Deadline) -> str:
        item = next(calls)
        if isinstance(item, BaseException):
            raise item
        return item

    got = retry_within(Budget.start(clock, 10.0), call, retry_on=(KeyError,), pauses=Pauses(0.0, 0.0))
    assert got == "ok" and clock.slept == []
