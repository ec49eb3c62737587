"""Helpers and fixtures of the tests first written in tests/rules/test_A_interleavings_sampled_engines.py (The
interleaving explorer's 10,000 random three-actor schedules (issue 18, item 5: A16-A18, C3-C5), in a
file of their own: the suite's slowest test (minutes of CPU), it starts first on one worker while
the others share the rest of tests/rules/test_[ACL]*.py. The scenarios and the seed are that
file's; ``SCRATCHBANK_EXPLORER_SCHEDULES`` changes the count.), shared by the rule tests filed by
family in tests/rules/ and by the tests that stayed."""

from __future__ import annotations

import os

SCHEDULES = int(os.environ.get("SCRATCHBANK_EXPLORER_SCHEDULES", "10000"))
