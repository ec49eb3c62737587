"""The runner on the embedded default: deliveries, consents, refusals (C3-C8, R10-R12, L4).

Real parts: local sandboxes (a PID namespace each), banks on disk, the reference
engine's shell nodes, the in-process queue and lease, an in-memory timeline.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from runner_rigs import ACCEPT, RecordingInbound, checksum, make_rig, queue_resume, types

from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.adapters.reference_engine import Node
from scratchbank.application.ports import ResumeDelivery, Sandbox
from scratchbank.application.runner import Handled
from scratchbank.domain.admission import Consents
from scratchbank.domain.errors import ExecFailed
from scratchbank.domain.fold import fold
from scratchbank.domain.records import (
    AttemptClaimed,
    AttemptQueued,
    NodeFinished,
    ResumeRefused,
    RunStarted,
    RunStatus,
    RunStatusChanged,
    ScratchBanked,
    ScratchRestored,
)
from scratchbank.domain.remedy import remedy
from scratchbank.domain.resume_gate import Verdict


def _start(rig_tl: InMemoryTimeline, run: str = "run-1") -> None:
    rig_tl.append(run, [RunStarted()])


def test_story_a_run_parks_banks_and_goes_on_with_its_scratch_restored(tmp_path: Path) -> None:
    """Queued, claimed, run to its gate and banked; resumed on a new sandbox, restored, finished."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    _start(tl)
    runner = rig.runner()
    queue_resume(tl, rig.queue, "run-1", "a1")
    first = runner.run_once(1)
    assert first is not None and first.handled is Handled.RAN
    assert first.teardown is not None
    assert first.teardown.record.banked
    queue_resume(tl, rig.queue, "run-1", "a2")
    second = runner.run_once(1)
    assert second is not None and second.handled is Handled.RAN, second.detail
    records = tl.read("run-1")
    restored = [r for r in records if isinstance(r, ScratchRestored)]
    assert restored and restored[-1].restored
    measured = [r for r in records if isinstance(r, NodeFinished) and r.node == "measure"]
    assert measured and measured[0].succeeded and measured[0].in_sandbox is True  # it read the restored clone
    assert types(records).count("lease_taken") == 2
    assert rig.queue.pending() == 0  # type: ignore[attr-defined]


def test_C6_delivery_published_before_the_last_queue_is_acked_with_nothing_written(tmp_path: Path) -> None:
    """An older attempt's delivery is dropped on admission: acked, the timeline unchanged."""
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
    """The attempt was claimed by a runner that died: its consent is not applied again."""
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
    """Queued for a1 with the loss accepted: the delivery claims a1 and goes on (R13)."""
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


def test_R12_C10_detached_runner_writes_the_refusal_with_the_remedy_hint(tmp_path: Path) -> None:
    """A refusal under the lease lands in the run's log, its hint from remedy(); acked."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    unbanked = ScratchBanked(banked=False, empty=False, unknown=False, bytes=0, reason="tar failed")
    tl.append("run-1", [RunStarted(), unbanked, AttemptQueued(attempt="a1")])
    inbound = RecordingInbound(ResumeDelivery("run-1", "a1"))
    handled = rig.runner().handle(inbound)
    assert handled.handled is Handled.REFUSED and handled.decision is not None
    refusals = [r for r in tl.read("run-1") if isinstance(r, ResumeRefused)]
    assert len(refusals) == 1
    assert refusals[0].hint == remedy(handled.decision) and "--accept-scratch-loss" in refusals[0].hint
    assert refusals[0].code == "SCRATCH_NOT_PORTABLE" and refusals[0].rule == "R1"
    assert not [r for r in tl.read("run-1") if isinstance(r, AttemptClaimed)]  # refused before the claim


def test_R11_an_in_process_resume_hears_the_engines_refusal(tmp_path: Path) -> None:
    """The surface defers (R10, still banking); the engine refuses; the waiter hears it."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    unbanked = ScratchBanked(banked=False, empty=False, unknown=False, bytes=0, reason="over the cap")
    tl.append("run-1", [RunStarted(), unbanked, RunStarted()])  # the latest execution may still bank
    decision, delivery = queue_resume(tl, rig.queue, "run-1", "a1")
    assert decision.verdict is Verdict.DEFER_TO_ENGINE and delivery is not None
    rig.runner().run_once(1)
    heard = rig.verdicts.wait(delivery, timeout=5)
    assert heard is not None and heard.refused and heard.code == "SCRATCH_NOT_PORTABLE"


def test_R10_surface_refuses_from_the_latest_executions_record_and_queues_nothing(tmp_path: Path) -> None:
    """A refusal the surface can make itself publishes nothing and queues nothing."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    unbanked = ScratchBanked(banked=False, empty=False, unknown=False, bytes=0, reason="over the cap")
    tl.append("run-1", [RunStarted(), unbanked])
    before = checksum(tl, "run-1")
    decision, delivery = queue_resume(tl, rig.queue, "run-1", "a1")
    assert decision.refused and delivery is None
    assert checksum(tl, "run-1") == before and rig.queue.fetch(0.05) is None


def test_L4_a_delivery_meeting_a_held_lease_backs_off_by_its_rank(tmp_path: Path) -> None:
    """Held by another runner: nak'd with its rank's delay; past the last, acked for the sweeper."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    tl.append("run-1", [RunStarted(), AttemptQueued(attempt="a1")])
    assert rig.lease.acquire("run-1", "runner-b") is not None
    runner = rig.runner()
    before = checksum(tl, "run-1")
    delays = []
    for rank in range(1, 20):
        inbound = RecordingInbound(ResumeDelivery("run-1", "a1"), deliveries=rank)
        handled = runner.handle(inbound)
        if handled.handled is Handled.GAVE_UP:
            assert inbound.acked
            break
        assert handled.handled is Handled.LEASE_HELD and not inbound.acked
        delays += inbound.naks
    s = runner.settings
    from scratchbank.domain.lease import backoff_delays

    assert delays == list(backoff_delays(s.hold, s.timing))
    assert checksum(tl, "run-1") == before


def test_C6_a_claim_lost_to_a_newer_attempt_writes_nothing(tmp_path: Path) -> None:
    """A newer attempt is queued between the runner's read and its claim: acked, no claim."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    tl.append("run-1", [RunStarted(), AttemptQueued(attempt="a1")])
    racing = _QueuesBeforeClaim(tl, "a2")
    rig.timeline = racing
    handled = rig.runner().handle(RecordingInbound(ResumeDelivery("run-1", "a1")))
    assert handled.handled is Handled.SUPERSEDED, handled.detail
    assert types(tl.read("run-1")) == ["run_started", "attempt_queued", "attempt_queued"]


class _QueuesBeforeClaim(InMemoryTimeline):
    """A timeline an operator queues a newer attempt on just as the runner claims."""

    def __init__(self, inner: InMemoryTimeline, attempt: str) -> None:
        self.inner, self.attempt, self.fired = inner, attempt, False

    def read(self, run_id: str):  # type: ignore[no-untyped-def]
        return self.inner.read(run_id)

    def append(self, run_id, records, *, expected=None):  # type: ignore[no-untyped-def]
        if not self.fired and any(isinstance(r, AttemptClaimed) for r in records):
            self.fired = True
            self.inner.append(run_id, [AttemptQueued(attempt=self.attempt)])
        return self.inner.append(run_id, records, expected=expected)


@pytest.mark.parametrize("consents", [Consents(), ACCEPT])
def test_C3_a_consent_is_not_kept_for_the_next_resume(tmp_path: Path, consents: Consents) -> None:
    """The queued attempt's consent is not lent to a later attempt queued without one."""
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
    """Nothing of the resume is written before the claim; from the claim on the run is running."""
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


def test_story_the_demo_tells_the_runner_story_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    """`scratchbank demo`: park and bank, restore, R2 heard (R11) and logged (R12), R7, S1/S5, S2/S4."""
    from scratchbank.adapters.demo import run_demo

    assert run_demo() == 0
    out = capsys.readouterr().out
    assert "sandbox 2 now holds: clone/README.md, verify.sh" in out
    assert "the run's log (R12): SCRATCH_NOT_PORTABLE (R2): relaunch the run fresh" in out
    assert "resume: RESTORE (R7: an accepted loss forsakes the bank)" in out
    assert "(S1): 0 records, never ran there" in out and "(1 sandbox_shared, S5)" in out
    assert "REFUSE SCRATCH_NOT_PORTABLE (S2: " in out and "scratch_forsaken records: 1" in out
    assert "RESTORE (K6: " in out and "the resumed sandbox's scratch says 'draft 1'" in out  # a rewind
    for run in ("run-1", "run-1.fix", "run-1.ask"):  # the run ids, and how to inspect each afterwards
        assert f"status {run} " in out


class _NoSandboxes:
    """A provider whose engine refuses to start sandboxes (a node pool with no room)."""

    def start(self, run_id: str, attempt: str | None = None) -> Sandbox:
        raise ExecFailed("no room for a sandbox")

    def stop(self, sandbox: Sandbox) -> None: ...

    def orphans(self, run_id: str) -> list[Sandbox]:
        return []


def test_X5_a_sandbox_that_will_not_start_is_delivered_again(tmp_path: Path) -> None:
    """A failure a later try may cure: the delivery is nak'd, never acked, the lease let go."""
    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    rig.provider = _NoSandboxes()  # type: ignore[assignment]
    tl.append("run-1", [RunStarted(), AttemptQueued(attempt="a1")])
    inbound = RecordingInbound(ResumeDelivery("run-1", "a1"))
    handled = rig.runner().handle(inbound)
    assert handled.handled is Handled.REDELIVER and "EXEC_FAILED" in handled.detail
    assert not inbound.acked and inbound.naks
    assert rig.lease.acquire("run-1", "runner-b") is not None
