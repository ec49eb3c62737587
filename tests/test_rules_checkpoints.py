"""Checkpoint stamps (ADR 0013): staleness read from the checkpoint itself (N1, N2, K1-K5)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.resume import resume
from scratchbank.application.service import ScratchService
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import SCRATCH_NOT_PORTABLE, Consents, ResumeRequest, Verdict, decide_resume, fold
from scratchbank.domain.checkpoints import Checkpoint, Position, compare
from scratchbank.domain.errors import ConfigInvalid, InvalidCheckpoint, TimelineUnreadable
from scratchbank.domain.records import Record, RunRewound, ScratchBanked, ScratchRestored
from scratchbank.domain.snapshot import state_from_data, state_to_data
from scratchbank.domain.wire import decode, encode
from scratchbank.testing.builders import banked, empty, node, restored, resumed, rewound, started
from scratchbank.testing.clocks import ManualClock

C1 = Checkpoint(("start", "c1"))
C2 = Checkpoint(("start", "c1", "c2"))
C3 = Checkpoint(("start", "c1", "c3"))
ACCEPT = Consents(accept_scratch_loss=True)


def stamped(checkpoint: Checkpoint | None) -> ScratchBanked:
    return attrs.evolve(banked(), checkpoint=checkpoint)


def decide(timeline: list[Record], at: Checkpoint | None, consents: Consents = Consents()) -> object:
    return decide_resume(fold(timeline), ResumeRequest(consents=consents, checkpoint=at))


def test_K_compare_reads_the_lineage_never_a_count() -> None:
    """Equal lengths on different branches diverge; prefixes are ahead or behind."""
    assert compare(C2, C2) is Position.EXACT
    assert compare(C1, C2) is Position.AHEAD
    assert compare(C2, C1) is Position.BEHIND
    assert compare(C2, C3) is Position.DIVERGED
    assert Position.AHEAD.stale and Position.DIVERGED.stale
    assert not Position.EXACT.stale and not Position.BEHIND.stale


def test_K_a_checkpoint_without_a_lineage_is_refused_by_name() -> None:
    """An empty lineage or an empty id is a named error, never a stamp."""
    for bad in ((), ("start", "")):
        with pytest.raises(InvalidCheckpoint):
            Checkpoint(bad)


def test_N1_K1_a_lost_node_finished_no_longer_hides_a_stale_bank() -> None:
    """The events say fresh (the finish was lost); the checkpoint says ahead: refused R2."""
    timeline = [started(), node("a"), stamped(C1), resumed()]  # node b's finish was lost
    legacy = decide_resume(fold(timeline), ResumeRequest())
    assert legacy.verdict is Verdict.RESTORE  # the silent revert of N1
    decision = decide_resume(fold(timeline), ResumeRequest(checkpoint=C2))
    assert decision.refused and decision.code == SCRATCH_NOT_PORTABLE and decision.rule == "K1"
    assert "ahead" in decision.explanation


def test_K1_R7_accepting_the_loss_restores_the_stale_bank_and_says_stale() -> None:
    """A stamped stale bank with its loss accepted restores as R7, stale."""
    timeline = [started(), node("a"), stamped(C1), resumed()]
    decision = decide_resume(fold(timeline), ResumeRequest(consents=ACCEPT, checkpoint=C2))
    assert decision.verdict is Verdict.RESTORE and decision.rule == "R7" and decision.stale


def test_N2_K3_a_rewind_across_a_loop_to_the_bank_checkpoint_restores_exactly() -> None:
    """Loop passes after the bank, rewound to the bank's checkpoint: restored, not refused."""
    rewind = RunRewound(dropped_nodes=("loop",), on_cycle=("loop",))
    timeline = [started(), node("a"), stamped(C1), node("loop", on_cycle=True), rewind, resumed()]
    legacy = decide_resume(fold(timeline), ResumeRequest())
    assert legacy.refused and legacy.rule == "R2"  # refused by shape (N2)
    decision = decide_resume(fold(timeline), ResumeRequest(checkpoint=C1))
    assert decision.verdict is Verdict.RESTORE and decision.rule == "K3" and not decision.stale


def test_K2_a_branch_past_a_rewind_is_stale_though_its_count_equals_the_bank() -> None:
    """Bank at c2, resume at c3 (same length, another branch): refused K2."""
    decision = decide_resume(fold([started(), stamped(C2), resumed()]), ResumeRequest(checkpoint=C3))
    assert decision.refused and decision.rule == "K2" and decision.code == SCRATCH_NOT_PORTABLE


def test_K4_a_rewind_to_before_the_bank_restores_it_and_says_so() -> None:
    """Resume behind the bank: the bank holds every write of the checkpoint; restored K4."""
    decision = decide_resume(fold([started(), stamped(C2), resumed()]), ResumeRequest(checkpoint=C1))
    assert decision.verdict is Verdict.RESTORE and decision.rule == "K4" and not decision.stale
    assert "later checkpoint" in decision.explanation


@pytest.mark.parametrize(("bank_stamp", "at"), [(None, C2), (C1, None), (None, None)])
def test_K5_without_a_stamp_on_either_side_the_events_decide_as_before(
    bank_stamp: Checkpoint | None, at: Checkpoint | None
) -> None:
    """Unstamped bank or request: the decision is the legacy one, field for field."""
    for tail in ([], [node("b")]):
        timeline = [started(), node("a"), stamped(bank_stamp), *tail, resumed()]
        legacy = [started(), node("a"), banked(), *tail, resumed()]
        got = decide_resume(fold(timeline), ResumeRequest(checkpoint=at))
        want = decide_resume(fold(legacy), ResumeRequest())
        assert attrs.evolve(got, bank=None) == attrs.evolve(want, bank=None)


def test_A2_K_a_restore_naming_its_checkpoint_restamps_the_bank() -> None:
    """A stale bank restored at c2 with loss accepted is c2's scratch from then on."""
    restored = ScratchRestored(restored=True, stale=True, accepted=True, checkpoint=C2)
    state = fold([started(), stamped(C1), resumed(), restored])
    assert state.bank is not None and state.bank.checkpoint == C2
    assert decide_resume(state, ResumeRequest(checkpoint=C2)).rule == "K3"


def test_A2_K5_a_stale_restore_naming_no_checkpoint_drops_the_stamp() -> None:
    """Restored stale without a checkpoint: the events decide from then on; exact keeps it."""
    stale = ScratchRestored(restored=True, stale=True, accepted=True)
    assert fold([started(), stamped(C1), resumed(), stale]).bank.checkpoint is None  # type: ignore[union-attr]
    exact = ScratchRestored(restored=True, stale=False, accepted=False)
    assert fold([started(), stamped(C1), resumed(), exact]).bank.checkpoint == C1  # type: ignore[union-attr]


def test_K_wire_a_stamp_survives_the_wire_and_older_records_read_unstamped() -> None:
    """v3 banked / v2 restored carry the lineage; v2 banked and v1 restored read without one."""
    rec = stamped(C2)
    data = encode(rec)
    assert data["v"] == 3 and data["checkpoint"] == ["start", "c1", "c2"]
    assert decode(data) == rec
    restored = ScratchRestored(restored=True, stale=False, accepted=False, checkpoint=C1)
    assert decode(encode(restored)) == restored
    old = {**encode(banked()), "v": 2}
    assert decode(old) == banked()
    old_restored = {
        "type": "sandbox_scratch_restored",
        "v": 1,
        "restored": True,
        "stale": False,
        "accepted": False,
    }
    assert decode(old_restored).checkpoint is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", [[], [""], ["start", 3], "start", 7, {"id": "c1"}])
def test_A6_K_an_ill_typed_checkpoint_makes_the_timeline_unreadable(bad: object) -> None:
    """A checkpoint that is not a non-empty list of non-empty ids is unreadable, never None."""
    with pytest.raises(TimelineUnreadable, match="checkpoint"):
        decode({**encode(banked()), "checkpoint": bad}, position=3)


def test_K_wire_a_newer_version_than_this_build_is_unreadable() -> None:
    """A v4 teardown record is refused, not read as if it had no stamp."""
    with pytest.raises(TimelineUnreadable, match="newer"):
        decode({**encode(stamped(C1)), "v": 4})


def test_K_a_snapshot_keeps_the_bank_stamp_and_an_older_one_reads_the_record() -> None:
    """The stamp survives a snapshot; a 3-field bank (older snapshot) reads its record's."""
    restored = ScratchRestored(restored=True, stale=True, accepted=True, checkpoint=C2)
    state = fold([started(), stamped(C1), resumed(), restored])
    assert state_from_data(state_to_data(state)) == state
    data = state_to_data(fold([started(), stamped(C1)]))
    data["bank"] = data["bank"][:3]
    back = state_from_data(data)
    assert back is not None and back.bank is not None and back.bank.checkpoint == C1


def test_K_teardown_stamps_its_record_and_the_resume_restamps_the_restore() -> None:
    """bank_at_teardown(checkpoint=) and resume(ResumeRequest(checkpoint=)) thread the stamp."""
    timeline, store, clock = InMemoryTimeline(), InMemoryBankStore(), ManualClock()
    timeline.append("run-1", [started(), node("clone", "tool")])
    files = {"a.txt": b"one"}
    report = bank_at_teardown(
        "run-1", timeline=timeline, store=store, sandbox=FakeSandbox(dict(files)),
        run_finished=False, clock=clock, checkpoint=C1,
    )  # fmt: skip
    assert report.recorded and report.record.checkpoint == C1
    assert timeline.read("run-1")[-1] == report.record
    timeline.append("run-1", [resumed()])  # the write of c2 lost its node_finished
    before = timeline.read("run-1")
    box = FakeSandbox({})
    out = resume(
        "run-1", ResumeRequest(checkpoint=C2), timeline=timeline, store=store, sandbox=box, clock=clock
    )
    assert out.decision.rule == "K1" and not out.proceeds
    assert timeline.read("run-1") == before and box.files == {}  # the refusal changed nothing
    out = resume(
        "run-1", ResumeRequest(checkpoint=C1), timeline=timeline, store=store, sandbox=box, clock=clock
    )
    assert out.proceeds and out.decision.rule == "K3" and box.files == files
    last = timeline.read("run-1")[-1]
    assert isinstance(last, ScratchRestored) and last.restored and last.checkpoint == C1


def test_K1_the_refusal_line_names_its_rule_in_words() -> None:
    """A K1 refusal says K1 in words from the shipped rule reference; K1-K5 are all there."""
    from scratchbank.adapters.present import decision_text
    from scratchbank.adapters.rules import RULES

    decision = decide_resume(fold([started(), stamped(C1), resumed()]), ResumeRequest(checkpoint=C2))
    assert any(f"K1: {RULES['K1'].title}" in line for line in decision_text(decision))
    assert all(f"K{n}" in RULES for n in range(1, 9))


# Retention (ADR 0013, K6-K8): the scratch follows a rewind.

C4 = Checkpoint(("start", "c1", "c2", "c4"))
C5 = Checkpoint(("start", "c1", "c2", "c4", "c5"))


def bank_at(checkpoint: Checkpoint, digit: str) -> ScratchBanked:
    """A stamped bank whose object is its own (distinct content per checkpoint)."""
    sha = digit * 64
    return attrs.evolve(banked(sha256=sha), checkpoint=checkpoint, object=f"banks/{sha}.tgz")


def checkpoints_run() -> list[Record]:
    """Banks taken at c1 (#2) and c2 (#5): the run stands past c2."""
    return [started(), bank_at(C1, "1"), resumed(), node("b"), bank_at(C2, "2"), resumed()]


def test_K6_a_rewind_restores_the_bank_taken_at_its_checkpoint_not_the_newest() -> None:
    """Resume from c1 with banks at c1 and c2: the c1 bank is restored, named K6."""
    decision = decide_resume(fold(checkpoints_run()), ResumeRequest(checkpoint=C1))
    assert decision.verdict is Verdict.RESTORE and decision.rule == "K6" and not decision.stale
    assert decision.bank is not None and decision.bank.record == bank_at(C1, "1")
    assert decision.bank.evidence.position == 1
    at_c2 = decide_resume(fold(checkpoints_run()), ResumeRequest(checkpoint=C2))
    assert at_c2.rule == "K3" and at_c2.bank is not None and at_c2.bank.record == bank_at(C2, "2")


def test_K6_the_fold_follows_a_restore_record_naming_the_older_bank() -> None:
    """A restore naming c1 and bank #2 makes the c1 bank current; resuming at c1 again is K3."""
    back = ScratchRestored(restored=True, stale=False, accepted=False, checkpoint=C1, bank=1)
    state = fold([*checkpoints_run(), back])
    assert state.bank is not None and state.bank.record == bank_at(C1, "1") and state.bank.checkpoint == C1
    assert decide_resume(state, ResumeRequest(checkpoint=C1)).rule == "K3"
    assert decide_resume(state, ResumeRequest(checkpoint=C2)).rule == "K6"  # c2's is still kept


def test_K6_K1_a_checkpoint_without_a_bank_of_its_own_decides_on_the_current_bank() -> None:
    """No bank at c4 (ahead of c2's): the current bank decides (K1), no older bank is picked."""
    decision = decide_resume(fold(checkpoints_run()), ResumeRequest(checkpoint=C4))
    assert decision.refused and decision.rule == "K1" and decision.code == SCRATCH_NOT_PORTABLE


def test_K7_a_rewind_to_a_swept_bank_is_refused_by_name_with_its_remedy() -> None:
    """Retention 1 keeps c2's bank only: a rewind to c1 is CHECKPOINT_BANK_SWEPT, K7."""
    from scratchbank.domain.errors import CheckpointBankSwept
    from scratchbank.domain.remedy import remedy

    state = fold(checkpoints_run())
    decision = decide_resume(state, ResumeRequest(checkpoint=C1, retain=1))
    assert decision.refused and decision.rule == "K7" and decision.code == "CHECKPOINT_BANK_SWEPT"
    assert "swept" in decision.explanation and remedy(decision) == CheckpointBankSwept.remedy
    accepted = decide_resume(state, ResumeRequest(consents=ACCEPT, checkpoint=C1, retain=1))
    assert accepted.verdict is Verdict.RESTORE and accepted.rule == "K4"  # the current bank
    assert decide_resume(state, ResumeRequest(checkpoint=C1, retain=2)).rule == "K6"


def test_K8_a_retention_setting_outside_its_bounds_is_refused_by_name() -> None:
    """Retention is 1..64: anything else is a named error, never a silent default."""
    for bad in (0, -1, 65, True):
        with pytest.raises(InvalidCheckpoint, match="retention"):
            ResumeRequest(retain=bad)


def test_T4_K8_an_empty_scratch_drops_the_current_bank_but_not_older_checkpoints() -> None:
    """Empty at c2: a resume from c2 goes on without (T4), a rewind to c1 gets c1's bank."""
    run = [started(), bank_at(C1, "1"), resumed(), node("b"), attrs.evolve(empty(), checkpoint=C2), resumed()]
    state = fold(run)
    assert state.bank is None
    at_c2 = decide_resume(state, ResumeRequest(checkpoint=C2))
    assert at_c2.verdict is Verdict.GO_ON_WITHOUT and at_c2.rule == "R14"
    at_c1 = decide_resume(state, ResumeRequest(checkpoint=C1))
    assert at_c1.verdict is Verdict.RESTORE and at_c1.rule == "K6"
    assert at_c1.bank is not None and at_c1.bank.record == bank_at(C1, "1")
    legacy = fold([started(), banked(), resumed(), empty(), resumed()])
    assert legacy.history == () and decide_resume(legacy, ResumeRequest()).rule == "R14"


def test_A3_K8_a_rewind_to_before_an_accepted_loss_restores_no_older_bank() -> None:
    """An accepted loss is final: a rewind to c1 afterwards goes on without, none restored."""
    from scratchbank.domain.objects import needed_objects

    loss = ScratchRestored(restored=False, stale=False, accepted=True, reason="bank gone")
    state = fold([*checkpoints_run(), loss, resumed()])
    decision = decide_resume(state, ResumeRequest(checkpoint=C1))
    assert decision.verdict is Verdict.GO_ON_WITHOUT and decision.rule == "R7"
    assert state.history == () and needed_objects(state) == frozenset()


def test_X6_K8_a_rewind_to_before_a_host_hand_over_restores_no_bank() -> None:
    """The host directory holds the scratch for good: a rewind to c1 restores nothing."""
    from scratchbank.domain.objects import needed_objects

    state = fold([*checkpoints_run(), restored(host_backed=True), resumed()])
    decision = decide_resume(state, ResumeRequest(checkpoint=C1))
    assert decision.verdict is Verdict.GO_ON_WITHOUT and decision.rule == "X6"
    assert state.history == () and needed_objects(state) == frozenset()


def test_T5_K8_a_finished_run_keeps_no_checkpoint_bank() -> None:
    """A finished teardown forgets every checkpoint's bank."""
    from scratchbank.testing.builders import finished_teardown

    assert fold([*checkpoints_run(), finished_teardown()]).history == ()


def test_K6_wire_a_restore_naming_its_bank_survives_and_v2_reads_without() -> None:
    """sandbox_scratch_restored v3 carries ``bank``; a v2 record reads with none."""
    rec = ScratchRestored(restored=True, stale=False, accepted=False, checkpoint=C1, bank=1)
    data = encode(rec)
    assert data["v"] == 3 and data["bank"] == 1 and decode(data) == rec
    old = {k: v for k, v in data.items() if k != "bank"} | {"v": 2}
    assert decode(old) == attrs.evolve(rec, bank=None)


def test_K8_a_snapshot_keeps_the_checkpoints_banks() -> None:
    """The retained history survives a snapshot; an older (v3) snapshot is ignored (folded again)."""
    state = fold(checkpoints_run())
    assert len(state.history) == 2 and state_from_data(state_to_data(state)) == state
    assert state_from_data({**state_to_data(state), "v": 3}) is None


def _teardown(
    timeline: InMemoryTimeline,
    store: InMemoryBankStore,
    files: dict[str, bytes],
    at: Checkpoint,
    retain: int = 5,
) -> None:
    report = bank_at_teardown(
        "run-1", timeline=timeline, store=store, sandbox=FakeSandbox(dict(files)),
        run_finished=False, clock=ManualClock(), checkpoint=at, retain=retain,
    )  # fmt: skip
    assert report.recorded
    timeline.append("run-1", [resumed()])


def test_K6_K8_use_case_a_rewind_gets_the_older_scratch_back_and_names_it() -> None:
    """Teardowns at c1 and c2 keep both objects; a resume from c1 restores c1's files."""
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-1", [started()])
    _teardown(timeline, store, {"a.txt": b"one"}, C1)
    _teardown(timeline, store, {"a.txt": b"two", "b.txt": b"more"}, C2)
    assert len([o for o in store.objects("run-1") if o.name]) == 2  # retention kept c1's
    box = FakeSandbox({})
    out = resume(
        "run-1",
        ResumeRequest(checkpoint=C1),
        timeline=timeline,
        store=store,
        sandbox=box,
        clock=ManualClock(),
    )
    assert out.proceeds and out.decision.rule == "K6" and box.files == {"a.txt": b"one"}
    last = timeline.read("run-1")[-1]
    assert isinstance(last, ScratchRestored) and last.checkpoint == C1 and last.bank == 1
    state = fold(timeline.read("run-1"))
    assert state.bank is not None and state.bank.checkpoint == C1 and state.bank.evidence.position == 1


def test_K8_teardown_and_prune_keep_what_retention_says_and_nothing_else() -> None:
    """Retention 2 over four stamped teardowns: the two newest objects stay, the rest go."""
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-1", [started()])
    for n, at in enumerate((C1, C2, C4, C5)):
        _teardown(timeline, store, {"n.txt": str(n).encode()}, at, retain=2)
    kept = {o.name for o in store.objects("run-1")}
    state = fold(timeline.read("run-1"))
    assert kept == {k.object for k in state.history[-2:]} and len(kept) == 2
    before = (list(timeline.read("run-1")), kept)
    box = FakeSandbox({})
    out = resume(
        "run-1",
        ResumeRequest(checkpoint=C1, retain=2),
        timeline=timeline,
        store=store,
        sandbox=box,
        clock=ManualClock(),
    )
    assert out.decision.code == "CHECKPOINT_BANK_SWEPT" and not out.proceeds
    assert (
        list(timeline.read("run-1")),
        {o.name for o in store.objects("run-1")},
    ) == before and box.files == {}


def test_T4_K8_use_case_an_empty_teardown_keeps_the_older_checkpoint_bank() -> None:
    """An empty scratch at c2 leaves c1's object in the store (retained), none of its own."""
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-1", [started()])
    _teardown(timeline, store, {"a.txt": b"one"}, C1)
    _teardown(timeline, store, {}, C2)
    assert isinstance(timeline.read("run-1")[-2], ScratchBanked) and timeline.read("run-1")[-2].empty  # type: ignore[union-attr]
    assert len([o for o in store.objects("run-1") if o.name]) == 1
    box = FakeSandbox({})
    out = resume(
        "run-1",
        ResumeRequest(checkpoint=C1),
        timeline=timeline,
        store=store,
        sandbox=box,
        clock=ManualClock(),
    )
    assert out.decision.rule == "K6" and box.files == {"a.txt": b"one"}


def test_K8_status_lists_the_banks_a_run_holds_and_their_checkpoints() -> None:
    """status: each checkpoint's bank, where it was recorded, and whether retention keeps it."""
    from scratchbank.adapters.present import state_data, state_text

    data = state_data(fold(checkpoints_run()))
    held = data["checkpoint_banks"]
    assert [(h["checkpoint"], h["at"], h["kept"]) for h in held] == [
        ("c1", "record 2", True),
        ("c2", "record 5", True),
    ]
    assert data["bank"]["checkpoint"] == "c2"
    lines = state_text(fold(checkpoints_run()))
    assert any(line.startswith("checkpoint bank: c1: record 2") for line in lines)


def test_K_the_delivery_carries_the_checkpoint_and_an_old_one_still_decodes() -> None:
    """The NATS payload carries the lineage; one without it decodes unstamped; a bad one is malformed."""
    import json

    from scratchbank.adapters.nats_queue import _delivery, _payload
    from scratchbank.application.ports import ResumeDelivery

    sent = ResumeDelivery("run-1", "a1", ACCEPT, 0, C2)
    assert _delivery(_payload(sent)) == sent
    old = {k: v for k, v in json.loads(_payload(sent)).items() if k != "checkpoint"}
    assert _delivery(json.dumps(old).encode()) == attrs.evolve(sent, checkpoint=None)
    for bad in ("start", [], [""], {"id": "c1"}):
        with pytest.raises((TypeError, ValueError)):
            _delivery(json.dumps({**old, "checkpoint": bad}).encode())


def test_K_the_cli_and_the_http_body_take_the_resume_checkpoint() -> None:
    """`resume --checkpoint start,c1` and {"checkpoint": [...]} reach the ResumeRequest."""
    from scratchbank.adapters.cli import _parser, _request
    from scratchbank.adapters.http_api import ResumeBody

    args = _parser().parse_args(["resume", "run-1", "--checkpoint", "start,c1"])
    assert _request(args).checkpoint == C1
    assert _request(_parser().parse_args(["resume", "run-1"])).checkpoint is None
    with pytest.raises(InvalidCheckpoint):
        _request(_parser().parse_args(["resume", "run-1", "--checkpoint", "start,,c1"]))
    assert ResumeBody(checkpoint=["start", "c1"]).checkpoint == ["start", "c1"]


def test_K_a_queued_resume_carries_its_checkpoint_to_the_runner(tmp_path: object) -> None:
    """Queued from c1 (banks at c1 and c2): the record and the delivery carry it; the runner picks K6."""
    from pathlib import Path

    from runner_rigs import RecordingInbound, make_rig

    from scratchbank.adapters.inprocess import InProcessQueue
    from scratchbank.application.service import ScratchService
    from scratchbank.domain.records import AttemptQueued

    timeline, queue = InMemoryTimeline(), InProcessQueue(ack_wait=5.0)
    timeline.append("run-1", [started(), bank_at(C1, "1"), resumed(), bank_at(C2, "2")])
    service = ScratchService(timeline, InMemoryBankStore(), clock=ManualClock(), queue=queue)
    queued = service.queue_resume("run-1", ResumeRequest(checkpoint=C1), attempt="a1")
    assert queued.attempt == "a1", queued.decision
    record = [r for r in timeline.read("run-1") if isinstance(r, AttemptQueued)][-1]
    assert record.checkpoint == C1 and decode(encode(record)) == record
    inbound = queue.fetch(timeout=1.0)
    assert inbound is not None and inbound.delivery.checkpoint == C1
    rig = make_rig(Path(str(tmp_path)), timeline)
    rig.provider = _NoSandboxes()  # type: ignore[assignment]  # the pure tier starts no process
    rig.runner().handle(RecordingInbound(inbound.delivery))
    heard = rig.verdicts.wait(inbound.delivery, 1.0)  # R11: told before the sandbox is asked for
    assert heard is not None and heard.rule == "K6", heard


class _NoSandboxes:
    """A provider that cannot start one (the runner decides first, then asks)."""

    def start(self, run_id: str, attempt: str | None = None) -> object:
        from scratchbank.domain.errors import SandboxNotStarted

        raise SandboxNotStarted("no sandbox in the pure tier")

    def stop(self, sandbox: object) -> None:
        pass

    def orphans(self, run_id: str) -> list[object]:
        return []


def test_K_the_mcp_resume_tool_takes_the_checkpoint_and_K7_has_a_consent_name() -> None:
    """MCP resume(checkpoint=[...]) reaches the gate (K1 here); a K7 refusal can be consented by name."""
    import asyncio

    from mcp.server.mcpserver.exceptions import ToolError

    from scratchbank.adapters.http_api import ApiSettings
    from scratchbank.adapters.mcp_server import build_server, consent_name
    from scratchbank.application.service import ScratchService

    timeline = InMemoryTimeline()
    timeline.append("run-1", [*checkpoints_run()[:-1]])
    server = build_server(
        ScratchService(timeline, InMemoryBankStore(), clock=ManualClock()), ApiSettings("t")
    )
    before = timeline.read("run-1")
    with pytest.raises(ToolError, match=r'scratch_not_portable.*"rule": "K1"'):
        asyncio.run(server.call_tool("resume", {"run": "run-1", "checkpoint": list(C4.lineage)}))
    assert timeline.read("run-1") == before  # the refusal wrote nothing
    swept = decide_resume(fold(checkpoints_run()), ResumeRequest(checkpoint=C1, retain=1))
    assert (consent_name(swept) or "").startswith("checkpoint_bank_swept/K7/")


# K9: without stamps, a rewind's replay read from the timeline (issue 21 item 2b, N2)


def loop(pass_: int, name: str = "loop") -> Record:
    return attrs.evolve(node(name, on_cycle=True), pass_=pass_)


def rewind_replaying(**replayed: list[int]) -> RunRewound:
    nodes = tuple(replayed)
    return RunRewound(dropped_nodes=nodes, on_cycle=nodes, replayed=replayed)


def test_N2_K9_a_rewind_replaying_every_loop_pass_after_the_bank_restores_without_stamps() -> None:
    """Loop pass 2 wrote after the bank; the rewind replays pass 2: restored, K9, not refused by shape."""
    shape = [started(), loop(1), banked(), loop(2), rewound("loop", on_cycle=("loop",)), resumed()]
    assert decide_resume(fold(shape), ResumeRequest()).rule == "R2"  # v1 rewind: refused by shape
    timeline = [started(), loop(1), banked(), loop(2), rewind_replaying(loop=[2]), resumed()]
    decision = decide_resume(fold(timeline), ResumeRequest())
    assert decision.verdict is Verdict.RESTORE and decision.rule == "K9" and not decision.stale
    assert "#5 run_rewound" in decision.explanation


def test_K9_a_kept_loop_pass_that_wrote_after_the_bank_is_refused_naming_the_pass() -> None:
    """Passes 2 and 3 wrote after the bank; the rewind replays 3 only: refused K9, naming pass 2."""
    timeline = [started(), loop(1), banked(), loop(2), loop(3), rewind_replaying(loop=[3]), resumed()]
    decision = decide_resume(fold(timeline), ResumeRequest())
    assert decision.refused and decision.code == SCRATCH_NOT_PORTABLE and decision.rule == "K9"
    assert "loop pass 2" in decision.explanation and "#6 run_rewound" in decision.explanation
    assert [str(e) for e in decision.evidence] == [
        "#3 sandbox_scratch_banked",
        "#4 node_finished",
        "#6 run_rewound",
    ]
    accepted = decide_resume(fold(timeline), ResumeRequest(consents=ACCEPT))
    assert accepted.verdict is Verdict.RESTORE and accepted.rule == "R7" and accepted.stale


def test_K9_an_in_flight_branch_the_rewind_lets_finish_still_counts() -> None:
    """A fan-out's branch (pass 1) wrote after the bank and the rewind does not replay it: refused."""
    each = [loop(1, "each"), loop(2, "each")]
    timeline = [started(), banked(), *each, rewind_replaying(each=[2]), resumed()]
    decision = decide_resume(fold(timeline), ResumeRequest())
    assert decision.refused and decision.rule == "K9" and "each pass 1" in decision.explanation
    replayed = [started(), banked(), *each, rewind_replaying(each=[1, 2]), resumed()]
    assert decide_resume(fold(replayed), ResumeRequest()).rule == "K9"
    assert decide_resume(fold(replayed), ResumeRequest()).verdict is Verdict.RESTORE


def test_K9_a_finish_without_a_pass_or_a_node_without_passes_is_read_as_R6_says() -> None:
    """No pass on the finish, or none named for its node: the rewind cannot take it back by pass."""
    no_pass = [started(), banked(), node("loop", on_cycle=True), rewind_replaying(loop=[1]), resumed()]
    assert decide_resume(fold(no_pass), ResumeRequest()).rule == "R2"
    other = RunRewound(dropped_nodes=("loop", "x"), on_cycle=("loop", "x"), replayed={"x": [1]})
    unnamed = [started(), banked(), loop(1), other, resumed()]
    assert decide_resume(fold(unnamed), ResumeRequest()).rule == "R2"
    not_dropped = [started(), banked(), loop(1), loop(1, "y"), rewind_replaying(loop=[1]), resumed()]
    assert decide_resume(fold(not_dropped), ResumeRequest()).rule == "R2"  # y was not dropped


def test_K9_a_stamped_bank_is_still_decided_by_its_stamp() -> None:
    """Both stamps present: K1-K4 decide; the passes' reading only replaces R6's guess."""
    timeline = [started(), loop(1), stamped(C1), loop(2), rewind_replaying(loop=[2]), resumed()]
    assert decide_resume(fold(timeline), ResumeRequest(checkpoint=C2)).rule == "K1"


def test_A6_K9_passes_on_the_wire_round_trip_and_old_versions_read_without_them() -> None:
    """v2 finishes and rewinds carry passes; v1 reads through identity upcasters; bad passes are unreadable."""
    rewind = rewind_replaying(loop=[3, 2])
    wire = encode(rewind)
    assert wire["v"] == 2 and wire["_replayed_passes"] == {"loop": [2, 3]}
    assert decode(wire) == rewind and decode(encode(loop(2))) == loop(2)
    assert encode(loop(2))["_pass"] == 2
    old = decode({"type": "run_rewound", "v": 1, "dropped_nodes": ["loop"]})
    assert isinstance(old, RunRewound) and old.replayed is None
    assert decode({"type": "node_finished", "v": 1, "node": "a", "succeeded": True}) == attrs.evolve(
        node("a", kind=None, on_cycle=None)
    )
    finish = {"type": "node_finished", "v": 2, "node": "a", "succeeded": True}
    rewound_ = {"type": "run_rewound", "v": 2, "dropped_nodes": ["loop"]}
    for bad in (
        {**finish, "_pass": 0},
        {**finish, "_pass": "2"},
        {**finish, "_pass": True},
        {**rewound_, "_replayed_passes": ["loop"]},
        {**rewound_, "_replayed_passes": {"loop": []}},
        {**rewound_, "_replayed_passes": {"loop": [0]}},
        {**rewound_, "_replayed_passes": {"loop": ["1"]}},
        {**rewound_, "_replayed_passes": {"loop": [True]}},
        {**rewound_, "_replayed_passes": {"other": [1]}},
        {**finish, "v": 3},
    ):
        with pytest.raises(TimelineUnreadable):
            decode(bad)


def test_K9_the_snapshot_keeps_passes_the_kept_by_rewind_and_the_replay() -> None:
    """A snapshot of a K9 state decides as the fold does; a v4 snapshot is not trusted."""
    kept = [started(), loop(1), banked(), loop(2), loop(3), rewind_replaying(loop=[3])]
    replayed = [started(), loop(1), banked(), loop(2), rewind_replaying(loop=[2])]
    for timeline in (kept, replayed):
        state = fold(timeline)
        assert state_from_data(state_to_data(state)) == state
    assert state_from_data({**state_to_data(fold(kept)), "v": 4}) is None


# K8: the retention setting the surfaces and the runner share (SCRATCHBANK_RETAIN)

URLS = {
    "SCRATCHBANK_TIMELINE": "sqlite:///tmp/sb-unused/timeline.db",
    "SCRATCHBANK_BANK": "file:///tmp/sb-unused",
}


@pytest.mark.parametrize("value", ["0", "65", "five", "-1", "1.5", "\u0663", "5 checkpoints"])
def test_P10_K8_a_bad_retention_setting_is_named(value: str) -> None:
    """SCRATCHBANK_RETAIN outside 1-64, or not a whole number: ConfigInvalid naming it and its range."""
    from scratchbank.adapters.config import settings_from

    with pytest.raises(ConfigInvalid, match=r"SCRATCHBANK_RETAIN=.*from 1 to 64") as caught:
        settings_from({**URLS, "SCRATCHBANK_RETAIN": value})
    assert "SCRATCHBANK_RETAIN" in caught.value.remedy


def test_K8_the_retention_setting_is_read_from_the_environment_surfaces_and_runner_share(
    tmp_path: Path,
) -> None:
    """Unset or empty: 5; 1 and 64 read; the runner's settings are the surfaces' own."""
    from scratchbank.adapters.config import settings_from
    from scratchbank.adapters.runner_settings import VARIABLES

    assert settings_from(URLS).retain == 5 and settings_from({**URLS, "SCRATCHBANK_RETAIN": ""}).retain == 5
    assert [settings_from({**URLS, "SCRATCHBANK_RETAIN": v}).retain for v in ("1", " 64 ")] == [1, 64]
    assert "SCRATCHBANK_RETAIN" in VARIABLES


def kept_flags(service: ScratchService) -> list[bool]:
    from scratchbank.adapters.present import status_data, status_text

    banks = status_data(service.status("run-1"))["state"]["checkpoint_banks"]
    swept = [line for line in status_text(service.status("run-1")) if "past retention" in line]
    assert len(swept) == [b["kept"] for b in banks].count(False)
    return [b["kept"] for b in banks]


def test_K8_K7_a_service_decides_and_prunes_with_its_retention_setting(tmp_path: Path) -> None:
    """bootstrap hands the setting to the service: retain 1 sweeps c1's bank (K7) where 5 keeps it (K6)."""
    from scratchbank.adapters.bootstrap import bootstrap
    from scratchbank.adapters.config import home_settings

    with bootstrap(attrs.evolve(home_settings(tmp_path), retain=1), create=True) as service:
        assert service.retain == 1
        service.timeline.append("run-1", checkpoints_run())
        before = service.timeline.read("run-1")
        swept = service.assess("run-1", ResumeRequest(checkpoint=C1)).decision
        assert swept.refused and swept.rule == "K7" and swept.code == "CHECKPOINT_BANK_SWEPT"
        assert service.timeline.read("run-1") == before
        assert kept_flags(service) == [False, True]  # status lists c1's bank as past retention
    with bootstrap(home_settings(tmp_path)) as service:
        assert service.retain == 5
        assert service.assess("run-1", ResumeRequest(checkpoint=C1)).decision.rule == "K6"
        assert kept_flags(service) == [True, True]
    with pytest.raises(InvalidCheckpoint):
        ScratchService(InMemoryTimeline(), InMemoryBankStore(), retain=0)


def test_K8_K7_the_runner_decides_with_its_own_retention_setting(tmp_path: Path) -> None:
    """The runner prunes with SCRATCHBANK_RETAIN, so its gate reads the same: retain 1 refuses K7."""
    from runner_rigs import RecordingInbound, make_rig

    from scratchbank.application.ports import ResumeDelivery
    from scratchbank.application.runner import Handled, RunnerSettings

    timeline = InMemoryTimeline()
    timeline.append("run-1", checkpoints_run()[:-1])
    rig = make_rig(tmp_path, timeline)
    queued = ScratchService(timeline, InMemoryBankStore(), clock=ManualClock(), queue=rig.queue).queue_resume(
        "run-1", ResumeRequest(checkpoint=C1), attempt="a1"
    )
    assert queued.attempt == "a1"  # the surface (retain 5) judged K6 and published
    runner = attrs.evolve(rig.runner(), settings=RunnerSettings("runner-a", retain=1))
    handling = runner.handle(RecordingInbound(ResumeDelivery("run-1", "a1", Consents(), checkpoint=C1)))
    assert handling.handled is Handled.REFUSED
    assert handling.decision is not None and handling.decision.rule == "K7"


def test_P10_K8_the_cli_names_a_bad_retention_setting_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`scratchbank status` with SCRATCHBANK_RETAIN=65: exit 2, CONFIG_INVALID naming it; nothing opened."""
    from scratchbank.adapters.cli import main

    monkeypatch.setenv("SCRATCHBANK_HOME", str(tmp_path))
    monkeypatch.setenv("SCRATCHBANK_RETAIN", "65")
    assert main(["status", "run-1"]) == 2
    err = capsys.readouterr().err
    assert "CONFIG_INVALID" in err and "SCRATCHBANK_RETAIN" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no timeline was created
