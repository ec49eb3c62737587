"""After a restore attempt (X1-X7)."""

from __future__ import annotations

import pytest

from scratchbank.domain import (
    RestoreAttempt,
    RestoreResult,
    ResumeRequest,
    after_restore,
    decide_resume,
    fold,
)
from scratchbank.testing.builders import started


def test_after_restore_needs_a_restore_decision() -> None:
    d = decide_resume(fold((started(),)), ResumeRequest())
    with pytest.raises(ValueError):
        after_restore(d, RestoreAttempt(RestoreResult.RESTORED))
