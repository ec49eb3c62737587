"""The interleaving explorer's 10,000 random three-actor schedules (issue 18, item 5: A16-A18,
C3-C5), in a file of their own: the suite's slowest test (minutes of CPU), it starts first on
one worker while the others share the rest of tests/test_interleavings.py. The scenarios and
the seed are that file's; ``SCRATCHBANK_EXPLORER_SCHEDULES`` changes the count."""

from __future__ import annotations

import os
from pathlib import Path

from test_interleavings import SEED, THREE

from scratchbank.testing.explorer import keep
from scratchbank.testing.interleavings import sample_in_parallel

SCHEDULES = int(os.environ.get("SCRATCHBANK_EXPLORER_SCHEDULES", "10000"))


def test_A16_A17_A18_three_actors_ten_thousand_random_schedules(fast_dir: Path) -> None:
    """A16-A18, C3-C5: SCHEDULES distinct three-actor schedules drawn at random (seeded),
    shared out over two processes (the timeline and the lock in memory)."""
    found = keep(sample_in_parallel(fast_dir, THREE, schedules=SCHEDULES, seed=SEED, memory=True))
    assert found.schedules >= SCHEDULES, f"only {found.schedules} distinct schedules drawn of {SCHEDULES}"
    assert found.violations == 0, found.report()
