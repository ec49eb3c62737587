"""Rules L: the runner's lease while it banks. The pure tier's tests of L5 (tests/tiers.py: a file of
tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import threading

import pytest
from rigs.scripted_transport import (
    Scripted,
    drive,
    no_thread_left,  # noqa: F401 - a fixture
)

from scratchbank.application.cancellation import Cancel, Deadline
from scratchbank.domain.errors import ExecFailed

# ---- from tests/rules/test_[HLX]*.py: One exec pump for every transport (issue 25, build item 0; ADR 0008): the pump owns stdin's feeding, the bounded sinks, the deadline and the cut; a transport supplies only send/receive/cut. Driven here through a scripted transport (no engine): the engines' own runs are tests/test_deadlines.py, test_hostile_sandbox.py and test_sandboxes.py.


def test_L5_a_cancelled_run_context_cuts_the_exec_at_once(no_thread_left: None) -> None:
    """The run context is cancelled (the lease let go): the exec is cut long before its deadline.
    Proves ``scratchbank.adapters.exec_pump.pump``."""
    cancel = Cancel()
    exec_ = Scripted([], hold=True)
    timer = threading.Timer(0.05, cancel.cut, ("lease lost",))
    timer.start()
    with pytest.raises(ExecFailed):
        drive(exec_, None, None, Deadline.after(3600.0, cancel))
    timer.join()
    assert exec_.cuts >= 1
