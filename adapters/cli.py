"""The `scratchbank` command: operators' view of the same service the engine runs.

Exit codes: every error is printed as ``error: CODE: message`` and ``remedy: ...``, never
as a traceback; with ``--json`` the same fields go to stdout as JSON. Each code's exit status
is in the one error table (``adapters/error_table.py``, printed in the README):

====  ==========================================================================
0     done; for ``resume``: the run goes on
2     bad input (CONFIG_INVALID, INVALID_RUN_ID, an unreadable ``explain`` file)
3     refused: a refusal decision, a parked restore, NO_RESTORE_TARGET, RESUME_SUPERSEDED
4     not found: RUN_NOT_FOUND, HOME_NOT_FOUND
5     a store or sandbox failed or cannot be reached (TIMELINE_*, BANK_*, SANDBOX_*, ...)
70    a bug: INTERNAL_ERROR (the traceback only with ``--log-level debug``)
====  ==========================================================================

``status`` exits 0 when a resume with its consents would go on, 3 when it would be refused.
``--home``, ``--timeline``, ``--bank``, ``--queue``, ``--log-format`` and ``--log-level``
may stand before or after the command. ``scratchbank rules R2`` says what a rule id means.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from scratchbank.application.resume import Target
from scratchbank.application.service import Explanation, ScratchService
from scratchbank.domain import errors
from scratchbank.domain.admission import Consents
from scratchbank.domain.checkpoints import Checkpoint, checkpoint_of
from scratchbank.domain.fold import Evidence
from scratchbank.domain.resume_gate import ResumeRequest, Where

from . import config, error_table
from .bootstrap import OpenService
from .error_table import EXIT_INTERNAL, EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from .jsonl import TimelineFile, read_timeline_file
from .present import (
    cut,
    decision_data,
    decision_text,
    error_data,
    outcome_data,
    outcome_error,
    outcome_text,
    plan_data,
    queued_data,
    queued_text,
    state_data,
    state_text,
    status_data,
    status_text,
    would_go_on,
)

log = logging.getLogger("scratchbank.cli")


def exit_code(error: errors.ScratchbankError) -> int:
    """The exit status of a named error, from the one error table."""
    return error_table.exit_code(error)


class _Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are named (CONFIG_INVALID, exit 2) like every other."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise errors.ConfigInvalid(f"{self.prog}: {cut(message)}")


def _consent_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true", help="accept a changed source (C1)")
    parser.add_argument("--accept-scratch-loss", action="store_true", help="accept the scratch's loss (C2)")
    parser.add_argument(
        "--source-changed", action="store_true", help="the engine's source check found a change"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")


_GLOBAL_DEFAULTS = {"home": None, "timeline": None, "bank": None, "queue": None}


def _globals(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every command takes, before or after its name (a subcommand's copy only
    sets what it was given: SUPPRESS keeps the value given before the command)."""

    def default(value: str | None) -> str | None:
        return value if top else argparse.SUPPRESS

    parser.add_argument(
        "--home", default=default(None), help="the home (else SCRATCHBANK_HOME, else found upward)"
    )
    parser.add_argument(
        "--timeline", default=default(None), help="timeline URL (sqlite:///... or postgresql://...)"
    )
    parser.add_argument(
        "--bank", default=default(None), help="bank store URL (file:///... or s3://bucket/prefix)"
    )
    parser.add_argument(
        "--queue", default=default(None), help="publish resumes for a runner (nats://HOST:PORT)"
    )
    parser.add_argument(
        "--log-format", choices=["text", "json"], default=default("text"), help="log lines on stderr"
    )
    parser.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default=default("warning")
    )


class _Version(argparse.Action):
    """``--version``: the package's metadata is read only when asked (importlib.metadata
    costs every other command its import time)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from importlib.metadata import version

        print(f"scratchbank {version('scratchbank')}")  # on stdout, as argparse's own
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="scratchbank", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    _globals(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        child = sub.add_parser(name, help=help)
        _globals(child, top=False)
        return child

    _resume_parser(command("resume", "resume a run: restore its scratch or refuse, by name"))
    status = command("status", "what a resume would do, and is the bank in the store")
    status.add_argument("run")
    status.add_argument(
        "--break-lock", action="store_true", help="operator: end and fence the run's lock holder"
    )
    _consent_flags(status)
    command("demo", "the whole story on the embedded default (local, SQLite, files)")
    _serve_parser(command("serve", "serve the HTTP API (OpenAPI at /openapi.json)"))
    _explain_parser(command("explain", "fold a JSONL timeline and explain the decisions"))
    _runner_parser(command("runner", "carry queued resumes on (needs --queue)"))
    rules = command("rules", "what a rule id (R2, X4, C1...) means; all of them without one")
    rules.add_argument("ids", nargs="*", metavar="RULE")
    _mcp_parser(command("mcp", "the operator's MCP server (stdio, or streamable HTTP with --http)"))
    return parser


def _runner_parser(runner: argparse.ArgumentParser) -> None:
    runner.add_argument("--workflow", required=True, help="the reference engine's workflow (JSON)")
    runner.add_argument("--sandboxes", default=None, help="where its local sandboxes go (HOME/sandboxes)")
    runner.add_argument("--holder", default="runner", help="this runner's name on the lease")
    runner.add_argument("--log-file", default=None, help="one JSON line per delivery (else stdout)")


def _resume_parser(resume: argparse.ArgumentParser) -> None:
    resume.add_argument("run")
    _consent_flags(resume)
    resume.add_argument("--sandbox", default=None, help=f"where to restore: {config.SANDBOX_FORMS}")
    resume.add_argument(
        "--scratch", default=None, help=f"scratch path in a container ({config.DEFAULT_SCRATCH})"
    )
    resume.add_argument("--progress", action="store_true", help="show the restore's stages")
    resume.add_argument(
        "--checkpoint",
        default=None,
        metavar="ID,ID,...",
        help="the checkpoint the engine resumes from: its lineage of ids, oldest first (ADR 0013)",
    )


def _server_flags(serve: argparse.ArgumentParser, port: str) -> None:
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", default=port, help="TCP port (0-65535)")
    serve.add_argument("--token-file", default=None, help="bearer token file (else SCRATCHBANK_API_TOKEN)")
    serve.add_argument("--allow-sandbox", action="append", default=None, help="a pattern callers may name")


def _serve_parser(serve: argparse.ArgumentParser) -> None:
    _server_flags(serve, "8080")


def _mcp_parser(mcp: argparse.ArgumentParser) -> None:
    mcp.add_argument("--http", action="store_true", help="serve streamable HTTP at /mcp instead of stdio")
    _server_flags(mcp, "8765")


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
        checkpoint=_checkpoint(getattr(args, "checkpoint", None)),
    )


def _checkpoint(given: str | None) -> Checkpoint | None:
    """``--checkpoint start,c1,c2``: the lineage, oldest first (INVALID_CHECKPOINT when empty)."""
    return None if given is None else checkpoint_of(i.strip() for i in given.split(","))


def _print(args: argparse.Namespace, data: dict[str, Any], lines: list[str]) -> None:
    print(json.dumps(data, indent=2) if args.json else "\n".join(lines), flush=True)


def explain(args: argparse.Namespace) -> int:
    try:
        timeline = read_timeline_file(args.timeline)
    except errors.TimelineUnreadable as error:  # the file is the command's input: bad input, exit 2
        _report(error, args)
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


def _service(args: argparse.Namespace) -> OpenService:
    from .bootstrap import bootstrap

    return bootstrap(_settings(args))


def _settings(args: argparse.Namespace) -> config.Settings:
    settings = config.settings_from(home=args.home, timeline=args.timeline, bank=args.bank, queue=args.queue)
    log.info("%s", settings.describe())
    print(f"# {settings.describe()}", file=sys.stderr)  # stderr: a --json stdout stays JSON
    return settings


def status(args: argparse.Namespace) -> int:
    from .bootstrap import bootstrap

    with bootstrap(_settings(args), read_only=not args.break_lock) as service:
        if args.break_lock:
            broken = service.break_lock(args.run, by="operator (status --break-lock)")
            print(f"# lock broken: {broken}", file=sys.stderr)
        report = service.status(args.run, _request(args))
        queued = service.queue is not None
    _print(args, status_data(report, queued=queued), status_text(report, queued=queued))
    return EXIT_OK if would_go_on(report) else EXIT_REFUSED


def resume_command(args: argparse.Namespace) -> int:
    with _service(args) as service:  # A16: closing lets the execution's lock go
        return _resume_in(args, service)


def _resume_in(args: argparse.Namespace, service: OpenService) -> int:
    from .terminal import StageProgress

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
    failed = outcome_error(out)
    if failed is not None:  # a parked restore: the failure it met, named (and its exit status)
        _report(failed, None)
    _print(args, outcome_data(out), outcome_text(out))
    if out.proceeds:
        return EXIT_OK
    return exit_code(failed) if failed is not None else EXIT_REFUSED


def _queue_resume(args: argparse.Namespace, service: ScratchService) -> int:
    """With a queue: judge as a surface, publish; the runner starts the sandbox (R9-R12)."""
    if args.sandbox or args.progress:
        raise errors.ConfigInvalid(
            "with a queue (SCRATCHBANK_QUEUE / --queue) the runner starts the sandbox and restores into it:"
            " drop --sandbox / --progress, or unset the queue to resume in this process"
        )
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
    config.require_extra("fastapi")
    config.require_extra("uvicorn")
    from .http_api_server import serve
    from .http_api_settings import api_settings

    port = config.parse_port(args.port)
    api = api_settings(host=args.host, port=port, token_file=args.token_file, sandboxes=args.allow_sandbox)
    serve(_service(args), api)
    return EXIT_OK


def mcp_command(args: argparse.Namespace) -> int:
    config.require_extra("mcp")
    config.require_extra("fastapi", "mcp")
    from .http_api_settings import api_settings
    from .mcp_server import serve_http, serve_stdio

    port = config.parse_port(args.port)
    api = api_settings(host=args.host, port=port, token_file=args.token_file, sandboxes=args.allow_sandbox)
    with _service(args) as service:
        (serve_http if args.http else serve_stdio)(service, api)
    return EXIT_OK


def rules_command(args: argparse.Namespace) -> int:
    from .rules import RULES, describe, listing

    unknown = [rid for rid in args.ids if rid.upper() not in RULES]
    if unknown:
        raise errors.ConfigInvalid(
            f"no rule {cut(', '.join(unknown), 80)} in the reference (`scratchbank rules` lists them)"
        )
    lines = [line for rid in args.ids for line in describe(rid)] if args.ids else listing()
    print("\n".join(lines), flush=True)
    return EXIT_OK


def _report(error: errors.ScratchbankError, args: argparse.Namespace | None) -> int:
    print(
        f"error: {error.code}: {cut(error.message)}\n  remedy: {error_table.remedy_for(error, 'cli')}",
        file=sys.stderr,
    )
    if args is not None and getattr(args, "json", False):
        print(json.dumps(error_data(error), indent=2), flush=True)
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
        "rules": rules_command,
        "mcp": mcp_command,
    }
    return commands[args.command](args)


def _quiet_clients(*, debug: bool) -> None:
    """The NATS client logs each failed connect with its traceback: the named error says
    it once instead (QUEUE_UNAVAILABLE); the client's lines only with --log-level debug."""
    if not debug:
        client = logging.getLogger("nats")
        client.handlers[:] = [logging.NullHandler()]
        client.propagate = False


def _reader_gone() -> int:
    """stdout's reader went away (``status --json | head``): what it wanted it has; say nothing."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = None
    try:
        args = _parser().parse_args(argv)
        from .terminal import configure_logging

        configure_logging(sys.stderr, fmt=args.log_format, level=args.log_level)
        _quiet_clients(debug=args.log_level == "debug")
        return _dispatch(args)
    except BrokenPipeError:
        return _reader_gone()
    except PermissionError as error:  # a file or folder this user may not read: theirs to fix
        return _report(config.denied(error, str(error.filename or "a path")), args)
    except errors.ScratchbankError as error:
        try:
            return _report(error, args)
        except BrokenPipeError:
            return _reader_gone()
    except Exception as error:  # a bug: named, and no traceback unless asked for
        log.debug("internal error", exc_info=True)
        print(
            f"error: {error_table.INTERNAL_CODE}: {type(error).__name__}: {cut(config.redact(str(error)))}",
            file=sys.stderr,
        )
        print(
            "  remedy: this is a bug in scratchbank; rerun with --log-level debug and report it",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
