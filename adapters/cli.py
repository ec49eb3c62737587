"""The `scratchbank` command: operators' view of the same service the engine runs.

Exit codes (every error is printed as ``error: CODE: message`` and ``remedy: ...``,
never as a traceback; with ``--json`` the same fields go to stdout as JSON):

====  ==========================================================================
0     done; for ``resume``: the run goes on
2     bad input: CONFIG_INVALID (flags, URLs, sandbox spec, port), INVALID_RUN_ID,
      TIMELINE_UNREADABLE of an ``explain`` file
3     refused: a refusal decision, a parked restore, NO_RESTORE_TARGET,
      RESUME_SUPERSEDED, FENCED
4     not found: RUN_NOT_FOUND, HOME_NOT_FOUND
5     a store or sandbox failed or cannot be reached (TIMELINE_*, BANK_*, SANDBOX_*, ...)
70    a bug: INTERNAL_ERROR (the traceback only with ``--log-level debug``)
====  ==========================================================================
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any, NoReturn

from scratchbank.application.service import Explanation, ScratchService, Target
from scratchbank.domain import errors
from scratchbank.domain.consent import Consents
from scratchbank.domain.fold import Evidence
from scratchbank.domain.resume_gate import ResumeRequest, Where

from . import config
from .jsonl import TimelineFile, read_timeline_file
from .present import (
    decision_data,
    decision_text,
    error_data,
    outcome_data,
    outcome_text,
    plan_data,
    queued_data,
    queued_text,
    state_data,
    state_text,
    status_data,
    status_text,
)

EXIT_OK, EXIT_USAGE, EXIT_REFUSED, EXIT_NOT_FOUND, EXIT_UNAVAILABLE, EXIT_INTERNAL = 0, 2, 3, 4, 5, 70
EXIT_CODES: dict[type[errors.ScratchbankError], int] = {
    errors.ConfigInvalid: EXIT_USAGE,
    errors.InvalidRunId: EXIT_USAGE,
    errors.NoRestoreTarget: EXIT_REFUSED,
    errors.AttemptReused: EXIT_REFUSED,
    errors.ResumeSuperseded: EXIT_REFUSED,
    errors.Fenced: EXIT_REFUSED,
    errors.RunNotFound: EXIT_NOT_FOUND,
    errors.HomeNotFound: EXIT_NOT_FOUND,
}
log = logging.getLogger("scratchbank.cli")


def exit_code(error: errors.ScratchbankError) -> int:
    """The documented exit code of a named error (the first class in its MRO with one)."""
    for cls in type(error).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return EXIT_UNAVAILABLE


class _Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are named (CONFIG_INVALID, exit 2) like every other."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise errors.ConfigInvalid(f"{self.prog}: {message}")


def _consent_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true", help="accept a changed source (C1)")
    parser.add_argument("--accept-scratch-loss", action="store_true", help="accept the scratch's loss (C2)")
    parser.add_argument(
        "--source-changed", action="store_true", help="the engine's source check found a change"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")


def _where(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--home", default=None, help="the home (else SCRATCHBANK_HOME, else found upward)")
    parser.add_argument("--timeline", default=None, help="timeline URL (sqlite:///... or postgresql://...)")
    parser.add_argument("--bank", default=None, help="bank store URL (file:///... or s3://bucket/prefix)")
    parser.add_argument("--queue", default=None, help="publish resumes for a runner (nats://HOST:PORT)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="scratchbank", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"scratchbank {version('scratchbank')}")
    parser.add_argument("--log-format", choices=["text", "json"], default="text", help="log lines on stderr")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="warning")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _resume_parser(sub.add_parser("resume", help="resume a run: restore its scratch or refuse, by name"))
    status = sub.add_parser("status", help="what a resume would do, and is the bank in the store")
    status.add_argument("run")
    _consent_flags(status)
    _where(status)
    sub.add_parser("demo", help="the whole story on the embedded default (local, SQLite, files)")
    _serve_parser(sub.add_parser("serve", help="serve the HTTP API (OpenAPI at /openapi.json)"))
    _explain_parser(sub.add_parser("explain", help="fold a JSONL timeline and explain the decisions"))
    _runner_parser(sub.add_parser("runner", help="carry queued resumes on (needs --queue)"))
    return parser


def _runner_parser(runner: argparse.ArgumentParser) -> None:
    _where(runner)
    runner.add_argument("--workflow", required=True, help="the reference engine's workflow (JSON)")
    runner.add_argument("--sandboxes", default=None, help="where its local sandboxes go (HOME/sandboxes)")
    runner.add_argument("--holder", default="runner", help="this runner's name on the lease")
    runner.add_argument("--log-file", default=None, help="one JSON line per delivery (else stdout)")


def _resume_parser(resume: argparse.ArgumentParser) -> None:
    resume.add_argument("run")
    _consent_flags(resume)
    _where(resume)
    resume.add_argument("--sandbox", default=None, help=f"where to restore: {config.SANDBOX_FORMS}")
    resume.add_argument(
        "--scratch", default=None, help=f"scratch path in a container ({config.DEFAULT_SCRATCH})"
    )
    resume.add_argument("--progress", action="store_true", help="show the restore's stages")


def _serve_parser(serve: argparse.ArgumentParser) -> None:
    _where(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", default="8080", help="TCP port (0-65535)")
    serve.add_argument("--token-file", default=None, help="bearer token file (else SCRATCHBANK_API_TOKEN)")
    serve.add_argument("--allow-sandbox", action="append", default=None, help="a pattern callers may name")


def _explain_parser(explain: argparse.ArgumentParser) -> None:
    explain.add_argument("timeline", help="a JSON Lines file, one record per line")
    _consent_flags(explain)
    explain.add_argument("--artifact-contract-changed", action="store_true")
    explain.add_argument(
        "--surface", action="store_true", help="decide as a surface would (R10), not the engine"
    )
    explain.add_argument("--finished", action="store_true", help="the run finished (teardown)")
    explain.add_argument("--host-backed", action="store_true", help="the scratch is host-backed")
    explain.add_argument("--not-isolated", action="store_true", help="no PID namespace of its own")


def _request(args: argparse.Namespace, where: Where = Where.ENGINE) -> ResumeRequest:
    return ResumeRequest(
        consents=Consents(force=args.force, accept_scratch_loss=args.accept_scratch_loss),
        source_changed=args.source_changed,
        artifact_contract_changed=getattr(args, "artifact_contract_changed", False),
        where=where,
    )


def _print(args: argparse.Namespace, data: dict[str, Any], lines: list[str]) -> None:
    print(json.dumps(data, indent=2) if args.json else "\n".join(lines))


def explain(args: argparse.Namespace) -> int:
    try:
        timeline = read_timeline_file(args.timeline)
    except errors.TimelineUnreadable as error:  # the file is the command's input: bad input, exit 2
        _report(error, None)
        return EXIT_USAGE
    request = _request(args, Where.SURFACE if args.surface else Where.ENGINE)
    facts = {"host_backed": args.host_backed, "isolated": not args.not_isolated, "finished": args.finished}
    _print_explanation(args, ScratchService.explain(timeline.records, request, **facts), timeline)
    return EXIT_OK


def _print_explanation(args: argparse.Namespace, out: Explanation, timeline: TimelineFile) -> None:
    def where(ev: Evidence) -> str:
        return f"line {timeline.line_of(ev.position)}"

    data = {
        "state": state_data(out.state, where),
        "teardown": plan_data(out.plan),
        "resume": decision_data(out.decision, where),
    }
    lines = state_text(out.state, where)
    lines.append(f"teardown now: {out.plan.action.value.upper()} ({out.plan.rule}): {out.plan.reason}")
    _print(args, data, lines + decision_text(out.decision, where))


def _service(args: argparse.Namespace) -> ScratchService:
    from .bootstrap import bootstrap

    return bootstrap(_settings(args))


def _settings(args: argparse.Namespace) -> config.Settings:
    settings = config.settings_from(home=args.home, timeline=args.timeline, bank=args.bank, queue=args.queue)
    log.info("%s", settings.describe())
    print(f"# {settings.describe()}", file=sys.stderr)  # stderr: a --json stdout stays JSON
    return settings


def status(args: argparse.Namespace) -> int:
    report = _service(args).status(args.run, _request(args))
    _print(args, status_data(report), status_text(report))
    return EXIT_OK


def resume_command(args: argparse.Namespace) -> int:
    from .terminal import StageProgress

    service = _service(args)
    if service.queue is not None:
        return _queue_resume(args, service)
    scratch = args.scratch or config.DEFAULT_SCRATCH
    target = Target(config.open_sandbox(args.sandbox, scratch)) if args.sandbox else Target()
    progress = StageProgress(sys.stderr) if args.progress else None
    try:
        out = service.resume(args.run, _request(args), target, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    _print(args, outcome_data(out), outcome_text(out))
    return EXIT_OK if out.proceeds else EXIT_REFUSED


def _queue_resume(args: argparse.Namespace, service: ScratchService) -> int:
    """With a queue: judge as a surface, publish; the runner starts the sandbox (R9-R12)."""
    if args.sandbox or args.progress:
        raise errors.ConfigInvalid("with a queue the runner starts the sandbox: drop --sandbox / --progress")
    out = service.queue_resume(args.run, _request(args))
    _print(args, queued_data(out), queued_text(out))
    return EXIT_REFUSED if out.refused else EXIT_OK


def runner_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .bootstrap import run_runner

    settings = _settings(args)
    base = args.sandboxes or (settings.home.path / "sandboxes" if settings.home else None)
    if base is None:
        raise errors.ConfigInvalid("no home to put sandboxes in: give --sandboxes DIR")
    log_path = Path(args.log_file) if args.log_file else None
    return run_runner(
        settings, workflow=Path(args.workflow), sandboxes=Path(base), holder=args.holder, log=log_path
    )


def serve_command(args: argparse.Namespace) -> int:
    from .http_api import api_settings, serve

    port = config.parse_port(args.port)
    api = api_settings(host=args.host, port=port, token_file=args.token_file, sandboxes=args.allow_sandbox)
    serve(_service(args), api)
    return EXIT_OK


def _report(error: errors.ScratchbankError, args: argparse.Namespace | None) -> int:
    print(f"error: {error.code}: {error.message}\n  remedy: {error.remedy}", file=sys.stderr)
    if args is not None and getattr(args, "json", False):
        print(json.dumps(error_data(error), indent=2))
    return exit_code(error)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from .demo import run_demo

        return run_demo()
    commands = {
        "explain": explain,
        "status": status,
        "resume": resume_command,
        "serve": serve_command,
        "runner": runner_command,
    }
    return commands[args.command](args)


def _quiet_clients(*, debug: bool) -> None:
    """The NATS client logs each failed connect with its traceback: the named error says
    it once instead (QUEUE_UNAVAILABLE); the client's lines only with --log-level debug."""
    if not debug:
        client = logging.getLogger("nats")
        client.handlers[:] = [logging.NullHandler()]
        client.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    args = None
    try:
        args = _parser().parse_args(argv)
        from .terminal import configure_logging

        configure_logging(sys.stderr, fmt=args.log_format, level=args.log_level)
        _quiet_clients(debug=args.log_level == "debug")
        return _dispatch(args)
    except errors.ScratchbankError as error:
        return _report(error, args)
    except Exception as error:  # a bug: named, and no traceback unless asked for
        log.debug("internal error", exc_info=True)
        print(
            f"error: INTERNAL_ERROR: {type(error).__name__}: {config.redact(str(error))[:500]}",
            file=sys.stderr,
        )
        print(
            "  remedy: this is a bug in scratchbank; rerun with --log-level debug and report it",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
