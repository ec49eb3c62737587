"""Rules C: consents and the runner's deliveries. The engines tier's tests of C4 (tests/tiers.py: a
file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold). They sit apart from test_C_engines.py so that a parallel run (--dist
loadfile) can give their minutes to a worker of their own."""

from __future__ import annotations

from typing import Any

import pytest
from rigs.explorer_worlds import (
    RUNNER,
    RUNNER_SCHEDULES,
    SEED,
    none_found,
    runner_world,  # noqa: F401 - a fixture
)

from scratchbank.testing.explorer import Bounds, Fault, keep, show
from scratchbank.testing.interleavings import Scenario, World, explore_scenario, sample_scenarios

# ---- from tests/rules/test_[ACL]*.py: Issue 18, item 5: the interleaving explorer over the real use cases and adapters.


def test_C4_L4_A16_a_runner_delivery_and_the_sweeper_among_three_actors(runner_world: World) -> None:
    """C4, L4, A16-A18 (issue 19): RUNNER_SCHEDULES random three-actor schedules (seeded,
    up to two faults) of a runner's delivery, the outbox sweeper, teardowns and resumes:
    no silent revert, the recorded bank kept, one execution at a time, a lost claim reply
    keeps its consent, no run left queued once the sweeper runs.
    Proves ``scratchbank.application.runner.Runner.handle``."""
    found = keep(sample_scenarios(runner_world, RUNNER, schedules=RUNNER_SCHEDULES, seed=SEED))
    assert found.schedules >= RUNNER_SCHEDULES
    assert found.violations == 0, found.report()


def test_C4_a_planted_guess_of_a_lost_claim_reply_is_found(
    runner_world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C4 (issue 19, hole 1): every schedule of a consenting delivery with one lost reply
    holds; with the runner's settle-by-reading removed (a lost reply taken as not landed)
    the explorer finds the claim that drops its consent, by the schedule
    ``deliver:timeline.read > deliver:lease.acquire > deliver:timeline.read >
    deliver:timeline.append!lost > ...`` (the claim landed, its reply lost; the
    redelivery reads it claimed and lends no consent).
    Proves ``scratchbank.application.fencing.settle_append``."""
    from scratchbank.application import fencing

    scenario = Scenario("queued!", ("deliver",))
    lost_only = Bounds(max_faults=1, faults=frozenset({Fault.LOST}))
    none_found(explore_scenario(runner_world, scenario, lost_only))

    def guess(_timeline: Any, _run_id: str, _records: Any, _at: int, lost: Exception) -> int:
        raise lost

    monkeypatch.setattr(fencing, "settle_append", guess)
    found = keep(explore_scenario(runner_world, scenario, lost_only), counted=False)
    kind = "C3-C5: a claim carries consents its call did not give"
    assert kind in found.found, found.report()
    trace, _violation = found.found[kind]
    print(f"planted guess found by schedule: {show(trace)}")
    assert [str(s) for s in trace[:4]] == [
        "deliver:timeline.read",
        "deliver:lease.acquire",
        "deliver:timeline.read",
        "deliver:timeline.append!lost",
    ]
