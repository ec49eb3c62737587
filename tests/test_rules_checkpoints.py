"""Checkpoint stamps (ADR 0013): staleness read from the checkpoint itself (N1, N2, K1-K5)."""

from __future__ import annotations

import attrs
import pytest
from rigs.checkpoint_stamps import ACCEPT, C1, C2, C3, C4, bank_at, checkpoints_run, stamped

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.resume import resume
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import Consents, ResumeRequest, decide_resume, fold
from scratchbank.domain.checkpoints import Checkpoint, Position, compare
from scratchbank.domain.errors import InvalidCheckpoint, TimelineUnreadable
from scratchbank.domain.records import Record, ScratchRestored
from scratchbank.domain.snapshot import state_from_data, state_to_data
from scratchbank.domain.wire import decode, encode
from scratchbank.testing.builders import banked, node, resumed, started
from scratchbank.testing.clocks import ManualClock


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
