"""The operators' HTTP API (FastAPI), driving the same use cases as the CLI.

A refusal answers 400 with ``error_code: scratch_not_portable`` (or ``resume_invalid``),
the hint from the one remedy function, ``also_needs_force`` when the refusal names a
change --force accepts and the call lacked it, and ``keep_force`` when it had it (C9).
A timeline that cannot be read answers 503 without a code (R15). The OpenAPI
description is served at ``/openapi.json``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from scratchbank.application.ports import BankStore, Timeline
from scratchbank.application.resume import resume
from scratchbank.domain.consent import Consents
from scratchbank.domain.errors import TimelineUnreadable
from scratchbank.domain.fold import fold
from scratchbank.domain.remedy import remedy
from scratchbank.domain.resume_gate import (
    ResumeDecision,
    ResumeRequest,
    Verdict,
    Where,
    decide_resume,
    refuse_unreadable,
)

from . import config
from .present import decision_data, outcome_data, state_data


class ResumeBody(BaseModel):
    force: bool = Field(False, description="accept a changed source or artifact contract (C1)")
    accept_scratch_loss: bool = Field(False, description="accept the scratch's loss (C2)")
    source_changed: bool = Field(False, description="the engine's source check found a change")
    sandbox: str = Field("none", description="docker:NAME, podman:NAME or none")
    scratch: str = Field(config.DEFAULT_SCRATCH, description="the scratch's path in the sandbox")


def refusal_body(decision: ResumeDecision) -> dict[str, Any]:
    """The 400 body of a refusal (C9): every field read from the decision itself."""
    return {
        "error": decision.explanation,
        "error_code": decision.code.lower() if decision.code else None,
        "rule": decision.rule,
        "hint": remedy(decision),
        "also_needs_force": decision.also_needs_force,
        "keep_force": decision.keep_force,
        "keep_accept_scratch_loss": decision.keep_accept_scratch_loss,
        "causes": [c.kind.value for c in decision.causes],
    }


def _refused(decision: ResumeDecision) -> JSONResponse:
    status = 503 if decision.code is None else 400
    return JSONResponse(refusal_body(decision), status_code=status)


def create_app(timeline: Timeline, store: BankStore) -> FastAPI:
    app = FastAPI(title="scratchbank", version="0.1.0", description=__doc__)

    @app.get("/runs/{run_id}/status")
    def status(run_id: str) -> Any:
        try:
            state = fold(timeline.read(run_id))
        except TimelineUnreadable as error:
            return _refused(refuse_unreadable(error.message))
        decision = decide_resume(state, ResumeRequest(where=Where.SURFACE))
        return {"run": run_id, "state": state_data(state), "resume": decision_data(decision)}

    @app.post("/runs/{run_id}/resume")
    def resume_run(run_id: str, body: ResumeBody) -> Any:
        consents = Consents(force=body.force, accept_scratch_loss=body.accept_scratch_loss)
        request = ResumeRequest(consents=consents, source_changed=body.source_changed, where=Where.SURFACE)
        try:
            gate = decide_resume(fold(timeline.read(run_id)), request)
        except TimelineUnreadable as error:
            return _refused(refuse_unreadable(error.message))
        if gate.verdict is Verdict.REFUSE:
            return _refused(gate)
        if gate.verdict is Verdict.DEFER_TO_ENGINE:
            return JSONResponse({"deferred": True, "rule": gate.rule, "detail": gate.explanation}, 202)
        sandbox = config.open_sandbox(body.sandbox, body.scratch)
        engine = ResumeRequest(consents=consents, source_changed=body.source_changed)
        out = resume(run_id, engine, timeline=timeline, store=store, sandbox=sandbox)
        if out.decision.verdict is Verdict.REFUSE:
            return _refused(out.decision)
        return JSONResponse(outcome_data(out), status_code=200 if out.proceeds else 409)

    return app


def serve(host: str = "127.0.0.1", port: int = 8080) -> None:  # pragma: no cover - CLI entry
    import uvicorn

    app = create_app(config.open_timeline(config.timeline_url()), config.open_bank_store(config.bank_url()))
    uvicorn.run(app, host=host, port=port)
