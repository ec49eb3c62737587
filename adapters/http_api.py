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

from __future__ import annotations

import fnmatch
import hmac
import ipaddress
import json
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import attrs
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from scratchbank.application.ports import Sandbox
from scratchbank.application.resume import ResumeOutcome, Target
from scratchbank.application.service import Queued, ScratchService
from scratchbank.domain import errors
from scratchbank.domain.admission import Consents
from scratchbank.domain.checkpoints import checkpoint_of
from scratchbank.domain.remedy import remedy
from scratchbank.domain.resume_gate import ResumeDecision, ResumeRequest, Verdict
from scratchbank.domain.runs import check_run_id

from . import config, error_table
from .present import cut, error_data, outcome_data, outcome_error, queued_data, status_data

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def status_of(error: errors.ScratchbankError) -> int:
    """The HTTP status of a named error, from the one error table."""
    return error_table.http_status(error)


@attrs.frozen
class ApiSettings:
    """What the server lets callers do: set by its operator, never by a request body."""

    token: str
    sandboxes: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "[::1]")
    max_body: int = 64 << 10
    scratch: str = config.DEFAULT_SCRATCH
    bind: str = "127.0.0.1"
    port: int = 8080
    generated: bool = False


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _token(token_file: str | None, env: Mapping[str, str]) -> str | None:
    path = token_file or env.get("SCRATCHBANK_API_TOKEN_FILE")
    if path:
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise errors.ConfigInvalid(f"cannot read the token file {path}: {error}") from None
        if len(token) < 16:
            raise errors.ConfigInvalid(f"the token in {path} is shorter than 16 characters")
        return token
    return env.get("SCRATCHBANK_API_TOKEN") or None


def api_settings(
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    token_file: str | None = None,
    sandboxes: list[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> ApiSettings:
    """The server's settings from flags and environment; refuses an open bind without a token."""
    env = os.environ if env is None else env
    token = _token(token_file, env)
    if token is None and not _loopback(host):
        raise errors.ConfigInvalid(
            f"refusing to serve on {host} without a token (SCRATCHBANK_API_TOKEN[_FILE])"
        )
    return ApiSettings(
        token or secrets.token_urlsafe(24),
        tuple(sandboxes or _listed(env, "SCRATCHBANK_API_SANDBOXES")),
        ("127.0.0.1", "localhost", "[::1]", host, *_listed(env, "SCRATCHBANK_API_HOSTS")),
        scratch=env.get("SCRATCHBANK_SCRATCH") or config.DEFAULT_SCRATCH,
        bind=host,
        port=port,
        generated=token is None,
    )


def _listed(env: Mapping[str, str], var: str) -> list[str]:
    return [item.strip() for item in env.get(var, "").split(",") if item.strip()]


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


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
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


def _outcome_response(out: ResumeOutcome) -> JSONResponse:
    if out.decision.verdict is Verdict.REFUSE:
        return JSONResponse(refusal_body(out.decision), status_code=400 if out.decision.code else 503)
    if out.proceeds:
        return JSONResponse(outcome_data(out), status_code=200)
    return JSONResponse(parked_body(out), status_code=409)


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


def _queued_response(out: Queued) -> JSONResponse:
    if out.refused:
        return JSONResponse(refusal_body(out.decision), status_code=400 if out.decision.code else 503)
    return JSONResponse(queued_data(out), status_code=200 if out.heard else 202)


def _sandbox(api: ApiSettings, spec: str | None) -> Sandbox | None:
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

    @app.get("/runs/{run_id}/status", response_model=StatusBody, responses=_errors(400, 404, 421, 503))
    def status(run_id: str, force: bool = False, accept_scratch_loss: bool = False) -> Any:
        """What a resume with these consents would do (the same decision), and the store check."""
        request = ResumeRequest(consents=Consents(force=force, accept_scratch_loss=accept_scratch_loss))
        report = service.status(check_run_id(run_id), request)
        return status_data(report, queued=service.queue is not None, surface="http")

    @app.post(
        "/runs/{run_id}/resume",
        response_model=OutcomeBody,
        responses={
            **_errors(400, 401, 403, 404, 409, 413, 421, 422, 503),
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
        target = Target(_sandbox(api, body.sandbox))
        return _outcome_response(service.resume(check_run_id(run_id), request, target))

    return Guard(app, api)


class Guard:
    """ASGI middleware: the Host check (421) and the body limit (413), before any route."""

    def __init__(self, app: ASGIApp, api: ApiSettings) -> None:
        self.app, self.api = app, api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if _host_name(host) not in self.api.hosts:
            return await _send_error(
                send, errors.HostNotAllowed(f"Host {cut(host, 100)!r} is not served here")
            )
        origin = headers.get("origin")
        if origin is not None and _origin_host(origin) not in self.api.hosts:
            why = f"Origin {cut(origin, 100)!r} is not served here (a browser page of another site)"
            return await _send_error(send, errors.HostNotAllowed(why))
        declared = headers.get("content-length", "0")
        body = (
            await self._body(receive) if declared.isdigit() and int(declared) <= self.api.max_body else None
        )
        if body is None:
            return await _send_error(send, errors.BodyTooLarge(f"the body is over {self.api.max_body} bytes"))
        return await self.app(scope, _replay(body, receive), send)

    async def _body(self, receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it passes the limit (the rest is never kept)."""
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.api.max_body:
                return None
        return body


def _origin_host(origin: str) -> str:
    try:
        parsed = config.urlparse(origin)
    except errors.ConfigInvalid:
        return ""
    host = parsed.hostname or ""
    return f"[{host}]" if ":" in host else host


def _host_name(host: str) -> str:
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if ":" in host else host


def _replay(body: bytes, then: Receive) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return await then()  # only a disconnect can come now
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def _send_error(send: Send, error: errors.ScratchbankError) -> None:
    payload = json.dumps(error_body(error)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status_of(error), "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def serve(service: ScratchService, api: ApiSettings) -> None:  # pragma: no cover - CLI entry
    import sys

    import uvicorn

    sock = listen(api)
    print(
        f"scratchbank API on http://{api.bind}:{sock.getsockname()[1]}; writes need the bearer token",
        file=sys.stderr,
    )
    if api.generated:
        print(f"generated token (this run only): {api.token}", file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(create_app(service, api), log_level="warning"))
    server.run(sockets=[sock])


def listen(api: ApiSettings) -> socket.socket:
    """The server's socket, bound here so that a bad address or a port in use is named."""
    family = socket.AF_INET6 if ":" in api.bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((api.bind.strip("[]"), api.port))
    except OSError as error:
        sock.close()
        raise errors.ConfigInvalid(
            f"cannot listen on {api.bind}:{api.port}: {error.strerror or error}"
        ) from None
    return sock
