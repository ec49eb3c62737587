"""The `scratchbank` command: operators' view of the same use cases the engine runs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from scratchbank.application.resume import current_state, resume
from scratchbank.domain.consent import Consents
from scratchbank.domain.errors import ScratchbankError
from scratchbank.domain.fold import Evidence, fold
from scratchbank.domain.resume_gate import ResumeRequest, Where, decide_resume
from scratchbank.domain.teardown import plan_teardown

from . import config
from .jsonl import read_timeline_file
from .present import (
    decision_data,
    decision_text,
    outcome_data,
    outcome_text,
    plan_data,
    state_data,
    state_text,
)

EXIT_OK, EXIT_REFUSED, EXIT_ERROR = 0, 3, 2


def _consent_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true", help="accept a changed source (C1)")
    parser.add_argument("--accept-scratch-loss", action="store_true", help="accept the scratch's loss (C2)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def _stores(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeline", default=None, help="timeline URL (sqlite:/// or postgresql://)")
    parser.add_argument("--bank", default=None, help="bank store URL (file:/// or s3://)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scratchbank", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    resume_cmd = sub.add_parser("resume", help="resume a run: restore its scratch or refuse, by name")
    resume_cmd.add_argument("run")
    _consent_flags(resume_cmd)
    _stores(resume_cmd)
    resume_cmd.add_argument("--sandbox", default="none", help="docker:NAME, podman:NAME or none")
    resume_cmd.add_argument("--scratch", default=config.DEFAULT_SCRATCH)
    resume_cmd.add_argument("--source-changed", action="store_true")
    resume_cmd.add_argument("--progress", action="store_true", help="show transfer progress")
    status = sub.add_parser("status", help="what the timeline says of a run's scratch")
    status.add_argument("run")
    status.add_argument("--json", action="store_true")
    _stores(status)
    sub.add_parser("demo", help="the whole story on the embedded default (local, SQLite, files)")
    serve = sub.add_parser("serve", help="serve the HTTP API (OpenAPI at /openapi.json)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    explain = sub.add_parser("explain", help="fold a JSONL timeline and explain the decisions")
    explain.add_argument("timeline", help="a JSON Lines file, one record per line")
    _consent_flags(explain)
    explain.add_argument("--source-changed", action="store_true")
    explain.add_argument("--artifact-contract-changed", action="store_true")
    explain.add_argument(
        "--surface", action="store_true", help="decide as a surface would (R10), not the engine"
    )
    explain.add_argument("--finished", action="store_true", help="the run finished (teardown)")
    explain.add_argument("--host-backed", action="store_true", help="the scratch is host-backed")
    explain.add_argument("--not-isolated", action="store_true", help="no PID namespace of its own")
    return parser


def explain(args: argparse.Namespace) -> int:
    timeline = read_timeline_file(args.timeline)

    def where(ev: Evidence) -> str:
        return f"line {timeline.line_of(ev.position)}"

    state = fold(timeline.records)
    request = ResumeRequest(
        consents=Consents(force=args.force, accept_scratch_loss=args.accept_scratch_loss),
        source_changed=args.source_changed,
        artifact_contract_changed=args.artifact_contract_changed,
        where=Where.SURFACE if args.surface else Where.ENGINE,
    )
    decision = decide_resume(state, request)
    plan = plan_teardown(
        state,
        scratch_host_backed=args.host_backed,
        process_isolated=not args.not_isolated,
        run_finished=args.finished,
    )
    if args.json:
        out = {
            "state": state_data(state, where),
            "teardown": plan_data(plan),
            "resume": decision_data(decision, where),
        }
        print(json.dumps(out, indent=2))
    else:
        lines = state_text(state, where)
        lines.append(f"teardown now: {plan.action.value.upper()} ({plan.rule}): {plan.reason}")
        lines += decision_text(decision, where)
        print("\n".join(lines))
    return EXIT_OK


def _age(at: datetime | None) -> str:
    if at is None:
        return "unknown age"
    seconds = int((datetime.now(UTC) - (at if at.tzinfo else at.replace(tzinfo=UTC))).total_seconds())
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s old"


def status(args: argparse.Namespace) -> int:
    timeline = config.open_timeline(args.timeline or config.timeline_url())
    state = current_state(timeline, args.run, snapshots=config.snapshots_of(timeline))
    decision = decide_resume(state, ResumeRequest(where=Where.SURFACE))
    if args.json:
        data = {"run": args.run, "state": state_data(state), "resume": decision_data(decision)}
        if state.bank is not None:
            data["state"]["bank"]["age"] = _age(state.bank.record.at)
        print(json.dumps(data, indent=2))
        return EXIT_OK
    lines = [f"run {args.run}", *state_text(state)]
    if state.bank is not None:
        lines.append(f"  bank age: {_age(state.bank.record.at)}")
    lines += decision_text(decision)
    print("\n".join(lines))
    return EXIT_OK


def _progress(stage: str, done: int, total: int) -> None:
    print(f"  {stage}: {done / 1e6:.1f} MB of {total / 1e6:.1f} MB", file=sys.stderr)


def resume_command(args: argparse.Namespace) -> int:
    timeline = config.open_timeline(args.timeline or config.timeline_url())
    store = config.open_bank_store(args.bank or config.bank_url())
    sandbox = config.open_sandbox(args.sandbox, args.scratch)
    request = ResumeRequest(
        consents=Consents(force=args.force, accept_scratch_loss=args.accept_scratch_loss),
        source_changed=args.source_changed,
        where=Where.ENGINE,
    )
    out = resume(
        args.run,
        request,
        timeline=timeline,
        store=store,
        sandbox=sandbox,
        progress=_progress if args.progress else None,
    )
    data = outcome_data(out)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print("\n".join(outcome_text(out)))
    return EXIT_OK if out.proceeds else EXIT_REFUSED


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "explain":
            return explain(args)
        if args.command == "status":
            return status(args)
        if args.command == "resume":
            return resume_command(args)
        if args.command == "serve":
            from .http_api import serve as serve_api

            serve_api(args.host, args.port)
            return EXIT_OK
        if args.command == "demo":
            from .demo import run_demo

            return run_demo()
    except ScratchbankError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_ERROR  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
