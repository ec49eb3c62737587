"""Rules T: teardown: banking the scratch when a sandbox stops. The pure tier's tests of T1
(tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold). These sit apart from test_T.py: a name of theirs (a test's or a
fixture's) is another test's there."""

from __future__ import annotations

from rigs.teardown_world import FILES, teardown

from scratchbank.adapters.memory import FakeSandbox
from scratchbank.application.teardown import NothingRecorded
from scratchbank.domain.teardown import TeardownAction

# ---- from tests/test_teardown_use_case.py: The teardown banking use case under faults, with fakes (T1-T20). Each test names the expected outcome and checks that nothing was lost.


def test_T1_host_backed_scratch_is_never_banked() -> None:
    """Host backed scratch is never banked: ``scratchbank.application.teardown.bank_at_teardown``."""
    report, timeline, store = teardown(FakeSandbox(dict(FILES), host_backed=True))
    assert report.plan.action is TeardownAction.SKIP and not report.record.banked
    assert report.record == NothingRecorded("skipped", report.plan.reason)  # named, never None
    assert store.stored == {} and len(timeline.read("run-1")) == 1
