"""Rules A: readings this project chose where the design is open. The engines tier's tests of A16, A17,
A18 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold). They sit apart from test_A_engines.py: each of the six
chunks is a unit of its own for a parallel run (tests/tiers.py, SPREAD), so their minutes go to
whichever workers are free."""

from __future__ import annotations

from pathlib import Path

import pytest
from rigs.explorer_worlds import SCHEDULES, THREE, sample_chunk

from scratchbank.testing.explorer import keep

# ---- from tests/test_interleavings_sampled.py: The interleaving explorer's 10,000 random three-actor schedules (issue 18, item 5: A16-A18, C3-C5), in a file of their own: the suite's slowest test (minutes of CPU), it starts first on one worker while the others share the rest of tests/test_interleavings.py. The scenarios and the seed are that file's; ``SCRATCHBANK_EXPLORER_SCHEDULES`` changes the count.


@pytest.mark.parametrize("k", range(len(THREE)), ids=[f"{i}-{sc.name}" for i, sc in enumerate(THREE)])
def test_A16_A17_A18_three_actors_ten_thousand_random_schedules(fast_dir: Path, k: int) -> None:
    """A16-A18, C3-C5: SCHEDULES distinct three-actor schedules drawn at random (seeded), one
    chunk per scenario (the timeline and the lock in memory): tests/tiers.py makes each chunk a
    unit of its own for pytest-xdist, so the six run on whichever workers are free.
    Proves ``scratchbank.application.run_lock.start_run``."""
    share = -(-SCHEDULES // len(THREE))
    found = keep(sample_chunk(fast_dir, k))
    assert found.schedules >= share, f"only {found.schedules} distinct schedules drawn of {share}"
    assert found.violations == 0, found.report()
