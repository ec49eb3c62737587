"""Every call has a deadline (T8, T14, X5): a stalled transport fails in time, by name.

The stall checker shipped in ``scratchbank.testing.contracts`` runs against the local
sandbox, Docker, Podman, the Kubernetes double, S3 (through a loopback TCP proxy
that stops forwarding mid-transfer) and the timeline: PostgreSQL through a proxy
that stops forwarding and under a table lock held elsewhere, SQLite under a write
lock held elsewhere; the times it measured are printed (pytest -s).
"""

from __future__ import annotations

from scratchbank.application.retry import Budget
from scratchbank.testing.clocks import ManualClock


def test_a_deadline_gives_each_call_what_is_left_of_its_budget() -> None:
    clock = ManualClock()
    budget = Budget.start(clock, 30.0)
    clock.advance(25.0)
    assert 4.0 < budget.call_deadline().left() <= 5.0
    assert budget.call_deadline(cap=2.0).left() <= 2.0
    clock.advance(10.0)
    assert budget.call_deadline().left() >= 0.9  # never a call with no time at all
