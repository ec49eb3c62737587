"""The HTTP API's JSON bodies: the request and response models (which the OpenAPI document is
written from), the error statuses each describes from the one error table, and the error,
refusal (C9) and parked-restore bodies every route and guard answers with.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from scratchbank.application.resume import ResumeOutcome
from scratchbank.domain import errors
from scratchbank.domain.remedy import remedy
from scratchbank.domain.resume_gate import ResumeDecision

from . import config, error_table
from .present import cut, error_data, outcome_data, outcome_error


def status_of(error: errors.ScratchbankError) -> int:
    """The HTTP status of a named error, from the one error table."""
    return error_table.http_status(error)


class ResumeBody(BaseModel):
    """A resume call's body. Unknown fields are refused (422), never ignored."""

    model_config = ConfigDict(extra="forbid", strict=True)

    force: bool = Field(False, description="accept a changed source or artifact contract (C1)")
    accept_scratch_loss: bool = Field(False, description="accept the scratch's loss (C2)")
    source_changed: bool = Field(False, description="the engine's source check found a change")
    checkpoint: list[str] | None = Field(
        None,
        description="the checkpoint the engine resumes from: its lineage of ids, oldest first (ADR 0013)",
    )
    sandbox: str | None = Field(
        None, description=f"where to restore ({config.SANDBOX_FORMS}); must match the server's allow-list"
    )


class ErrorBody(BaseModel):
    """Every error: its message, code and remedy; a refusal adds its rule, hint and consents."""

    error: str
    error_code: str | None
    remedy: str
    rule: str | None = None
    hint: str | None = None
    also_needs_force: bool | None = None
    keep_force: bool | None = None
    keep_accept_scratch_loss: bool | None = None
    causes: list[str] | None = None


class StatusBody(BaseModel):
    run: str
    state: dict[str, Any]
    store: dict[str, Any]
    age_seconds: float | None
    resume: dict[str, Any]
    would: dict[str, Any] | None = Field(
        None, description="what a resume would really do when the store disagrees with the record (X4)"
    )
    goes_on: bool = Field(True, description="a resume with these consents would go on")
    needs_target: bool
    refusal: dict[str, Any] | None = None
    lock: dict[str, Any] | None = None


class QueuedBody(BaseModel):
    run: str
    queued: bool
    attempt: str | None
    heard: bool
    decision: dict[str, Any]


class OutcomeBody(BaseModel):
    proceeds: bool
    decision: dict[str, Any]
    restore: dict[str, Any] | None = None


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody, "description": describe_status(code)} for code in codes}


_EXTRA = {
    400: "a refusal (C9: error_code scratch_not_portable or resume_invalid)",
    409: "the restore parked the run (the failure it met named)",
}


def describe_status(status: int) -> str:
    """What an error status means here, written from the one error table."""
    codes = [cls.code for cls in error_table.all_error_classes() if error_table.row_of(cls).http == status]
    named = ", ".join(dict.fromkeys(codes))
    return "; ".join(filter(None, [_EXTRA.get(status, ""), named]))


def error_body(error: errors.ScratchbankError) -> dict[str, Any]:
    return error_data(error, "http")


def refusal_body(decision: ResumeDecision) -> dict[str, Any]:
    """The 400 body of a refusal (C9): every field read from the decision itself."""
    return {
        "error": decision.explanation,
        "error_code": decision.code.lower() if decision.code else None,
        "remedy": error_table.render(remedy(decision), "http"),
        "rule": decision.rule,
        "hint": error_table.render(remedy(decision), "http"),
        "also_needs_force": decision.also_needs_force,
        "keep_force": decision.keep_force,
        "keep_accept_scratch_loss": decision.keep_accept_scratch_loss,
        "causes": [c.kind.value for c in decision.causes],
    }


def parked_body(out: ResumeOutcome) -> dict[str, Any]:
    """A parked restore: the outcome, and what it met as ``{error, error_code, remedy}``."""
    body = outcome_data(out)
    failed = outcome_error(out)
    if failed is not None:
        return body | error_body(failed)
    park = out.restore.park if out.restore is not None else None
    reason = park.reason if park is not None else "the restore did not complete"
    code = (park.code if park is not None and park.code else "restore_failed").lower()
    hint = error_table.render(remedy(out.decision), "http") or "resume again; the restore is retried"
    return body | {"error": cut(reason), "error_code": code, "remedy": hint}
