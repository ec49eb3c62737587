"""Which real engines and servers a test run has: found by the env vars ./dev test sets.

Under CI (CI=true) a missing one fails the test instead of skipping it.
"""

from __future__ import annotations

import os

import pytest

#: the engines the rigs actually started in this run (printed at the end)
EXERCISED: set[str] = set()


def need(var: str, what: str) -> str:
    value = os.environ.get(var)
    if value:
        return value
    message = f"{what} is not running ({var} unset): ./dev test starts it"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)
