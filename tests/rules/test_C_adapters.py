"""Rules C: consents and the runner's deliveries. The adapters tier's tests of C3, C4, C5, C6, C7, C8,
C10 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rigs.claiming_runner import _after, _parked_and_banked, _WritesFirst
from rigs.consent_forms import CONSENT_FORMS, _refusals
from rigs.delivery_timelines import _QueuesBeforeClaim
from rigs.gated_runs import NEW, OLD, RUN, Rig
from rigs.resume_world import World, interloped
from runner_rigs import ACCEPT, RecordingInbound, checksum, make_rig, queue_resume, types

from scratchbank.adapters.memory import FakeSandbox, InMemoryTimeline
from scratchbank.adapters.present import decision_data
from scratchbank.adapters.reference_engine import Node
from scratchbank.application.ports import ResumeDelivery
from scratchbank.application.resume import Target, resume
from scratchbank.application.run_lock import start_run
from scratchbank.application.runner import Handled
from scratchbank.application.service import ScratchService
from scratchbank.domain import SCRATCH_NOT_PORTABLE, ResumeRequest, Verdict
from scratchbank.domain.admission import Consents
from scratchbank.domain.errors import ResumeSuperseded, RunLocked, TimelineWriteFailed
from scratchbank.domain.fold import fold
from scratchbank.domain.records import (
    AttemptClaimed,
    AttemptQueued,
    NodeFinished,
    RunResumed,
    RunStarted,
    RunStatus,
    RunStatusChanged,
    ScratchBanked,
    ScratchRestored,
)
from scratchbank.domain.remedy import remedy
from scratchbank.testing.builders import node, resumed
from scratchbank.testing.clocks import ManualClock

# ---- from tests/rules/test_[AC]*.py: Issue 18 classes 1-3 and the lock's flows (A16, A18, R2, X3, X6, C8), each a named test.


def test_C8_an_in_process_resume_locks_and_checks_before_its_pause_path_writes() -> None:
    """The service's ``hold`` takes the lock and decides before the engine writes its
    answers; another resume in between is RUN_LOCKED; the claim comes after the writes."""
    rig = Rig()
    service = ScratchService(rig.timeline, rig.store, clock=rig.clock, lock=rig.lock)
    e1, grant = start_run(RUN, timeline=rig.timeline, lock=rig.lock, clock=rig.clock)
    assert rig.teardown(OLD, e1, lock=rig.lock, grant=grant).recorded
    held, decision = service.hold(RUN)
    assert decision.verdict is Verdict.RESTORE
    rig.timeline.append(RUN, [node("ask", "human", answered=True)])  # the pause path's writes
    with pytest.raises(RunLocked):
        service.resume(RUN, target=Target(FakeSandbox({})))
    target = FakeSandbox({})
    out = service.resume(RUN, target=Target(target), grant=held)
    assert out.proceeds
    assert target.files == OLD
    kinds = [type(r).__name__ for r in rig.records()]
    assert kinds.index("NodeFinished", kinds.index("ScratchBanked")) < kinds.index("RunResumed")
    holder = rig.lock.holder(RUN)
    assert holder is not None
    assert holder.holder == held.holder  # the execution keeps the lock the check took
    service.bank_at_teardown(RUN, FakeSandbox(dict(NEW)), run_finished=False)
    assert rig.lock.holder(RUN) is None


# ---- from tests/test_resume_use_case.py: The resume and restore use cases end to end, with fakes (R and X rules).


def test_C7_a_resume_that_lost_its_claim_to_another_resume_writes_nothing() -> None:
    """A resume that lost its claim to another resume writes nothing:
    ``scratchbank.application.resume.resume``."""
    w, timeline = interloped([])
    records, banks = timeline.read("run-1"), w.store.objects("run-1")
    timeline.cut_in = [resumed("other")]
    box = FakeSandbox({})
    with pytest.raises(ResumeSuperseded) as raised:
        resume("run-1", ResumeRequest(), timeline=timeline, store=w.store, sandbox=box)
    assert raised.value.code == "RESUME_SUPERSEDED" and box.files == {}  # nothing restored
    assert timeline.read("run-1") == (*records, resumed("other"))  # only the winner's claim
    assert w.store.objects("run-1") == banks


def test_C7_a_conflict_that_took_nothing_is_read_and_decided_again() -> None:
    """Another writer appended a finish in the sandbox after the bank: deciding again
    on what the timeline now holds refuses R2, where a blind retry would restore.
    Proves ``scratchbank.application.resume.resume``."""
    w, timeline = interloped([node("measure", "agent")])
    box = FakeSandbox({})
    out = resume("run-1", ResumeRequest(), timeline=timeline, store=w.store, sandbox=box)
    assert out.decision.code == SCRATCH_NOT_PORTABLE and out.decision.rule == "R2"
    assert box.files == {} and isinstance(w.last(), NodeFinished)


def test_C7_a_teardown_recorded_first_is_decided_on_again() -> None:
    """A teardown recorded first is decided on again: ``scratchbank.application.resume.resume``."""
    w, timeline = interloped([])
    other = World()
    other.park({"newer": b"bank"})
    newer = other.timeline.read("run-1")[-1]
    assert isinstance(newer, ScratchBanked) and newer.object is not None
    w.store.stored["run-1"][newer.object] = other.store.bank("run-1", newer.object) or b""
    timeline.cut_in = [newer]
    box = FakeSandbox({})
    out = resume("run-1", ResumeRequest(), timeline=timeline, store=w.store, sandbox=box)
    assert out.proceeds and box.files == {"newer": b"bank"}
    assert out.claim is not None and out.claim.position == len(timeline.read("run-1"))


def test_C7_fencing_a_resume_whose_run_was_taken_after_its_claim_writes_nothing_more() -> None:
    """Fencing a resume whose run was taken after its claim writes nothing more:
    ``scratchbank.application.teardown.bank_at_teardown``."""
    w = World()
    w.park()

    class TakenDuringRestore(FakeSandbox):
        def staged_lines(self, tree: dict[str, tuple[str, bytes]]) -> list[str]:
            w.timeline.append("run-1", [resumed("newer")])  # another attempt claims now
            return super().staged_lines(tree)

    with pytest.raises(ResumeSuperseded):
        w.resume(sandbox=TakenDuringRestore({}))
    records = w.timeline.read("run-1")
    assert isinstance(records[-1], RunResumed) and records[-1].attempt == "newer"
    assert not any(isinstance(r, ScratchRestored) for r in records)


def test_C7_a_claim_whose_write_landed_but_failed_on_the_way_back_is_not_written_twice() -> None:
    """A claim whose write landed but failed on the way back is not written twice:
    ``scratchbank.application.resume.resume``."""
    w = World()
    w.park()

    class LostAnswer(InMemoryTimeline):
        fail_next = False

        def append(self, run_id, records, *, expected=None):  # type: ignore[no-untyped-def]
            length = super().append(run_id, records, expected=expected)
            if LostAnswer.fail_next:
                LostAnswer.fail_next = False
                raise TimelineWriteFailed("connection reset after commit")
            return length

    timeline = LostAnswer()
    timeline.append("run-1", w.timeline.read("run-1"))
    LostAnswer.fail_next = True
    out = resume(
        "run-1",
        ResumeRequest(),
        timeline=timeline,
        store=w.store,
        sandbox=FakeSandbox({}),
        clock=ManualClock(),
    )
    assert out.proceeds
    kinds = [type(r).__name__ for r in timeline.read("run-1")]
    assert kinds.count("RunResumed") == 1 and kinds.count("ScratchRestored") == 1


# ---- from tests/test_runner_claims.py: The runner on the engine's claim API: the resume's claim and the fenced writer compose.


def test_C6_a_resume_that_loses_its_claim_in_the_runner_is_acked_with_nothing_more_written(
    tmp_path: Path,
) -> None:
    """Another execution starts between the resume's read and its claim: ResumeSuperseded
    inside the runner, acked, and after the other writer's record nothing of ours lands."""
    tl, rig = _parked_and_banked(tmp_path)
    theirs = RunResumed(attempt="cli")
    rig.timeline = _WritesFirst(tl, RunResumed, [theirs])
    inbound = RecordingInbound(ResumeDelivery(RUN, "a2"))
    handled = rig.runner().handle(inbound)
    assert handled.handled is Handled.SUPERSEDED, handled.detail
    assert "RESUME_SUPERSEDED" in handled.detail or "claimed it" in handled.detail
    assert inbound.acked and not inbound.naks
    assert tl.read(RUN)[-1] == theirs  # the last record is the other execution's: nothing after it
    assert _after(tl, AttemptClaimed, "a2") == ["run_status_changed", "run_resumed"]
    assert not list((tmp_path / "sandboxes").iterdir())  # its sandbox was torn down


def test_C6_a_resume_that_loses_its_claim_after_the_restore_writes_no_record_runs_nothing_banks_nothing(
    tmp_path: Path,
) -> None:
    """Another writer appends between the resume's claim and its restore record: the restore
    record is not written, the engine does not run, the teardown does not bank; acked.
    Proves ``scratchbank.application.ports.ResumeDelivery``."""
    tl, rig = _parked_and_banked(tmp_path)
    theirs = RunResumed(attempt="cli")
    rig.timeline = _WritesFirst(tl, ScratchRestored, [theirs])
    banks_before = sorted(p.read_bytes() for p in (tmp_path / "banks").rglob("*") if p.is_file())
    inbound = RecordingInbound(ResumeDelivery(RUN, "a2"))
    handled = rig.runner().handle(inbound)
    assert handled.handled is Handled.SUPERSEDED, handled.detail
    assert inbound.acked
    assert tl.read(RUN)[-1] == theirs
    assert _after(tl, AttemptClaimed, "a2") == ["run_status_changed", "run_resumed", "run_resumed"]
    banks_after = sorted(p.read_bytes() for p in (tmp_path / "banks").rglob("*") if p.is_file())
    assert banks_after == banks_before  # the bank the newer execution restores is untouched


# ---- from tests/test_runner_deliveries.py: The runner on the embedded default: deliveries, consents, refusals (C3-C8, R10-R12, L4).


def test_C6_delivery_published_before_the_last_queue_is_acked_with_nothing_written(tmp_path: Path) -> None:
    """An older attempt's delivery is dropped on admission: acked, the timeline unchanged.
    Proves ``scratchbank.application.ports.ResumeDelivery``."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    tl.append("run-1", [RunStarted(), AttemptQueued(attempt="a1", accept_scratch_loss=True)])
    tl.append("run-1", [AttemptQueued(attempt="a2")])
    before = checksum(tl, "run-1")
    inbound = RecordingInbound(ResumeDelivery("run-1", "a1", ACCEPT))
    handled = rig.runner().handle(inbound)
    assert handled.handled is Handled.SUPERSEDED and inbound.acked and not inbound.naks
    assert checksum(tl, "run-1") == before
    assert not rig.provider.started  # no sandbox either


def test_C4_redelivery_after_the_claim_lends_no_consent(tmp_path: Path) -> None:
    """The attempt was claimed by a runner that died: its consent is not applied again.
    Proves ``scratchbank.application.ports.ResumeDelivery``."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    unbanked = ScratchBanked(banked=False, empty=False, unknown=False, bytes=0, reason="tar failed")
    tl.append("run-1", [RunStarted(), unbanked, AttemptQueued(attempt="a1", accept_scratch_loss=True)])
    tl.append("run-1", [AttemptClaimed(attempt="a1")])
    inbound = RecordingInbound(ResumeDelivery("run-1", "a1", ACCEPT), deliveries=2)
    handled = rig.runner().handle(inbound)
    assert handled.handled is Handled.REFUSED and inbound.acked
    assert handled.decision is not None and handled.decision.code == "SCRATCH_NOT_PORTABLE"
    assert not [r for r in tl.read("run-1") if isinstance(r, ScratchRestored)]


def test_C5_the_claiming_delivery_applies_its_own_consents(tmp_path: Path) -> None:
    """Queued for a1 with the loss accepted: the delivery claims a1 and goes on (R13).
    Proves ``scratchbank.adapters.fs_bank.FilesystemBankStore``."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    unbanked = ScratchBanked(banked=False, empty=False, unknown=False, bytes=0, reason="tar failed")
    tl.append("run-1", [RunStarted(), unbanked])
    decision, delivery = queue_resume(tl, rig.queue, "run-1", "a1", ACCEPT)
    assert delivery is not None and not decision.refused
    handled = rig.runner().run_once(1)
    assert handled is not None and handled.handled is Handled.RAN, handled.detail
    records = tl.read("run-1")
    claimed = [r for r in records if isinstance(r, AttemptClaimed)]
    assert [c.attempt for c in claimed] == ["a1"]
    accepted = [r for r in records if isinstance(r, ScratchRestored)]
    assert accepted and accepted[0].accepted and not accepted[0].restored


def test_C6_a_claim_lost_to_a_newer_attempt_writes_nothing(tmp_path: Path) -> None:
    """A newer attempt is queued between the runner's read and its claim: acked, no claim.
    Proves ``scratchbank.application.ports.ResumeDelivery``."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    tl.append("run-1", [RunStarted(), AttemptQueued(attempt="a1")])
    racing = _QueuesBeforeClaim(tl, "a2")
    rig.timeline = racing
    handled = rig.runner().handle(RecordingInbound(ResumeDelivery("run-1", "a1")))
    assert handled.handled is Handled.SUPERSEDED, handled.detail
    assert types(tl.read("run-1")) == ["run_started", "attempt_queued", "attempt_queued"]


@pytest.mark.parametrize("consents", [Consents(), ACCEPT])
def test_C3_a_consent_is_not_kept_for_the_next_resume(tmp_path: Path, consents: Consents) -> None:
    """The queued attempt's consent is not lent to a later attempt queued without one.
    Proves ``scratchbank.application.ports.ResumeDelivery``."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    unbanked = ScratchBanked(banked=False, empty=False, unknown=False, bytes=0, reason="tar failed")
    tl.append("run-1", [RunStarted(), unbanked, AttemptQueued(attempt="a1", accept_scratch_loss=True)])
    tl.append("run-1", [AttemptQueued(attempt="a2", accept_scratch_loss=consents.accept_scratch_loss)])
    stale = rig.runner().handle(RecordingInbound(ResumeDelivery("run-1", "a1", ACCEPT)))
    assert stale.handled is Handled.SUPERSEDED
    fresh = rig.runner().handle(RecordingInbound(ResumeDelivery("run-1", "a2", consents)))
    expected = Handled.RAN if consents.accept_scratch_loss else Handled.REFUSED
    assert fresh.handled is expected, fresh.detail


def test_C7_the_claim_is_the_first_write_from_the_status_read_and_the_run_reads_running(
    tmp_path: Path,
) -> None:
    """Nothing of the resume is written before the claim; from the claim on the run is running.
    Proves ``scratchbank.adapters.reference_engine.Node``."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl, workflow=(Node("wait", "tool", "true"), Node("gate", "human")))
    tl.append("run-1", [RunStarted(), RunStatusChanged(status=RunStatus.PAUSED), AttemptQueued(attempt="a1")])
    seen = len(tl.read("run-1"))
    handled = rig.runner().handle(RecordingInbound(ResumeDelivery("run-1", "a1")))
    assert handled.handled is Handled.RAN, handled.detail
    records = tl.read("run-1")
    assert types(records[seen : seen + 4]) == [
        "lease_taken",
        "attempt_claimed",
        "run_status_changed",
        "run_resumed",
    ]
    assert fold(records[: seen + 3]).status is RunStatus.RUNNING


# ---- from tests/test_surface_error_table.py: The one error table (code, exit status, HTTP status, MCP error), the README that prints it, remedies in each surface's words, and the shipped rule reference every refusal line names.


@pytest.mark.parametrize("surface", list(CONSENT_FORMS))
@pytest.mark.parametrize("kind", list(_refusals()))
def test_C10_each_refusal_kinds_remedy_names_the_consent_in_its_surfaces_form(
    surface: str, kind: str
) -> None:
    """The one remedy, per refusal kind: flags on the CLI, JSON fields over HTTP, the tool's
    arguments over MCP, Python names in the library; never another surface's form.
    Proves ``scratchbank.domain.remedy.remedy``."""
    decision, scratch, force = _refusals()[kind]
    hint = remedy(decision, surface)  # type: ignore[arg-type]
    accept, forced = CONSENT_FORMS[surface]
    assert (accept in hint) == scratch, hint
    assert (forced in hint) == force, hint
    for other, (o_accept, _) in CONSENT_FORMS.items():
        if other != surface and o_accept not in accept:
            assert o_accept not in hint, (other, hint)
    assert decision_data(decision, surface=surface)["hint"] == hint  # type: ignore[arg-type]
