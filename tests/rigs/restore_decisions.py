"""The restore's decision from records (``after_restore``) and the results that lose or fail to read.

First written for tests/test_rules_restore.py: After a restore attempt (X1-X7)."""

from __future__ import annotations

from scratchbank.domain import (
    Consents,
    RestoreResult,
    ResumeDecision,
    ResumeRequest,
    Verdict,
    decide_resume,
    fold,
)
from scratchbank.domain.records import Record
from scratchbank.testing.builders import banked, started

LOSES = (
    RestoreResult.GONE,
    RestoreResult.REFUSED_ON_HOST,
    RestoreResult.REFUSED_IN_SANDBOX,
    RestoreResult.NO_SANDBOX,
)


READS = (RestoreResult.READ_FAILED, RestoreResult.STREAM_BROKEN)


def restore_plan(*records: Record, accept: bool = False) -> ResumeDecision:
    consents = Consents(accept_scratch_loss=accept)
    d = decide_resume(fold(records or (started(), banked())), ResumeRequest(consents=consents))
    assert d.verdict is Verdict.RESTORE
    return d
