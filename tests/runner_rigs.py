"""A runner on real parts for the tests: local sandboxes, file banks, a timeline, a queue, a lease."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.inprocess import InProcessLease, InProcessQueue
from scratchbank.adapters.memory import InMemoryBankStore
from scratchbank.adapters.reference_engine import Node, ReferenceEngine
from scratchbank.adapters.sandbox_provider import LocalSandboxProvider
from scratchbank.application.orphans import Sweeper, SweepReport
from scratchbank.application.ports import (
    BankStore,
    Clock,
    DeliveryQueue,
    Lease,
    OutboxListing,
    ResumeDelivery,
    SystemClock,
    Timeline,
)
from scratchbank.application.runner import Handling, Runner, RunnerSettings, Verdicts
from scratchbank.application.service import ScratchService
from scratchbank.domain.admission import Consents
from scratchbank.domain.lease import LeaseTiming
from scratchbank.domain.records import Record
from scratchbank.domain.resume_gate import ResumeDecision, ResumeRequest
from scratchbank.domain.wire import encode

#: A workflow that writes its scratch, parks at a human gate, then reads what it wrote.
STORY = (
    Node("clone", "tool", "mkdir -p clone && echo 'a source clone' > clone/README.md"),
    Node("review", "human"),
    Node("measure", "agent", "test -f clone/README.md && echo measured > measure.txt"),
)


def checksum(timeline: Timeline, run_id: str) -> str:
    """The timeline's records, hashed: a refusal must leave it unchanged."""
    wire = [encode(r) for r in timeline.read(run_id)]
    return hashlib.sha256(json.dumps(wire, sort_keys=True, default=str).encode()).hexdigest()


def types(records: Sequence[Record]) -> list[str]:
    return [r.WIRE for r in records]


@attrs.define
class RecordingInbound:
    """An Inbound that remembers how it was settled (for rules about acks and delays)."""

    delivery: ResumeDelivery
    deliveries: int = 1
    acked: bool = False
    naks: list[float] = attrs.Factory(list)
    progress: int = 0

    def ack(self) -> None:
        self.acked = True

    def nak(self, delay: float) -> None:
        self.naks.append(delay)

    def in_progress(self) -> None:
        self.progress += 1


@attrs.define
class RunnerRig:
    timeline: Timeline
    store: BankStore
    queue: DeliveryQueue
    lease: Lease
    provider: LocalSandboxProvider
    engine: ReferenceEngine
    verdicts: Verdicts

    def runner(self, holder: str = "runner-a", timing: LeaseTiming | None = None) -> Runner:
        settings = RunnerSettings(holder, timing=timing or LeaseTiming(interval=0.2, lapse=2.0))
        return Runner(
            self.queue,
            self.lease,
            self.timeline,
            self.store,
            self.provider,
            self.engine,
            settings,
            self.verdicts,
        )


def make_rig(
    tmp: Path,
    timeline: Timeline,
    *,
    workflow: tuple[Node, ...] = STORY,
    queue: DeliveryQueue | None = None,
    lease: Lease | None = None,
) -> RunnerRig:
    return RunnerRig(
        timeline,
        FilesystemBankStore(tmp / "banks"),
        queue or InProcessQueue(ack_wait=5.0),
        lease or InProcessLease(lapse=2.0),
        LocalSandboxProvider(tmp / "sandboxes"),
        ReferenceEngine(workflow, timeline),
        Verdicts(),
    )


ACCEPT = Consents(accept_scratch_loss=True)


def queue_resume(
    timeline: Timeline,
    queue: DeliveryQueue,
    run_id: str,
    attempt: str,
    consents: Consents = Consents(),
    *,
    source_changed: bool = False,
    clock: Clock | None = None,
) -> tuple[ResumeDecision, ResumeDelivery | None]:
    """The one queueing path (the service's, C5, C6): judged as a surface, queued at the
    version judged, published; the delivery it published, or None when it refused."""
    service = ScratchService(timeline, InMemoryBankStore(), clock=clock or SystemClock(), queue=queue)
    request = ResumeRequest(consents=consents, source_changed=source_changed)
    queued = service.queue_resume(run_id, request, attempt=attempt)
    if queued.attempt is None:
        return queued.decision, None
    return queued.decision, ResumeDelivery(run_id, queued.attempt, consents)


# --- actors for the interleaving explorer (issue 18): plain callables over ports -------------


def delivery_actor(
    rig: RunnerRig, run_id: str, attempt: str, consents: Consents = Consents(), holder: str = "runner-a"
) -> Callable[[], Handling]:
    """One runner delivery, handled start to end: every port call it makes (the timeline,
    the bank store, the lease, the sandbox) is a pause point for a scheduler that wraps
    the rig's ports; its Handling is what it came to."""
    runner = rig.runner(holder)

    def act() -> Handling:
        return runner.handle(RecordingInbound(ResumeDelivery(run_id, attempt, consents)))

    return act


def sweeper_actor(
    timeline: Timeline,
    queue: DeliveryQueue,
    lease: Lease,
    listing: OutboxListing,
    *,
    cutoff: float,
    clock: Clock,
    holder: str = "sweeper",
) -> Callable[[], SweepReport]:
    """One sweep under the sweeper's lease (the runner process runs it on a schedule)."""
    return Sweeper(lease, listing, timeline, queue, holder, cutoff=cutoff, clock=clock).sweep_once
