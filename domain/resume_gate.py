"""The resume gate: restore, go on without the scratch, refuse, or leave it to the engine.

Decided before anything moves the run (R1-R15, S2-S4, C1-C2, C9, A1-A12). The
scratch's refusals come first and name every other cause at once (R8, A10); a
consent covers only its own kind of cause (C1, C2).
"""

from __future__ import annotations

import enum
import functools
from typing import Any

import attrs

from .admission import Consents
from .checkpoints import Checkpoint, Position, compare
from .fold import Bank, Evidence, ScratchState, StaleWrite
from .records import Record, ScratchBanked, ScratchForsaken, ScratchRestored
from .retention import RETAIN_CHECKPOINTS, Kept, check_retain, pick

SCRATCH_NOT_PORTABLE = "SCRATCH_NOT_PORTABLE"
RESUME_INVALID = "RESUME_INVALID"
#: K7: a rewind to a checkpoint whose bank retention swept (domain/errors.CheckpointBankSwept)
CHECKPOINT_BANK_SWEPT = "CHECKPOINT_BANK_SWEPT"


class CauseKind(enum.Enum):
    """Why a resume may be refused. The first three need the scratch's consent."""

    SCRATCH_UNBANKED = "scratch_unbanked"  # R1
    SCRATCH_STALE = "scratch_stale"  # R2
    BANK_SWEPT = "bank_swept"  # K7
    LONE_CHILD = "lone_child"  # S2
    SOURCE_CHANGED = "source_changed"  # R8
    ARTIFACT_CONTRACT_CHANGED = "artifact_contract_changed"  # R9
    COPY_BASED_DIVERGENCE = "copy_based_divergence"  # S3, A5, A11

    @property
    def needs_scratch_consent(self) -> bool:
        return self in _SCRATCH_CAUSES


_SCRATCH_CAUSES = {
    CauseKind.SCRATCH_UNBANKED,
    CauseKind.SCRATCH_STALE,
    CauseKind.LONE_CHILD,
    CauseKind.BANK_SWEPT,
}


@attrs.frozen
class Cause:
    kind: CauseKind
    rule: str
    detail: str
    evidence: tuple[Evidence, ...] = ()


class Verdict(enum.Enum):
    RESTORE = "restore"
    GO_ON_WITHOUT = "go_on_without"
    REFUSE = "refuse"
    DEFER_TO_ENGINE = "defer_to_engine"


class Where(enum.Enum):
    """Who asks: an operator-facing surface, or the engine under the run's lock (R10)."""

    SURFACE = "surface"
    ENGINE = "engine"


@attrs.frozen
class ResumeRequest:
    """One resume call: its consents (this call's only, C3) and the engine's own checks."""

    consents: Consents = Consents()
    source_changed: bool = False
    artifact_contract_changed: bool = False
    where: Where = Where.ENGINE
    #: the checkpoint the engine resumes from (ADR 0013); None: the events decide (K5)
    checkpoint: Checkpoint | None = None
    #: how many recent checkpoints' banks retention keeps (K8); the teardown's prune reads the same
    retain: int = attrs.field(default=RETAIN_CHECKPOINTS, validator=lambda _, __, v: check_retain(v))


@attrs.frozen
class ResumeDecision:
    """A decision that explains itself: the verdict, the rule, the causes and events."""

    verdict: Verdict
    rule: str
    explanation: str
    code: str | None = None
    causes: tuple[Cause, ...] = ()
    consents: Consents = Consents()
    bank: Bank | None = None
    stale: bool = False
    records: tuple[Record, ...] = ()
    evidence: tuple[Evidence, ...] = ()

    @property
    def force_causes(self) -> tuple[Cause, ...]:
        return tuple(c for c in self.causes if not c.kind.needs_scratch_consent)

    @property
    def scratch_causes(self) -> tuple[Cause, ...]:
        return tuple(c for c in self.causes if c.kind.needs_scratch_consent)

    @property
    def also_needs_force(self) -> bool:
        """The refusal names a change --force accepts and this call lacked --force (C9)."""
        return bool(self.force_causes) and not self.consents.force

    @property
    def keep_force(self) -> bool:
        """The call had --force and still needs it once the scratch is consented (A9)."""
        return bool(self.force_causes) and self.consents.force

    @property
    def keep_accept_scratch_loss(self) -> bool:
        return bool(self.scratch_causes) and self.consents.accept_scratch_loss

    @property
    def refused(self) -> bool:
        return self.verdict is Verdict.REFUSE


def stamped_position(state: ScratchState, request: ResumeRequest) -> Position | None:
    """Where the resume's checkpoint stands against its bank's (K1-K4), or None when
    either carries no stamp and the events decide as before (K5)."""
    bank = state.bank
    if bank is None or bank.checkpoint is None or request.checkpoint is None:
        return None
    return compare(bank.checkpoint, request.checkpoint)


def _kept_bank(kept: Kept) -> Bank:
    """A retained checkpoint's bank as the gate restores it (K6)."""
    ev = Evidence(kept.position, ScratchBanked.WIRE)
    return Bank(ev, kept.record, kept.position, kept.checkpoint)


def _swept_cause(request: ResumeRequest, swept: Kept) -> Cause:
    """K7: the bank taken at the checkpoint the run rewinds to was swept by retention."""
    detail = (
        f"the run resumes from {request.checkpoint}, whose own bank (#{swept.position + 1}) retention "
        f"swept: it keeps the banks of the last {request.retain} checkpoints with one"
    )
    return Cause(CauseKind.BANK_SWEPT, "K7", detail, (Evidence(swept.position, ScratchBanked.WIRE),))


def _stamped_stale(state: ScratchState, request: ResumeRequest, position: Position) -> Cause:
    """K1, K2: the resume's checkpoint holds writes its bank lacks, whatever events say."""
    bank = state.bank
    assert bank is not None  # stamped_position found one
    detail = (
        f"the run resumes from {request.checkpoint}, {position.value} of its bank's "
        f"{bank.checkpoint}: nodes wrote the scratch after the bank; restoring would revert them"
    )
    return Cause(CauseKind.SCRATCH_STALE, position.rule, detail, (bank.evidence,))


def _scratch_causes(state: ScratchState, request: ResumeRequest, position: Position | None) -> list[Cause]:
    causes: list[Cause] = []
    child = state.lone_child
    if child is not None:
        detail = "this child ran in its parent's sandbox, whose scratch is container-local"
        causes.append(Cause(CauseKind.LONE_CHILD, "S2", detail, (child.evidence,)))
    if state.host_backed is not None:
        return causes  # X6: a host directory holds the scratch; no bank decides
    if state.unbanked is not None:
        detail = f"the last teardown could not bank a non-empty scratch ({state.unbanked_reason})"
        causes.append(Cause(CauseKind.SCRATCH_UNBANKED, "R1", detail, (state.unbanked,)))
        return causes
    swept = pick(state.history, request.checkpoint, request.retain).swept
    if swept is not None and not _own(state, request):
        causes.append(_swept_cause(request, swept))
    if position is not None:
        if position.stale:
            causes.append(_stamped_stale(state, request, position))
    elif state.bank is not None and state.stale_writes:
        causes.append(_event_stale(state.bank, state.stale_writes))
    return causes


def _event_stale(bank: Bank, writes: tuple[StaleWrite, ...]) -> Cause:
    """R2, or K9 when a rewind that named its replayed passes kept a pass that wrote after
    the bank (an earlier pass, an in-flight branch): the cause names those passes."""
    nodes = ", ".join(dict.fromkeys(w.node for w in writes))
    detail = f"node(s) {nodes} finished in the sandbox after the bank; restoring would revert them"
    kept = [w for w in writes if w.kept_by is not None]
    rewinds = tuple(dict.fromkeys(w.kept_by for w in kept if w.kept_by is not None))
    evidence = (bank.evidence, *(w.evidence for w in writes), *rewinds)
    if not kept:
        return Cause(CauseKind.SCRATCH_STALE, "R2", detail, evidence)
    passes = ", ".join(f"{w.node} pass {w.pass_}" for w in kept)
    detail += f" (the rewind {', '.join(map(str, rewinds))} keeps {passes}: it does not replay them)"
    return Cause(CauseKind.SCRATCH_STALE, "K9", detail, evidence)


def _own(state: ScratchState, request: ResumeRequest) -> bool:
    """The current bank is already exactly the resume's checkpoint's (K3)."""
    bank = state.bank
    return bank is not None and request.checkpoint is not None and bank.checkpoint == request.checkpoint


def _force_causes(state: ScratchState, request: ResumeRequest) -> list[Cause]:
    causes: list[Cause] = []
    if request.source_changed:
        detail = "the workflow source changed (its digest or a shared dependency)"
        causes.append(Cause(CauseKind.SOURCE_CHANGED, "R8", detail))
    if request.artifact_contract_changed:
        detail = "the artifact contract changed"
        causes.append(Cause(CauseKind.ARTIFACT_CONTRACT_CHANGED, "R9", detail))
    adoption = state.adoption
    if adoption is not None and adoption.parent_copy_based:
        detail = "the parent's sandbox is copy-based: this child's tree diverges from it"
        rule = "S3" if adoption.scratch_container_local else "A5"
        causes.append(Cause(CauseKind.COPY_BASED_DIVERGENCE, rule, detail, (adoption.evidence,)))
    return causes


def _all_evidence(causes: list[Cause]) -> tuple[Evidence, ...]:
    return tuple(dict.fromkeys(e for c in causes for e in c.evidence))


def _refuse(code: str, causes: list[Cause], consents: Consents, first: Cause) -> ResumeDecision:
    """A refusal naming every cause at once (A10), decided by ``first``."""
    named = "; ".join(c.detail for c in causes)
    return ResumeDecision(
        Verdict.REFUSE,
        first.rule,
        named,
        code=code,
        causes=tuple(causes),
        consents=consents,
        evidence=_all_evidence(causes),
    )


def _decision(
    verdict: Verdict,
    rule: str,
    why: str,
    causes: list[Cause],
    consents: Consents,
    also: Evidence | None = None,
    **more: Any,
) -> ResumeDecision:
    evidence = tuple(dict.fromkeys(_all_evidence(causes) + ((also,) if also is not None else ())))
    return ResumeDecision(
        verdict, rule, why, causes=tuple(causes), consents=consents, evidence=evidence, **more
    )


_STAMPED_WHY = {
    Position.EXACT: "restores the bank: it is exactly the scratch of the checkpoint the run resumes from",
    Position.BEHIND: (
        "restores the bank of a later checkpoint: the run rewound to before it, and replays "
        "on a scratch that holds every write of its checkpoint and more"
    ),
}


def _proceed(
    state: ScratchState,
    consents: Consents,
    causes: list[Cause],
    position: Position | None = None,
    own: Bank | None = None,
) -> ResumeDecision:
    go = functools.partial(_decision, causes=causes, consents=consents)
    if state.lone_child is not None:
        forsake = ScratchForsaken(forced=consents.force, accepted=consents.accept_scratch_loss)
        why = "the child resumes on its own, without its parent's scratch (loss accepted)"
        return go(Verdict.GO_ON_WITHOUT, "S2", why, records=(forsake,))
    if state.host_backed is not None:
        why = "a host directory holds the scratch since it was handed over; no bank decides"
        return go(Verdict.GO_ON_WITHOUT, "X6", why, also=state.host_backed)
    if state.unbanked is not None:
        reason = f"scratch loss accepted: {state.unbanked_reason}"
        rec = ScratchRestored(restored=False, stale=False, accepted=True, reason=reason)
        why = "resumes as it stands, without the scratch its teardown could not bank"
        return go(Verdict.GO_ON_WITHOUT, "R13", why, also=state.unbanked, records=(rec,))
    if own is not None:
        why = "restores the bank taken at exactly the checkpoint the run rewinds to (retained)"
        return go(Verdict.RESTORE, "K6", why, also=own.evidence, bank=own)
    if state.bank is not None and position is not None and not position.stale:
        why = _STAMPED_WHY[position]
        return go(Verdict.RESTORE, position.rule, why, also=state.bank.evidence, bank=state.bank)
    if state.bank is not None:
        stale = bool(state.stale_writes) if position is None else position.stale
        rule, why = ("R7", "restores the stale bank, its loss accepted") if stale else _replayed_why(state)
        return go(Verdict.RESTORE, rule, why, also=state.bank.evidence, bank=state.bank, stale=stale)
    if state.forsaken is not None:
        why = "the scratch was forsaken by an earlier resume that accepted its loss"
        return go(Verdict.GO_ON_WITHOUT, "R7", why, also=state.forsaken)
    if state.last_teardown is not None:
        why = "no bank: the last teardown recorded an empty, unknown or finished scratch"
        return go(Verdict.GO_ON_WITHOUT, "R14", why, also=state.last_teardown)
    return go(Verdict.GO_ON_WITHOUT, "T1", "nothing was ever banked for this run")


def _replayed_why(state: ScratchState) -> tuple[str, str]:
    """X1, or K9 when a rewind took back, by pass, every write after the bank."""
    if state.replayed is None:
        return "X1", "restores the bank before the first node"
    why = f"restores the bank: the rewind {state.replayed} replays every pass that wrote after it"
    return "K9", why


def decide_resume(state: ScratchState, request: ResumeRequest) -> ResumeDecision:
    """May this resume go on, and how? Pure: the state and this call's request only."""
    consents = request.consents
    force_causes = _force_causes(state, request)
    # R10, with R9's exception: a surface about to refuse for a reason --force accepts
    # judges the scratch on what it has, even while the latest execution may still bank.
    # A lone child's refusal rests on its adoption record, not on a teardown: never deferred.
    about_to_refuse = (bool(force_causes) and not consents.force) or state.lone_child is not None
    if request.where is Where.SURFACE and state.may_still_be_banking and not about_to_refuse:
        why = "the latest execution wrote no teardown record yet; the engine decides"
        return ResumeDecision(Verdict.DEFER_TO_ENGINE, "R10", why, consents=consents)
    own = retained_pick(state, request)
    if own is not None:  # K6: the rewind lands on its checkpoint's own scratch
        state = attrs.evolve(state, bank=own, stale_writes=())
    position = stamped_position(state, request)
    scratch_causes = _scratch_causes(state, request, position)
    causes = scratch_causes + force_causes
    if scratch_causes and not consents.accept_scratch_loss:
        first = scratch_causes[0]
        code = CHECKPOINT_BANK_SWEPT if first.kind is CauseKind.BANK_SWEPT else SCRATCH_NOT_PORTABLE
        return _refuse(code, causes, consents, first)
    if force_causes and not consents.force:
        return _refuse(RESUME_INVALID, causes, consents, force_causes[0])
    return _proceed(state, consents, causes, position, own)


def retained_pick(state: ScratchState, request: ResumeRequest) -> Bank | None:
    """K6: the retained bank taken at exactly the resume's checkpoint, when it is not the
    current bank already (then K3 decides as before). A host hand-over (X6), an accepted
    loss (A3) and a finished run (T5) leave no retained bank; R1 and S2 still decide first."""
    if state.unbanked is not None or state.host_backed is not None or state.lone_child is not None:
        return None
    kept = pick(state.history, request.checkpoint, request.retain).kept
    if kept is None:
        return None
    bank = state.bank
    if bank is not None and bank.evidence.position == kept.position:
        return None
    return _kept_bank(kept)


def refuse_unreadable(reason: str) -> ResumeDecision:
    """R15: a timeline that cannot be read refuses the resume, without a code."""
    return ResumeDecision(Verdict.REFUSE, "R15", f"the timeline cannot be read: {reason}")
