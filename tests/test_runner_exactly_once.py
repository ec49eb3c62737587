"""The runner and the queue, exactly once (issue #19): a claim whose reply was lost keeps
its consent (C4), one queueing path at the judged version (C5, C6), every lost append
settled by reading.

Real parts: local sandboxes, banks on disk, the reference engine, the in-process queue
and lease, an in-memory timeline; a fault is a timeline that loses the reply of one
chosen append (after it committed, or before).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from nats_server import nats_url  # noqa: F401 - a fixture
from runner_rigs import ACCEPT, checksum, make_rig, queue_resume

import scratchbank.application.runner as runner_module
from scratchbank.adapters.inprocess import InProcessQueue
from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.application.ports import Timeline
from scratchbank.application.runner import Handled
from scratchbank.application.service import ScratchService
from scratchbank.domain.errors import TimelineConflict, TimelineWriteFailed
from scratchbank.domain.records import (
    AttemptClaimed,
    AttemptQueued,
    Record,
    ResumeRefused,
    RunStarted,
    ScratchBanked,
    ScratchRestored,
)
from scratchbank.domain.resume_gate import ResumeRequest

RUN = "run-1"
UNBANKED = ScratchBanked(banked=False, empty=False, unknown=False, bytes=0, reason="tar failed")


class LosesReply(InMemoryTimeline):
    """A timeline that loses the reply of the first append holding a ``kind``: it commits
    it first (``landed``) or not, then raises TimelineWriteFailed as a cut connection would.
    Over ``inner`` (a real store) when given, else in memory."""

    def __init__(self, kind: type[Record], *, landed: bool, inner: Timeline | None = None) -> None:
        super().__init__()
        self.kind, self.landed, self.fired, self.inner = kind, landed, False, inner

    def read(self, run_id: str) -> Sequence[Record]:
        return super().read(run_id) if self.inner is None else self.inner.read(run_id)

    def _append(self, run_id: str, records: Sequence[Record], expected: int | None) -> int:
        if self.inner is None:
            return super().append(run_id, records, expected=expected)
        return self.inner.append(run_id, records, expected=expected)

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        if not self.fired and any(isinstance(r, self.kind) for r in records):
            self.fired = True
            if self.landed:
                self._append(run_id, records, expected)
            raise TimelineWriteFailed(f"run {run_id}: the connection was cut before the reply")
        return self._append(run_id, records, expected)


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_under(request: pytest.FixtureRequest) -> Iterator[Timeline | None]:
    """The timeline the replies are lost over: in memory, or a PostgreSQL database of its own."""
    if request.param == "memory":
        yield None
        return
    from test_runner_outbox import fresh_postgres

    from scratchbank.adapters.event_store import EventStoreTimeline

    timeline = EventStoreTimeline(fresh_postgres(request.getfixturevalue("postgres_url")))
    try:
        yield timeline
    finally:
        timeline.close()


def test_C4_a_claim_whose_reply_was_lost_keeps_its_consent(
    tmp_path: Path, store_under: Timeline | None
) -> None:
    """The claim committed but its reply was lost: read, found ours, carried on with the delivery's
    consent (the loss accepted), never refused R2 and never left `running` with nobody on it."""
    tl = LosesReply(AttemptClaimed, landed=True, inner=store_under)
    rig = make_rig(tmp_path, tl)
    tl.append(RUN, [RunStarted(), UNBANKED])
    queue_resume(tl, rig.queue, RUN, "a1", ACCEPT)
    handled = rig.runner().run_once(1)
    assert tl.fired
    assert handled is not None and handled.handled is Handled.RAN, handled and handled.detail
    records = tl.read(RUN)
    assert [r.attempt for r in records if isinstance(r, AttemptClaimed)] == ["a1"]
    assert not [r for r in records if isinstance(r, ResumeRefused)]
    accepted = [r for r in records if isinstance(r, ScratchRestored)]
    assert accepted and accepted[0].accepted


def test_C4_a_claim_that_did_not_land_is_claimed_again_with_its_consent(
    tmp_path: Path, store_under: Timeline | None
) -> None:
    """The claim's write failed before it committed: nothing landed, the delivery comes back and
    claims with its consent (the records say the run is still queued for it)."""
    tl = LosesReply(AttemptClaimed, landed=False, inner=store_under)
    rig = make_rig(tmp_path, tl)
    tl.append(RUN, [RunStarted(), UNBANKED])
    queue_resume(tl, rig.queue, RUN, "a1", ACCEPT)
    runner = rig.runner()
    first = runner.run_once(1)
    assert first is not None and first.handled is Handled.REDELIVER, first.detail
    assert not [r for r in tl.read(RUN) if isinstance(r, AttemptClaimed)]
    second = runner.run_once(5)
    assert second is not None and second.handled is Handled.RAN, second.detail
    accepted = [r for r in tl.read(RUN) if isinstance(r, ScratchRestored)]
    assert accepted and accepted[0].accepted


def test_C6_one_queueing_path_the_runner_keeps_no_copy() -> None:
    """Queueing is the service's alone (at the judged version): the runner has no queue_resume."""
    assert not hasattr(runner_module, "queue_resume")


class MovesBeforeQueue(InMemoryTimeline):
    """Another writer (a resume's claim) appends just before the first attempt_queued."""

    def __init__(self, theirs: Sequence[Record]) -> None:
        super().__init__()
        self.theirs, self.fired = list(theirs), False

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        if not self.fired and any(isinstance(r, AttemptQueued) for r in records):
            self.fired = True
            super().append(run_id, self.theirs)
        return super().append(run_id, records, expected=expected)


def test_C6_a_queue_judged_before_a_resume_claimed_queues_nothing() -> None:
    """The run moved between the surface's judgement and its queueing: TimelineConflict,
    nothing queued, nothing published; the resume that won keeps its records."""
    from scratchbank.domain.records import RunResumed

    tl = MovesBeforeQueue([RunResumed(attempt="other")])
    tl.append(RUN, [RunStarted()])
    queue = InProcessQueue()
    service = ScratchService(tl, InMemoryBankStore(), queue=queue)
    with pytest.raises(TimelineConflict):
        service.queue_resume(RUN, ResumeRequest(), attempt="a1")
    assert [r.WIRE for r in tl.read(RUN)] == ["run_started", "run_resumed"]
    assert queue.fetch(0.01) is None


def test_C5_an_attempt_queued_whose_reply_was_lost_is_settled_by_reading_and_published() -> None:
    """attempt_queued committed but its reply was lost: read, found ours, published once."""
    tl = LosesReply(AttemptQueued, landed=True)
    tl.append(RUN, [RunStarted()])
    queue = InProcessQueue()
    service = ScratchService(tl, InMemoryBankStore(), queue=queue)
    queued = service.queue_resume(RUN, ResumeRequest(), attempt="a1")
    assert tl.fired and queued.attempt == "a1"
    inbound = queue.fetch(0.01)
    assert inbound is not None and inbound.delivery.attempt == "a1"
    assert [r.WIRE for r in tl.read(RUN)] == ["run_started", "attempt_queued"]


def test_C5_a_reused_attempt_id_is_refused_by_name_and_changes_nothing() -> None:
    """A caller-supplied attempt id this run was already queued for: ATTEMPT_REUSED, nothing
    written, nothing published (the stream would de-duplicate it silently)."""
    from scratchbank.domain.errors import AttemptReused

    tl = InMemoryTimeline()
    tl.append(RUN, [RunStarted()])
    queue = InProcessQueue()
    service = ScratchService(tl, InMemoryBankStore(), queue=queue)
    service.queue_resume(RUN, ResumeRequest(), attempt="a1")
    assert queue.fetch(0.01) is not None
    before = checksum(tl, RUN)
    with pytest.raises(AttemptReused) as refused:
        service.queue_resume(RUN, ResumeRequest(), attempt="a1")
    assert refused.value.code == "ATTEMPT_REUSED"
    assert checksum(tl, RUN) == before and queue.fetch(0.01) is None


# --- hole 3: the token rides the store writes -----------------------------------------------


class OvertakenAfterRead(InMemoryTimeline):
    """Once armed, a newer holder (token 2) writes right after this holder's next read."""

    armed = False

    def read(self, run_id: str) -> Sequence[Record]:
        from scratchbank.domain.records import LeaseTaken

        records = super().read(run_id)
        if self.armed:
            self.armed = False
            super().append(run_id, [LeaseTaken(holder="runner-b", token=2, attempt="a1")])
        return records


def test_L5_a_holder_fenced_mid_teardown_changes_nothing_in_the_store(tmp_path: Path) -> None:
    """A newer holder took the run right after this holder's teardown read it: the finished
    run's drop (T5) is refused FENCED before it reaches the store; the bank the newer
    holder reads is still there, and nothing of this holder lands after its token."""
    from scratchbank.adapters.memory import FakeSandbox
    from scratchbank.application.fencing import FencedBankStore, FencedTimeline, Token
    from scratchbank.application.teardown import bank_at_teardown
    from scratchbank.domain.errors import Fenced
    from scratchbank.testing.clocks import ManualClock

    tl = OvertakenAfterRead()
    store = InMemoryBankStore()
    (tmp_path / "bank").write_bytes(b"a bank")
    sha = hashlib.sha256(b"a bank").hexdigest()
    name = store.put(RUN, tmp_path / "bank", sha256=sha)
    banked = ScratchBanked(banked=True, empty=False, unknown=False, bytes=6, sha256=sha, object=name)
    tl.append(RUN, [RunStarted(), banked, AttemptQueued(attempt="a1"), AttemptClaimed(attempt="a1")])
    fenced = FencedTimeline(tl, RUN, Token("runner-a", 1, "a1"))
    fenced.announce()
    tl.armed = True
    with pytest.raises(Fenced):
        bank_at_teardown(
            RUN,
            timeline=fenced,
            store=FencedBankStore(store, fenced),
            sandbox=FakeSandbox({"./notes.txt": b"scratch"}),
            run_finished=True,
            clock=ManualClock(),
        )
    assert store.stat(RUN, name) is not None
    assert [r.WIRE for r in tl.read(RUN)][-1] == "lease_taken"


# --- hole 5: a resume under a lease honours the lease's cancel ------------------------------


class LosableLease:
    """An in-process lease whose refreshes fail once ``lose()`` is called (the lease taken)."""

    def __init__(self) -> None:
        from scratchbank.adapters.inprocess import InProcessLease

        self.inner = InProcessLease(lapse=30.0)
        self.lost = threading.Event()
        self.released = threading.Event()

    def acquire(self, run_id: str, holder: str) -> object:
        return self.inner.acquire(run_id, holder)

    def refresh(self, grant: object) -> object:
        from scratchbank.domain.errors import LeaseLost

        if self.lost.is_set():
            raise LeaseLost("taken by another runner (test)")
        return self.inner.refresh(grant)  # type: ignore[arg-type]

    def release(self, grant: object) -> None:
        self.released.set()
        self.inner.release(grant)  # type: ignore[arg-type]

    def lose(self) -> None:
        self.lost.set()


class LosesLeaseMidFetch:
    """A bank store whose fetch hands over a first chunk, then the lease is lost (the keeper
    cuts the run context and lets go), then the rest."""

    def __init__(self, inner: object, lease: LosableLease) -> None:
        self.inner, self.lease = inner, lease
        self.keeps_banks = True

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def fetch(
        self, run_id: str, dest: object, *, max_bytes: int, name: str | None = None, deadline: object = None
    ) -> object:
        import io

        buffer = io.BytesIO()
        stored = self.inner.fetch(run_id, buffer, max_bytes=max_bytes, name=name)  # type: ignore[attr-defined]
        data = buffer.getvalue()
        dest.write(data[:512])  # type: ignore[attr-defined]
        self.lease.lose()
        assert self.lease.released.wait(10), "the keeper did not let the lease go"
        for i in range(512, len(data), 512):
            dest.write(data[i : i + 512])  # type: ignore[attr-defined]
        return stored


def test_L5_a_holder_that_loses_its_lease_mid_restore_stops_it_at_once(tmp_path: Path) -> None:
    """The lease is lost while the bank streams in: the restore stops (nothing committed into
    the scratch), its record names LEASE_LOST (X5: read again), no node runs, the delivery is
    left for the next holder (not acked)."""
    from runner_rigs import RecordingInbound

    from scratchbank.domain.records import NodeFinished

    tl = InMemoryTimeline()
    rig = make_rig(tmp_path, tl)
    tl.append(RUN, [RunStarted()])
    queue_resume(tl, rig.queue, RUN, "a1")
    first = rig.runner().run_once(1)
    assert first is not None and first.handled is Handled.RAN, first.detail
    nodes_before = sum(isinstance(r, NodeFinished) for r in tl.read(RUN))
    lease = LosableLease()
    rig.lease = lease  # type: ignore[assignment]
    rig.store = LosesLeaseMidFetch(rig.store, lease)  # type: ignore[assignment]
    queue_resume(tl, rig.queue, RUN, "a2")
    fetched = rig.queue.fetch(1)
    assert fetched is not None
    inbound = RecordingInbound(fetched.delivery)
    handled = rig.runner().handle(inbound)
    assert handled.handled is Handled.LET_GO, handled.detail
    assert not inbound.acked
    records = tl.read(RUN)
    restores = [r for r in records if isinstance(r, ScratchRestored)]
    assert restores and not restores[-1].restored and "LEASE_LOST" in restores[-1].reason
    assert sum(isinstance(r, NodeFinished) for r in records) == nodes_before  # the engine never ran


# --- hole 3: the lease expires by the NATS server's clock -----------------------------------


@pytest.mark.parametrize("skew", [90.0, -90.0])
def test_L1_a_runner_whose_clock_is_off_by_90_s_cannot_take_a_held_lease(
    nats_url: str,  # noqa: F811 - the fixture
    skew: float,
) -> None:
    """The holder refreshes on time; a runner whose clock is 90 s ahead (or behind) is refused
    while the lease lives: expiry is the server's (the bucket's TTL), never a runner's clock."""
    from nats_server import namespace

    from scratchbank.adapters.nats_queue import NatsConnection, NatsKvLease
    from scratchbank.testing.clocks import ManualClock

    ns = namespace()
    conn_a, conn_b = NatsConnection(nats_url), NatsConnection(nats_url)
    try:
        holder_clock, skewed_clock = ManualClock(), ManualClock()
        skewed_clock.advance(skew)
        a = NatsKvLease(conn_a, lapse=5.0, namespace=ns, clock=holder_clock)
        b = NatsKvLease(conn_b, lapse=5.0, namespace=ns, clock=skewed_clock)
        held = a.acquire(RUN, "runner-a")
        assert held is not None
        assert b.acquire(RUN, "runner-b") is None
        held = a.refresh(held)  # on time
        assert b.acquire(RUN, "runner-b") is None
        a.release(held)
        taken = b.acquire(RUN, "runner-b")
        assert taken is not None and taken.token > held.token
    finally:
        conn_a.close()
        conn_b.close()
