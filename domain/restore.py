"""After a restore attempt: what to record, whether the record must land, and how to park.

X1-X7. A failure in the sandbox is the sandbox's or the transport's only because
the bank was checked on the host first (X2); this module is told which it was.
"""

from __future__ import annotations

import enum

import attrs

from .records import ScratchRestored
from .resume_gate import SCRATCH_NOT_PORTABLE, ResumeDecision, Verdict


class RestoreResult(enum.Enum):
    RESTORED = "restored"
    GONE = "gone"  # X4: the store has no bank
    REFUSED_ON_HOST = "refused_on_host"  # X4: the host check refused it
    REFUSED_IN_SANDBOX = "refused_in_sandbox"  # X4: the sandbox's tar refused it
    NO_SANDBOX = "no_sandbox"  # X4: the resume runs without a sandbox
    READ_FAILED = "read_failed"  # X5: the store or timeline read failed
    STREAM_BROKEN = "stream_broken"  # X5: the stream into the sandbox broke
    UNEXPECTED = "unexpected"  # X5: a failure nobody named (a bug): parked, redelivered


_LOSES_THE_BANK = {
    RestoreResult.GONE,
    RestoreResult.REFUSED_ON_HOST,
    RestoreResult.REFUSED_IN_SANDBOX,
    RestoreResult.NO_SANDBOX,
}


@attrs.frozen
class RestoreAttempt:
    result: RestoreResult
    bytes: int = 0
    into_host_dir: bool = False
    detail: str = ""


@attrs.frozen
class Park:
    """The run parks; with a code it is a deterministic refusal, without one a retry."""

    code: str | None
    reason: str


@attrs.frozen
class RestoreOutcome:
    record: ScratchRestored
    must_record: bool  # X7: written within its budget, or the resume fails without a code
    proceed: bool
    park: Park | None
    hold: bool  # X3: the failed sandbox's teardown banks nothing over the bank
    rule: str


def after_restore(decision: ResumeDecision, attempt: RestoreAttempt) -> RestoreOutcome:
    """What a restore attempt of a RESTORE decision leads to (X1-X7)."""
    if decision.verdict is not Verdict.RESTORE or decision.bank is None:
        raise ValueError("after_restore needs a RESTORE decision")
    accepted = decision.consents.accept_scratch_loss
    bank = decision.bank.record
    if attempt.result is RestoreResult.RESTORED:
        rec = ScratchRestored(
            restored=True,
            stale=decision.stale,
            accepted=accepted,
            bytes=attempt.bytes,
            host_backed=attempt.into_host_dir,
            raced=bank.raced,
            reason="restored a bank that raced" if bank.raced else "",
        )
        must = attempt.into_host_dir or decision.stale
        return RestoreOutcome(rec, must, True, None, False, "X6" if attempt.into_host_dir else "X1")
    reason = f"{attempt.result.value}: {attempt.detail}".rstrip(": ")
    if attempt.result in _LOSES_THE_BANK:
        if accepted:
            rec = ScratchRestored(restored=False, stale=decision.stale, accepted=True, reason=reason)
            return RestoreOutcome(rec, False, True, None, False, "X4")
        rec = ScratchRestored(restored=False, stale=decision.stale, accepted=False, reason=reason)
        park = Park(SCRATCH_NOT_PORTABLE, reason)
        return RestoreOutcome(rec, False, False, park, True, "X4")
    rec = ScratchRestored(restored=False, stale=decision.stale, accepted=False, reason=reason)
    return RestoreOutcome(rec, False, False, Park(None, reason), True, "X5")
