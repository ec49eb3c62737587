"""Hypothesis profiles: `ci` (default, bounded for CI), `dev` (the pure tier's quick pass) and
`long` (HYPOTHESIS_PROFILE=long). A test that sets its own ``max_examples`` caps it by the
profile's (``min(n, settings.default.max_examples)``) so that `dev` stays quick."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long",
    max_examples=20_000,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# `./dev test -m pure` (and a developer's edit-run loop): every property still runs, on few
# examples, derandomized so that a failure there reproduces; CI runs the `ci` profile
settings.register_profile(
    "dev",
    max_examples=20,
    stateful_step_count=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# the `ci` profile with the seed free: `--hypothesis-seed=N` is ignored under `derandomize`, so a
# planted bug's catch rate over seeds (before lowering a test's examples) is measured with this one
settings.register_profile("ci-seeded", settings.get_profile("ci"), derandomize=False, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
