"""The operators' HTTP API (FastAPI) over the same service as the CLI.

- ``GET /runs/{run}/status``: what a resume would do (the one decision), whether the bank
  is in the store as recorded, and its age.
- ``POST /runs/{run}/resume`` (bearer token required): resume in this process; with a
  queue (``SCRATCHBANK_QUEUE``) judge as a surface and publish: 202 ``{queued, attempt}``
  for a detached runner, the engine's verdict when a runner runs in this process. A
  refusal answers 400 with ``error_code: scratch_not_portable`` (or ``resume_invalid``),
  the hint from the one remedy function, ``also_needs_force`` and ``keep_force`` (C9).

Every error body is ``{error, error_code, remedy}`` (plus the refusal's fields); each code's
status is in the one error table (``adapters/error_table.py``, printed in the README), and the
OpenAPI document's error responses are written from it. A refusal (C9) is 400; a restore that
parked the run is 409 with the failure it met named in the same three fields. Remedies name
the API's JSON fields (``"accept_scratch_loss": true``), never the CLI's flags.

Which sandboxes a caller may name, and the scratch path inside them, are the server's
configuration (``SCRATCHBANK_API_SANDBOXES`` or ``--allow-sandbox``, shell patterns),
never the body's. The server refuses to listen beyond loopback without a token.
"""

# This module holds the routes (the docstring above is the OpenAPI document's description).
# Beside it: http_api_settings (what the operator allows), http_api_bodies (the JSON bodies
# and error statuses), http_api_guard (Host/Origin and body-limit middleware), http_api_server
# (the socket and uvicorn).
from __future__ import annotations

import fnmatch
import hmac
from collections.abc import Callable
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from scratchbank.application.ports import Sandbox
from scratchbank.application.resume import ResumeOutcome, Target
from scratchbank.application.service import Queued, ScratchService
from scratchbank.domain import errors
from scratchbank.domain.admission import Consents
from scratchbank.domain.checkpoints import checkpoint_of
from scratchbank.domain.resume_gate import ResumeRequest, Verdict
from scratchbank.domain.runs import check_run_id

from . import config
from .http_api_bodies import (
    OutcomeBody,
    QueuedBody,
    ResumeBody,
    StatusBody,
    error_body,
    error_responses,
    parked_body,
    refusal_body,
    status_of,
)
from .http_api_guard import ASGIApp, Guard
from .http_api_settings import ApiSettings, api_settings
from .present import cut, outcome_data, queued_data, status_data

#: what callers import from here (the CLI, the MCP server, tests)
__all__ = ["ApiSettings", "ResumeBody", "allowed_sandbox", "api_settings", "create_app", "status_of"]


def _outcome_response(out: ResumeOutcome) -> JSONResponse:
    if out.decision.verdict is Verdict.REFUSE:
        return JSONResponse(refusal_body(out.decision), status_code=400 if out.decision.code else 503)
    if out.proceeds:
        return JSONResponse(outcome_data(out), status_code=200)
    return JSONResponse(parked_body(out), status_code=409)


def _queued_response(out: Queued) -> JSONResponse:
    if out.refused:
        return JSONResponse(refusal_body(out.decision), status_code=400 if out.decision.code else 503)
    return JSONResponse(queued_data(out), status_code=200 if out.heard else 202)


def allowed_sandbox(api: ApiSettings, spec: str | None) -> Sandbox | None:
    if spec is None:
        return None
    if not any(fnmatch.fnmatchcase(spec, pattern) for pattern in api.sandboxes):
        raise errors.SandboxNotAllowed(f"sandbox {cut(spec, 200)!r} is not among those this server allows")
    return config.open_sandbox(spec, api.scratch)


def _bearer(api: ApiSettings) -> Callable[[HTTPAuthorizationCredentials | None], None]:
    def check(
        credentials: HTTPAuthorizationCredentials | None = Depends(HTTPBearer(auto_error=False)),
    ) -> None:
        given = credentials.credentials if credentials is not None else ""
        if not hmac.compare_digest(given.encode(), api.token.encode()):
            raise errors.NotAuthorized("this call writes: it needs the server's bearer token")

    return check


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(errors.ScratchbankError)
    async def named(_: Request, error: errors.ScratchbankError) -> JSONResponse:
        return JSONResponse(error_body(error), status_code=status_of(error))

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        fields = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {cut(str(e['msg']), 200)}" for e in error.errors()
        )
        named = errors.InvalidRequest(cut(fields, 2000))
        return JSONResponse(error_body(named), status_code=status_of(named))

    @app.exception_handler(HTTPException)
    async def http(_: Request, error: HTTPException) -> JSONResponse:
        code = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        body = {"error": str(error.detail), "error_code": code or "http_error", "remedy": "see /openapi.json"}
        return JSONResponse(body, status_code=error.status_code)


def create_app(service: ScratchService, api: ApiSettings) -> ASGIApp:
    """The API over ``service``, behind the Host check and the body limit."""
    app = FastAPI(title="scratchbank", version="0.1.0", description=__doc__)
    _install_handlers(app)

    @app.get(
        "/runs/{run_id}/status", response_model=StatusBody, responses=error_responses(400, 404, 421, 503)
    )
    def status(run_id: str, force: bool = False, accept_scratch_loss: bool = False) -> Any:
        """What a resume with these consents would do (the same decision), and the store check."""
        request = ResumeRequest(consents=Consents(force=force, accept_scratch_loss=accept_scratch_loss))
        report = service.status(check_run_id(run_id), request)
        return status_data(report, queued=service.queue is not None, surface="http")

    @app.post(
        "/runs/{run_id}/resume",
        response_model=OutcomeBody,
        responses={
            **error_responses(400, 401, 403, 404, 409, 413, 421, 422, 503),
            202: {"model": QueuedBody, "description": "queued for a detached runner (R12)"},
        },
        dependencies=[Depends(_bearer(api))],
    )
    def resume_run(run_id: str, body: ResumeBody) -> Any:
        consents = Consents(force=body.force, accept_scratch_loss=body.accept_scratch_loss)
        stamp = None if body.checkpoint is None else checkpoint_of(body.checkpoint)
        request = ResumeRequest(consents=consents, source_changed=body.source_changed, checkpoint=stamp)
        if service.queue is not None:
            if body.sandbox is not None:
                raise errors.InvalidRequest("sandbox: with a queue the runner starts the sandbox")
            return _queued_response(service.queue_resume(check_run_id(run_id), request))
        target = Target(allowed_sandbox(api, body.sandbox))
        return _outcome_response(service.resume(check_run_id(run_id), request, target))

    return Guard(app, api)
