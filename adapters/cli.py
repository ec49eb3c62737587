"""The `scratchbank` command: operators' view of the same use cases the engine runs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from scratchbank.domain.consent import Consents
from scratchbank.domain.errors import ScratchbankError
from scratchbank.domain.fold import Evidence, fold
from scratchbank.domain.resume_gate import ResumeRequest, Where, decide_resume
from scratchbank.domain.teardown import plan_teardown

from .jsonl import read_timeline_file
from .present import decision_data, decision_text, plan_data, state_data, state_text

EXIT_OK, EXIT_REFUSED, EXIT_ERROR = 0, 3, 2


def _consent_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true", help="accept a changed source (C1)")
    parser.add_argument("--accept-scratch-loss", action="store_true", help="accept the scratch's loss (C2)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scratchbank", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
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


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "explain":
            return explain(args)
    except ScratchbankError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_ERROR  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
