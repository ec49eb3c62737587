"""The operator's MCP server (``scratchbank mcp``): the same service as the CLI and the HTTP API,
for an assistant to drive, over stdio or streamable HTTP (the official ``mcp`` SDK).

Tools: ``status`` (the decision, the bank check and its age), ``explain`` (the decision with
given consents, its causes and records), ``resume`` and ``runs_needing_operator`` (runs a
resume would refuse, or whose latest restore parked or was refused by a runner). Resource:
``scratchbank://runs/{run}/timeline``, a run's records as JSON lines.

The scratch consent names the refusal it accepts (reading A19): an assistant sends flags
without condition, so over MCP ``accept_scratch_loss`` is the refusal's ``consent_name`` as
``status`` or the refusal returned it (it is built from the refusal's code, rule and
evidence: the records it read). A bare ``true``, or a name of another refusal (an older one,
another run's), forsakes nothing: the resume is refused as before. ``force`` stays a separate
boolean that covers this one call only (C1-C3). When a resume meets a scratch refusal without
the named consent and the client declared elicitation, the server asks the human (MCP
elicitation, a form whose one choice is the refusal's name): the acceptance is the named
consent, checked again against the refusal the resume then meets; a decline or a cancel
forsakes nothing. A client that did not declare it is never asked. A refusal, and every
named error, comes back as a tool error (``is_error``) whose text is ``CODE: {json}``: code,
kind (the error table's MCP column), rule and its words, causes, hint and remedy in this surface's words.

Over HTTP (streamable HTTP answering in SSE, so that the server can ask the human during a
call, as over stdio) the endpoint (``/mcp``) sits behind the HTTP API's guards: the bearer token on
every call, the Host and Origin checks, the body limit; a ``sandbox`` must match the server's
allow-list (``--allow-sandbox`` / ``SCRATCHBANK_API_SANDBOXES``) on either transport.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import anyio
import attrs
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import ClientCapabilities, ElicitationCapability, FormElicitationCapability
from pydantic import BaseModel, Field, create_model

from scratchbank.application.resume import Target
from scratchbank.application.service import ScratchService, StatusReport, latest_refusal
from scratchbank.domain import errors
from scratchbank.domain.admission import Consents
from scratchbank.domain.checkpoints import checkpoint_of
from scratchbank.domain.records import ResumeRefused, ScratchRestored
from scratchbank.domain.remedy import remedy
from scratchbank.domain.resume_gate import (
    CHECKPOINT_BANK_SWEPT,
    SCRATCH_NOT_PORTABLE,
    ResumeDecision,
    ResumeRequest,
)
from scratchbank.domain.runs import check_run_id
from scratchbank.domain.wire import encode

from . import error_table
from .http_api import allowed_sandbox
from .http_api_guard import ASGIApp, Guard, Receive, Scope, Send, send_error
from .http_api_server import listen
from .http_api_settings import ApiSettings
from .present import (
    cut,
    decision_data,
    error_data,
    outcome_data,
    outcome_error,
    state_data,
    status_data,
    would_do,
)
from .rules import title

T = TypeVar("T")
TIMELINE_URI = "scratchbank://runs/{run}/timeline"


def consent_name(decision: ResumeDecision) -> str | None:
    """The name a scratch consent gives to accept this refusal (A19); None for no scratch refusal.

    Readable, and tied to this very refusal: its code, its rule and the records it read
    (their positions and types), with a short digest of the same so a typo is not another
    refusal's name by chance."""
    if decision.code not in (SCRATCH_NOT_PORTABLE, CHECKPOINT_BANK_SWEPT):
        return None
    evidence = ",".join(f"{e.position + 1}:{e.type}" for e in decision.evidence)
    digest = hashlib.sha256(f"{decision.code}|{decision.rule}|{evidence}".encode()).hexdigest()[:12]
    return f"{decision.code.lower()}/{decision.rule}/{digest}"


@attrs.frozen
class Consent:
    """What one MCP resume call's arguments come to, and why (A19)."""

    consents: Consents
    named: bool
    why: str


def judge_consent(refusal: ResumeDecision | None, given: object, *, force: bool) -> Consent:
    """The scratch consent counts only when it names ``refusal`` (the refusal this call would
    meet without it); ``force`` is this call's own (C1, C3)."""
    name = consent_name(refusal) if refusal is not None else None
    if given is None or given is False:
        return Consent(Consents(force=force), False, "")
    if given is True:
        why = (
            "a bare accept_scratch_loss: true forsakes nothing over MCP: name the refusal (its consent_name)"
        )
        return Consent(Consents(force=force), False, why)
    if name is not None and isinstance(given, str) and hmac.compare_digest(given, name):
        return Consent(Consents(force=force, accept_scratch_loss=True), True, "")
    why = f"accept_scratch_loss names {cut(str(given), 80)!r}, not this refusal: it forsakes nothing"
    return Consent(Consents(force=force), False, why)


class McpRefusal(ToolError):
    """A tool error whose text is ``CODE: {json}`` (the code first, for a reader; JSON for a program)."""

    def __init__(self, code: str, payload: dict[str, Any]) -> None:
        super().__init__(f"{code}: {json.dumps(payload, sort_keys=True)}")
        self.code = code
        self.payload = payload


def named_error(error: errors.ScratchbankError) -> McpRefusal:
    data = error_data(error, "mcp") | {"kind": error_table.mcp_kind(error)}
    return McpRefusal(error.code, data)


def refusal_error(decision: ResumeDecision, why: str = "") -> McpRefusal:
    """A refusal as a tool error: code, rule (and its words), causes, hint, and the consent name."""
    data = decision_data(decision, surface="mcp")
    payload = {
        "error": decision.explanation,
        "error_code": (decision.code or "timeline_unreadable").lower(),
        "kind": "refused",
        "rule": decision.rule,
        "rule_says": title(decision.rule),
        "causes": data["causes"],
        "hint": data["hint"],
        "remedy": data["hint"],
        "also_needs_force": decision.also_needs_force,
        "keep_force": decision.keep_force,
        "consent_name": consent_name(decision),
    }
    if why:
        payload["consent"] = why
    return McpRefusal(decision.code or "TIMELINE_UNREADABLE", payload)


def _mcp_status(report: StatusReport, queued: bool) -> dict[str, Any]:
    data = status_data(report, queued=queued, surface="mcp")
    deciding = would_do(report) or report.assessment.decision
    data["consent_name"] = consent_name(deciding)
    data["resume_would"] = "go on" if data["goes_on"] else "be refused"
    return data


def run_ids(service: ScratchService) -> list[str]:
    """Every run the timeline holds, when its adapter can list them (the event store can)."""
    lister = getattr(service.timeline, "run_ids", None)
    if not callable(lister):
        raise errors.ConfigInvalid(
            "this timeline cannot list its runs: name the run (status RUN)",
            remedy="call status with a run id",
        )
    return sorted(str(run) for run in lister())


def needs_operator(service: ScratchService, run_id: str) -> dict[str, Any] | None:
    """Why a run needs an operator: a resume would be refused, its latest restore parked,
    or a runner refused its latest attempt (R12); None when none of these holds."""
    report = service.status(run_id)
    records = service.timeline.read(run_id)
    deciding = would_do(report) or report.assessment.decision
    last_restore = next((r for r in reversed(records) if isinstance(r, ScratchRestored)), None)
    refusal = latest_refusal(records)
    reasons = []
    if deciding.refused:
        reasons.append(f"a resume would be refused {deciding.code or ''} ({title(deciding.rule)})".strip())
    if last_restore is not None and not last_restore.restored and not last_restore.accepted:
        reasons.append(f"its latest restore parked: {cut(last_restore.reason, 200)}")
    if isinstance(refusal, ResumeRefused):
        reasons.append(
            f"the runner refused attempt {refusal.attempt}: {refusal.code} ({title(refusal.rule)})"
        )
    if not reasons:
        return None
    return {"run": run_id, "why": reasons, "consent_name": consent_name(deciding)}


async def _off_loop(call: Callable[[], T]) -> T:
    """A service call (blocking I/O) in a worker thread; a named error becomes a tool error."""
    try:
        return await anyio.to_thread.run_sync(call)
    except errors.ScratchbankError as error:
        raise named_error(error) from None


def _can_elicit(ctx: Context[Any, Any] | None) -> bool:
    """Did the client declare form elicitation (it can ask its human)? Never ask one that did not."""
    if ctx is None:
        return False
    try:
        session = ctx.request_context.session
        wanted = ClientCapabilities(elicitation=ElicitationCapability(form=FormElicitationCapability()))
        return bool(session.check_client_capability(wanted))
    except (AttributeError, ValueError):  # no request context (a direct call): no one to ask
        return False


def consent_form(name: str) -> type[BaseModel]:
    """The form the human answers: one choice, the refusal's consent name (a named consent)."""
    field = Field(
        description=f"choose {name} to accept losing this run's scratch",
        json_schema_extra={"enum": [name]},
    )
    model: type[BaseModel] = create_model("ScratchConsent", accept_scratch_loss=(str, field))
    return model


def consent_question(refusal: ResumeDecision, name: str) -> str:
    causes = "; ".join(cut(c.detail, 200) for c in refusal.causes) or cut(refusal.explanation, 300)
    return (
        f"The resume is refused: {refusal.code} ({title(refusal.rule)}). {causes}. "
        f"Going on loses the run's scratch (its files since the bank). "
        f"Accept to resume without it (consent {name}); decline to keep the run as it stands."
    )


#: How long a resume waits for the human's answer (SCRATCHBANK_MCP_ASK_SECONDS): past it, the
#: resume is refused as for a decline, and nothing is forsaken.
ASK_SECONDS = 300.0


def ask_seconds(env: Mapping[str, str]) -> float:
    """The deadline of the question to the human, from the environment (a named error if bad)."""
    given = env.get("SCRATCHBANK_MCP_ASK_SECONDS")
    if not given:
        return ASK_SECONDS
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 86_400:
        raise errors.ConfigInvalid(
            f"SCRATCHBANK_MCP_ASK_SECONDS is {cut(given, 40)!r}: give seconds, more than 0, at most 86400"
        )
    return seconds


async def ask_the_human(
    ctx: Context[Any, Any], refusal: ResumeDecision, consent: Consent, seconds: float = ASK_SECONDS
) -> str:
    """Elicit the human's consent to this scratch refusal: their acceptance is the refusal's
    name; a decline, a cancel, another answer, no answer within ``seconds`` or a client that
    cannot ask forsakes nothing."""
    name = consent_name(refusal)
    assert name is not None
    try:
        with anyio.fail_after(seconds):
            answer = await ctx.elicit(consent_question(refusal, name), consent_form(name))
    except TimeoutError:
        why = f"the human did not answer within {seconds:g} s: nothing forsaken"
        raise refusal_error(refusal, why) from None
    except (MCPError, ValueError) as error:  # no back channel, or an answer not of the form
        why = f"the human could not be asked ({cut(str(error), 200)}): nothing forsaken"
        raise refusal_error(refusal, why) from None
    if answer.action != "accept":
        raise refusal_error(refusal, f"the human answered {answer.action}: nothing forsaken")
    chosen = getattr(answer.data, "accept_scratch_loss", None)
    if not isinstance(chosen, str) or not hmac.compare_digest(chosen, name):
        raise refusal_error(refusal, "the human's answer names another refusal: nothing forsaken")
    return chosen


def build_server(service: ScratchService, api: ApiSettings) -> MCPServer[Any]:
    """The MCP server over ``service``; ``api`` gives the sandbox allow-list and scratch path."""
    asking = ask_seconds(os.environ)
    server: MCPServer[Any] = MCPServer(
        name="scratchbank",
        instructions=(
            "Operator tools for scratchbank: a run's scratch is banked when its sandbox stops and "
            "restored on resume, or the resume is refused by name. Call status first; a refusal's "
            "consent_name is what accept_scratch_loss must carry to accept losing the scratch "
            "(only when the human agreed). force accepts a changed source only."
        ),
        log_level="WARNING",
    )
    queued = service.queue is not None

    @server.tool()
    async def status(run: str) -> dict[str, Any]:
        """What a resume would do now: the decision (rule in words, causes, hint), whether the
        bank is in the store as recorded, its age, and the consent_name of a scratch refusal."""
        return await _off_loop(lambda: _mcp_status(service.status(check_run_id(run)), queued))

    @server.tool()
    async def explain(
        run: str, force: bool = False, accept_scratch_loss: str | bool | None = None
    ) -> dict[str, Any]:
        """The decision a resume with these consents would meet, with the state it read (no writes)."""

        def call() -> dict[str, Any]:
            bare = service.status(check_run_id(run), ResumeRequest(consents=Consents(force=force)))
            consent = judge_consent(
                would_do(bare) or bare.assessment.decision, accept_scratch_loss, force=force
            )
            report = service.status(run, ResumeRequest(consents=consent.consents))
            deciding = would_do(report) or report.assessment.decision
            return {
                "run": run,
                "state": state_data(report.assessment.state, retain=report.assessment.retain),
                "resume": decision_data(deciding, surface="mcp"),
                "consent_counted": consent.named,
                "consent": consent.why,
                "consent_name": consent_name(deciding),
            }

        return await _off_loop(call)

    @server.tool()
    async def resume(
        run: str,
        sandbox: str | None = None,
        force: bool = False,
        accept_scratch_loss: str | bool | None = None,
        checkpoint: list[str] | None = None,
        ctx: Context[Any, Any] | None = None,
    ) -> dict[str, Any]:
        """Resume a run: restore its bank into ``sandbox`` (a spec the server allows, e.g.
        docker:NAME), or refuse by name. accept_scratch_loss must be the refusal's consent_name
        (a bare true forsakes nothing); force covers a changed source for this call only;
        checkpoint is the lineage of ids the engine resumes from, oldest first (ADR 0013). A
        client that declared elicitation is asked for the human's consent to a refusal a named
        consent accepts."""

        def first() -> tuple[ResumeDecision, Consent]:
            check_run_id(run)
            if service.queue is None:
                allowed_sandbox(api, sandbox)  # the allow-list first: nothing is asked for a refused sandbox
            at = None if checkpoint is None else checkpoint_of(checkpoint)
            bare = service.status(run, ResumeRequest(consents=Consents(force=force), checkpoint=at))
            refusal = would_do(bare) or bare.assessment.decision
            return refusal, judge_consent(refusal, accept_scratch_loss, force=force)

        refusal, consent = await _off_loop(first)
        given = accept_scratch_loss
        if not consent.named and consent_name(refusal) is not None and _can_elicit(ctx):
            assert ctx is not None
            given = await ask_the_human(ctx, refusal, consent, asking)

        def call() -> dict[str, Any]:
            where = None if service.queue is not None else allowed_sandbox(api, sandbox)
            at = None if checkpoint is None else checkpoint_of(checkpoint)
            bare = service.status(run, ResumeRequest(consents=Consents(force=force), checkpoint=at))
            refusal = would_do(bare) or bare.assessment.decision
            consent = judge_consent(refusal, given, force=force)  # the name must still be this refusal's
            request = ResumeRequest(consents=consent.consents, checkpoint=at)
            if service.queue is not None:
                if sandbox is not None:
                    raise errors.InvalidRequest("sandbox: with a queue the runner starts the sandbox")
                out = service.queue_resume(run, request)
                if out.refused:
                    raise refusal_error(out.decision, consent.why)
                return {"run": run, "queued": True, "attempt": out.attempt, "heard": out.heard}
            check = service.status(run, request)
            would = would_do(check)
            if would is not None and would.refused:  # the bank is not in the store as recorded (X4)
                raise refusal_error(would, consent.why)
            if check.assessment.decision.refused:
                raise refusal_error(check.assessment.decision, consent.why)
            target = Target(where)
            outcome = service.resume(run, request, target)
            if outcome.decision.refused:
                raise refusal_error(outcome.decision, consent.why)
            failed = outcome_error(outcome)
            if failed is not None:
                raise named_error(failed)
            data = outcome_data(outcome)
            if not outcome.proceeds:
                raise McpRefusal(
                    "PARKED", data | {"kind": "refused", "remedy": remedy(outcome.decision, "mcp")}
                )
            return data | {"consent_counted": consent.named}

        return await _off_loop(call)

    @server.tool()
    async def runs_needing_operator() -> list[dict[str, Any]]:
        """The runs a resume would refuse, whose latest restore parked, or whose latest attempt a
        runner refused: each with why and the consent_name of its refusal."""

        def call() -> list[dict[str, Any]]:
            found = (needs_operator(service, run) for run in run_ids(service))
            return [entry for entry in found if entry is not None]

        return await _off_loop(call)

    @server.resource(TIMELINE_URI, mime_type="application/x-ndjson")
    async def timeline(run: str) -> str:
        """A run's timeline: one wire record (JSON) per line, oldest first."""
        records = await _off_loop(lambda: service.timeline.read(check_run_id(run)))
        return "".join(json.dumps(encode(r), sort_keys=True) + "\n" for r in records)

    return server


def serve_stdio(service: ScratchService, api: ApiSettings) -> None:  # pragma: no cover - CLI entry
    build_server(service, api).run()


class BearerGuard:
    """ASGI: every MCP call over HTTP needs the server's bearer token (a resume writes)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        given = headers.get("authorization", "")
        expected = f"Bearer {self.token}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return await send_error(
                send, errors.NotAuthorized("the MCP endpoint needs the server's bearer token")
            )
        return await self.app(scope, receive, send)


def http_app(service: ScratchService, api: ApiSettings) -> Any:
    """The streamable HTTP app at ``/mcp``, behind the API's Host/Origin, body and token guards."""
    from mcp.server.transport_security import TransportSecuritySettings

    hosts = [h for host in api.hosts for h in (host, f"{host}:*")]
    origins = [
        f"{scheme}://{h}" for host in api.hosts for h in (host, f"{host}:*") for scheme in ("http", "https")
    ]
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )
    # SSE responses, not json_response: a JSON body carries only the answer, so the server
    # would have no channel to ask the human during a resume (elicitation), and a refusal a
    # named consent accepts would only come back refused
    app = build_server(service, api).streamable_http_app(
        streamable_http_path="/mcp", transport_security=security, host=api.bind, json_response=False
    )
    return Guard(BearerGuard(app, api.token), api)


def serve_http(service: ScratchService, api: ApiSettings) -> None:  # pragma: no cover - CLI entry
    import sys

    import uvicorn

    sock = listen(api)
    sock.listen(128)  # connections queue from here on: a client told the port may call at once
    print(
        f"scratchbank MCP on http://{api.bind}:{sock.getsockname()[1]}/mcp; every call needs the token",
        file=sys.stderr,
        flush=True,
    )
    if api.generated:
        print(f"generated token (this run only): {api.token}", file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn.Config(http_app(service, api), log_level="warning")).run(sockets=[sock])
