"""Decisions as plain data and as text, the same for the CLI, the HTTP API and the MCP server.

Every refusal line names its rule and says it in words (``R2: a node ran after the bank``,
from the shipped rule reference); sizes are in human units with the exact bytes beside them
where they matter; anything a caller typed is echoed cut (``cut``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from scratchbank.application.resume import ResumeOutcome
from scratchbank.application.service import Queued, StatusReport, StoreCheck
from scratchbank.domain.errors import ScratchbankError
from scratchbank.domain.fold import Evidence, ScratchState
from scratchbank.domain.objects import Reconciliation, StoredObject
from scratchbank.domain.records import ResumeRefused
from scratchbank.domain.remedy import Surface, remedy
from scratchbank.domain.resume_gate import SCRATCH_NOT_PORTABLE, ResumeDecision, Verdict
from scratchbank.domain.retention import RETAIN_CHECKPOINTS, retained
from scratchbank.domain.teardown import TeardownPlan

from .error_table import remedy_for
from .rules import title

Where = Callable[[Evidence], str]

#: Echoed input is cut past this many characters (a 10,000-character run id is not repeated).
ECHO_LIMIT = 300


def cut(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text``, or its head and how long it was when it is longer than ``limit``."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB' (binary units, one decimal; plain bytes under 1 KiB)."""
    if n < 1024:
        return f"{n} bytes"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def _at(ev: Evidence) -> str:
    return f"record {ev.position + 1}"


def decision_data(decision: ResumeDecision, where: Where = _at, surface: Surface = "cli") -> dict[str, Any]:
    """A resume decision as JSON-ready data (the hint from the one remedy function, C10, in
    the words of ``surface``)."""
    return {
        "verdict": decision.verdict.value,
        "rule": decision.rule,
        "rule_says": title(decision.rule),
        "code": decision.code,
        "explanation": decision.explanation,
        "causes": [
            {
                "kind": c.kind.value,
                "rule": c.rule,
                "detail": c.detail,
                "evidence": [where(e) for e in c.evidence],
            }
            for c in decision.causes
        ],
        "also_needs_force": decision.also_needs_force,
        "keep_force": decision.keep_force,
        "keep_accept_scratch_loss": decision.keep_accept_scratch_loss,
        "stale": decision.stale,
        "evidence": [f"{where(e)} {e.type}" for e in decision.evidence],
        "hint": remedy(decision, surface),
    }


def state_data(state: ScratchState, where: Where = _at, retain: int = RETAIN_CHECKPOINTS) -> dict[str, Any]:
    """What the fold says of the scratch, for `status` and `explain`."""
    bank = state.bank
    return {
        "records": state.records,
        "records_passed_over": state.unknown_records,
        "bank": None
        if bank is None
        else {
            "at": where(bank.evidence),
            "bytes": bank.record.bytes,
            "sha256": bank.record.sha256,
            "written": bank.record.at.isoformat() if bank.record.at else None,
            "raced": list(bank.record.raced),
            "unquiesced": bank.record.unquiesced,
            "checkpoint": None if bank.checkpoint is None else bank.checkpoint.id,
        },
        "checkpoint_banks": _checkpoint_banks(state, where, retain),
        "stale": state.stale,
        "stale_because": [{"node": w.node, "at": where(w.evidence)} for w in state.stale_writes],
        "unbanked": None
        if state.unbanked is None
        else {"at": where(state.unbanked), "reason": state.unbanked_reason},
        "forsaken": None if state.forsaken is None else where(state.forsaken),
        "host_backed": None if state.host_backed is None else where(state.host_backed),
        "lone_child": state.lone_child is not None,
        "may_still_be_banking": state.may_still_be_banking,
    }


def _checkpoint_banks(state: ScratchState, where: Where, retain: int) -> list[dict[str, Any]]:
    """K8: the banks the run holds for its checkpoints (newest last), and which are kept
    under the retention setting (the others are swept by the next prune)."""
    kept = {k.position for k in retained(state.history, retain)}
    return [
        {
            "checkpoint": k.checkpoint.id,
            "depth": len(k.checkpoint.lineage),
            "at": where(Evidence(k.position, k.record.WIRE)),
            "object": k.object,
            "bytes": k.record.bytes,
            "kept": k.position in kept,
        }
        for k in state.history
    ]


def plan_data(plan: TeardownPlan) -> dict[str, Any]:
    return {"action": plan.action.value, "quiesce": plan.quiesce, "rule": plan.rule, "reason": plan.reason}


def decision_text(decision: ResumeDecision, where: Where = _at) -> list[str]:
    head = decision.verdict.value.upper().replace("_", " ")
    if decision.code:
        head += f" {decision.code}"
    out = [f"resume: {head} ({title(decision.rule)}): {decision.explanation}"]
    for cause in decision.causes:
        out.append(f"  cause [{title(cause.rule)}] {cause.detail}")
    if decision.evidence:
        out.append("  events: " + ", ".join(f"{where(e)} {e.type}" for e in decision.evidence))
    hint = remedy(decision)
    if hint:
        out.append(f"  hint: {hint}")
    if decision.also_needs_force:
        out.append("  also needs --force")
    return out


def state_text(state: ScratchState, where: Where = _at, retain: int = RETAIN_CHECKPOINTS) -> list[str]:
    out = [
        f"timeline: {state.records} records"
        + (f" ({state.unknown_records} of types not read here, passed over)" if state.unknown_records else "")
    ]
    bank = state.bank
    if bank is None:
        out.append("bank: none")
    else:
        raced = f", raced: {', '.join(bank.record.raced)}" if bank.record.raced else ""
        out.append(f"bank: {where(bank.evidence)}, {human_bytes(bank.record.bytes)}{raced}")
        if state.stale_writes:
            nodes = ", ".join(f"{w.node} ({where(w.evidence)})" for w in state.stale_writes)
            out.append(f"  stale because of: {nodes}")
        else:
            out.append("  not stale")
    for held in _checkpoint_banks(state, where, retain):
        swept = "" if held["kept"] else " (past retention: swept by the next prune)"
        size = human_bytes(held["bytes"])
        out.append(f"checkpoint bank: {held['checkpoint']}: {held['at']}, {size}{swept}")
    if state.unbanked is not None:
        out.append(f"unbanked scratch: {where(state.unbanked)} ({state.unbanked_reason})")
    if state.forsaken is not None:
        out.append(f"forsaken: {where(state.forsaken)}")
    if state.host_backed is not None:
        out.append(f"handed to a host directory: {where(state.host_backed)}")
    return out


def outcome_data(out: ResumeOutcome) -> dict[str, Any]:
    """A resume's outcome: the gate's decision, then what the restore did."""
    data: dict[str, Any] = {"proceeds": out.proceeds, "decision": decision_data(out.decision)}
    failed = outcome_error(out)
    if failed is not None:
        data.update(error_data(failed))
    if out.restore is not None:
        r = out.restore
        data["restore"] = {
            "rule": r.rule,
            "restored": r.record.restored,
            "bytes": r.record.bytes,
            "reason": r.record.reason,
            "park": None if r.park is None else {"code": r.park.code, "reason": r.park.reason},
            "recorded": out.recorded,
        }
    return data


def outcome_text(out: ResumeOutcome) -> list[str]:
    lines = decision_text(out.decision)
    r = out.restore
    if r is not None:
        if r.record.restored:
            lines.append(f"restore: restored {human_bytes(r.record.bytes)} ({title(r.rule)})")
        else:
            lines.append(f"restore: failed ({title(r.rule)}): {r.record.reason}")
        if r.park is not None:
            lines.append(f"  parked {'with ' + r.park.code if r.park.code else 'without a code'}")
        if not out.recorded:
            lines.append(f"  its record ({r.record.WIRE}) was not written: the timeline does not show it")
    lines.append("the run goes on" if out.proceeds else "the run does not go on")
    return lines


def error_data(error: ScratchbankError, surface: Surface = "cli") -> dict[str, Any]:
    """A named error as data: the same three fields on every surface (the remedy in its words)."""
    return {
        "error": cut(error.message),
        "error_code": error.code.lower(),
        "remedy": remedy_for(error, surface),
    }


_NAMED = re.compile(r"^[a-z_]+: ([A-Z][A-Z_]+): (.*)$", re.DOTALL)


def outcome_error(out: ResumeOutcome) -> ScratchbankError | None:
    """The named failure a parked restore met (its record's reason says which), as an error."""
    r = out.restore
    if out.proceeds or r is None or r.park is None or r.park.code is not None:
        return None
    found = _NAMED.match(r.record.reason)
    if found is None:
        return None
    code, message = found.groups()
    for cls in error_classes():
        if cls.code == code:
            return cls(message)
    return None


def error_classes() -> list[type[ScratchbankError]]:
    from .error_table import all_error_classes

    return all_error_classes()


def _age_text(seconds: float | None) -> str:
    if seconds is None:
        return "unknown (its record says not when)"
    s = max(0, int(seconds))
    return f"{s // 86400}d{s % 86400 // 3600:02d}h{s % 3600 // 60:02d}m{s % 60:02d}s"


def would_do(report: StatusReport) -> ResumeDecision | None:
    """What a resume would really do when the gate says RESTORE but the store disagrees with
    the record (X4: the bank is gone or is not the one recorded): None when the gate's word holds."""
    a = report.assessment
    if a.decision.verdict is not Verdict.RESTORE or report.store.verdict not in ("missing", "differs"):
        return None
    why = f"the bank is {report.store.verdict} in the store ({report.store.detail})"
    if a.decision.consents.accept_scratch_loss:
        return _evolve(a.decision, verdict=Verdict.GO_ON_WITHOUT, rule="X4", code=None, explanation=why)
    return _evolve(a.decision, verdict=Verdict.REFUSE, rule="X4", code=SCRATCH_NOT_PORTABLE, explanation=why)


def _evolve(decision: ResumeDecision, **changes: Any) -> ResumeDecision:
    import attrs

    return attrs.evolve(decision, **changes)


def would_go_on(report: StatusReport) -> bool:
    """Would a resume with the report's consents go on (restore, or resume without a bank)?"""
    decision = would_do(report) or report.assessment.decision
    return not decision.refused


def store_data(check: StoreCheck) -> dict[str, Any]:
    stored = check.stored
    return {
        "verdict": check.verdict,
        "bytes": None if stored is None else stored.bytes,
        "sha256": None if stored is None else stored.sha256,
        "detail": check.detail,
    }


def status_data(report: StatusReport, *, queued: bool = False, surface: Surface = "cli") -> dict[str, Any]:
    """`status` as data: the state, the store check, the age and the one decision; ``would``:
    what a resume would really do when the store disagrees with the record (X4)."""
    a = report.assessment
    would = would_do(report)
    return {
        "run": a.run_id,
        "state": state_data(a.state, retain=a.retain),
        "store": store_data(report.store),
        "age_seconds": report.age_seconds,
        "resume": decision_data(a.decision, surface=surface),
        "would": None if would is None else decision_data(would, surface=surface),
        "goes_on": would_go_on(report),
        "needs_target": a.needs_target and not queued,
        "refusal": refusal_data(report.refusal),
        "unreferenced": unreferenced_data(report.unreferenced),
        "lock": lock_data(report),
    }


def unreferenced_data(found: Reconciliation | None) -> dict[str, Any] | None:
    """N3: the run's bank objects no record names, with their stamps, and what a resume
    would make of them (record the one proved the latest execution's; refuse on the rest)."""
    if found is None:
        return None

    def one(o: StoredObject, fate: str) -> dict[str, Any]:
        stamp = o.stamp
        return {
            "object": o.name,
            "bytes": o.bytes,
            "fate": fate,
            "execution": None if stamp is None else stamp.execution,
            "sha256": None if stamp is None else stamp.sha256,
            "at": None if stamp is None or stamp.at is None else stamp.at.isoformat(),
        }

    record = [] if found.record is None else [one(found.record, "recorded by the next resume (N3)")]
    unproven = [one(o, "refuses the next resume (BANK_UNRECORDED)") for o in found.unproven]
    others = [one(o, "an earlier execution's: swept past the bound") for o in found.others]
    return {"latest_execution": found.latest_execution, "objects": record + unproven + others}


def lock_data(report: StatusReport) -> dict[str, Any] | None:
    """Who holds the run's lock, since when, with which token (A16); None: nobody."""
    held = report.lock
    if held is None:
        return {"unreadable": report.lock_unreadable} if report.lock_unreadable else None
    since, until = held.since.isoformat(), held.expires.isoformat()
    return {"holder": held.holder, "since": since, "token": held.token, "expires": until, "live": held.live}


def refusal_data(refusal: ResumeRefused | None) -> dict[str, Any] | None:
    """A runner's refusal from the run's log (R12), with the hint it wrote from remedy() (C10)."""
    if refusal is None:
        return None
    return {"code": refusal.code, "rule": refusal.rule, "hint": refusal.hint, "attempt": refusal.attempt}


def queued_data(out: Queued) -> dict[str, Any]:
    """A queued resume: the attempt published (None when refused), and whose decision this is."""
    return {
        "run": out.run_id,
        "queued": out.attempt is not None,
        "attempt": out.attempt,
        "heard": out.heard,
        "decision": decision_data(out.decision),
    }


def queued_text(out: Queued) -> list[str]:
    lines = decision_text(out.decision)
    if out.attempt is None:
        return [*lines, "refused by the surface: nothing queued"]
    if out.refused:
        return [*lines, f"attempt {out.attempt}: refused by the runner (its verdict, heard here)"]
    if out.heard:
        return [*lines, f"attempt {out.attempt}: claimed by the runner; the run goes on"]
    return [*lines, f"queued: attempt {out.attempt} (a runner carries it on; `status` shows a refusal)"]


def status_text(report: StatusReport, *, queued: bool = False) -> list[str]:
    a = report.assessment
    lines = [f"run {a.run_id}", *state_text(a.state, retain=a.retain)]
    if a.state.bank is not None:
        check = report.store
        detail = f": {check.detail}" if check.detail else ""
        size = f" ({human_bytes(check.stored.bytes)})" if check.stored and check.verdict == "matches" else ""
        lines.append(f"  in the store: {check.verdict}{size}{detail}")
        lines.append(f"  bank age: {_age_text(report.age_seconds)}")
    would = would_do(report)
    if would is None:
        lines += decision_text(a.decision)
    else:
        lines.append(f"  the gate alone says: {a.decision.verdict.value.upper()} ({title(a.decision.rule)})")
        lines += decision_text(would)
    if report.refusal is not None:
        r = report.refusal
        lines.append(f"  the runner refused attempt {r.attempt}: {r.code} ({r.rule})")
        lines.append(f"  hint: {r.hint}")
    if a.needs_target and would is None:
        if queued:
            lines.append("  a resume is queued: the runner restores into the sandbox it starts")
        else:
            lines.append("  a resume restores into the sandbox it is given: --sandbox is required")
    loose = unreferenced_data(report.unreferenced)
    for o in loose["objects"] if loose else ():
        where = o["object"] or "(legacy key)"
        size = f"{o['bytes']} bytes, execution {o['execution']}"
        lines.append(f"  unrecorded bank object {where} ({size}): {o['fate']}")
    if report.lock is not None:
        held, state = report.lock, "live" if report.lock.live else "lapsed"
        lines.append(
            f"  lock: held by {held.holder} since {held.since.isoformat()}, token {held.token} "
            f"({state} until {held.expires.isoformat()})"
        )
    return lines
