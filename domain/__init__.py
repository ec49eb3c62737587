"""The pure domain: records, the fold, and the decisions. No I/O, no clock, no env.

A test (tests/test_architecture.py) fails the build if a module here imports
anything outside an allow-list of pure modules.
"""

from .admission import Consents, Delivery, DeliveryVerdict, judge_delivery
from .adoption import AdoptionDecision, ChildNode, decide_adoption
from .checkpoints import Checkpoint
from .errors import ScratchbankError, TimelineConflict, TimelineUnreadable
from .fold import Bank, Evidence, ScratchState, fold, step
from .kinds import Workflow
from .records import (
    AttemptClaimed,
    AttemptQueued,
    NodeFinished,
    Record,
    RunResumed,
    RunRewound,
    RunStarted,
    RunStatus,
    RunStatusChanged,
    SandboxShared,
    ScratchBanked,
    ScratchForsaken,
    ScratchRestored,
    UnknownRecord,
)
from .remedy import remedy
from .restore import Park, RestoreAttempt, RestoreOutcome, RestoreResult, after_restore
from .resume_gate import (
    RESUME_INVALID,
    SCRATCH_NOT_PORTABLE,
    Cause,
    CauseKind,
    ResumeDecision,
    ResumeRequest,
    Verdict,
    Where,
    decide_resume,
    refuse_unreadable,
)
from .teardown import (
    CAP_BYTES,
    Archive,
    Quiesce,
    Seen,
    TeardownAction,
    TeardownPlan,
    TryOutcome,
    merge_try,
    plan_teardown,
    teardown_record,
)
from .wire import decode, decode_all, encode

__all__ = [
    "CAP_BYTES",
    "RESUME_INVALID",
    "SCRATCH_NOT_PORTABLE",
    "AdoptionDecision",
    "Archive",
    "AttemptClaimed",
    "AttemptQueued",
    "Bank",
    "Cause",
    "CauseKind",
    "Checkpoint",
    "ChildNode",
    "Consents",
    "Delivery",
    "DeliveryVerdict",
    "Evidence",
    "NodeFinished",
    "Park",
    "Quiesce",
    "Record",
    "RestoreAttempt",
    "RestoreOutcome",
    "RestoreResult",
    "ResumeDecision",
    "ResumeRequest",
    "RunResumed",
    "RunRewound",
    "RunStarted",
    "RunStatus",
    "RunStatusChanged",
    "SandboxShared",
    "ScratchBanked",
    "ScratchForsaken",
    "ScratchRestored",
    "ScratchState",
    "ScratchbankError",
    "Seen",
    "TeardownAction",
    "TeardownPlan",
    "TimelineConflict",
    "TimelineUnreadable",
    "TryOutcome",
    "UnknownRecord",
    "Verdict",
    "Where",
    "Workflow",
    "after_restore",
    "decide_adoption",
    "decide_resume",
    "decode",
    "decode_all",
    "encode",
    "fold",
    "judge_delivery",
    "merge_try",
    "plan_teardown",
    "refuse_unreadable",
    "remedy",
    "step",
    "teardown_record",
]
