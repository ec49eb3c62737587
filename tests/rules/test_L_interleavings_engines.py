"""Rules L: the runner's lease while it banks. The engines tier's tests of L5 (tests/tiers.py: a file
of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold). They sit apart from test_L_engines.py so that a parallel run (--dist
loadfile) can give their minutes to a worker of their own."""

from __future__ import annotations

from rigs.explorer_worlds import (
    _no_thread_left,
    runner_world,  # noqa: F401 - a fixture
)

from scratchbank.testing.interleavings import Scenario, World

# ---- from tests/rules/test_[ACL]*.py: Issue 18, item 5: the interleaving explorer over the real use cases and adapters.


def test_L5_dead_runner_actors_leave_no_thread_behind(runner_world: World) -> None:
    """L5/A16 (the explorer's own proof): a runner's delivery (its lease keeper) and the
    outbox sweeper that die at their pause points leave no thread behind.
    Proves ``scratchbank.application.lease_keeper.LeaseKeeper``."""
    _no_thread_left(runner_world, (Scenario("queued!", ("deliver", "outbox", "resume!")),))
