"""Rules A: readings this project chose where the design is open. The engines tier's tests of A16, A17,
A18 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold). They sit apart from test_A_engines.py so that a parallel run (--dist
loadfile) can give their minutes to a worker of their own."""

from __future__ import annotations

from pathlib import Path

from rigs.explorer_worlds import SCHEDULES, SEED, THREE

from scratchbank.testing.explorer import keep
from scratchbank.testing.interleavings import sample_in_parallel

# ---- from tests/test_interleavings_sampled.py: The interleaving explorer's 10,000 random three-actor schedules (issue 18, item 5: A16-A18, C3-C5), in a file of their own: the suite's slowest test (minutes of CPU), it starts first on one worker while the others share the rest of tests/test_interleavings.py. The scenarios and the seed are that file's; ``SCRATCHBANK_EXPLORER_SCHEDULES`` changes the count.


def test_A16_A17_A18_three_actors_ten_thousand_random_schedules(fast_dir: Path) -> None:
    """A16-A18, C3-C5: SCHEDULES distinct three-actor schedules drawn at random (seeded),
    shared out over two processes (the timeline and the lock in memory).
    Proves ``scratchbank.application.run_lock.start_run``."""
    found = keep(sample_in_parallel(fast_dir, THREE, schedules=SCHEDULES, seed=SEED, memory=True))
    assert found.schedules >= SCHEDULES, f"only {found.schedules} distinct schedules drawn of {SCHEDULES}"
    assert found.violations == 0, found.report()
