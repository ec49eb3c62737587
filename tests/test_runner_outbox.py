"""The outbox (L4, issue #19): no run left queued for ever.

The timeline lists the runs queued and unclaimed past a cutoff (SQLite and PostgreSQL);
a sweeper takes them only under the sweeper's lease (one at a time across runners),
republishing or parking each with its record.

Real parts: the event store on SQLite files and on a PostgreSQL database of the test's
own; in-process queue and lease for the sweeper's rules; manual clocks.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from runner_rigs import RunnerRig, checksum, delivery_actor, make_rig, queue_resume, sweeper_actor

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.inprocess import InProcessLease, InProcessQueue
from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.orphans import SWEEPER_KEY, Sweeper
from scratchbank.application.runner import Handled
from scratchbank.domain.errors import LeaseLost
from scratchbank.domain.records import AttemptClaimed, AttemptQueued, OrphanSwept, Record, RunStarted
from scratchbank.testing.clocks import ManualClock

T0 = ManualClock.EPOCH
HOUR = timedelta(hours=1)


def fresh_postgres(postgres_url: str) -> str:
    """A database of this test's own on the shared server (the listing reads every run)."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres_url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EventStoreTimeline]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/timeline.db"
    else:
        url = fresh_postgres(request.getfixturevalue("postgres_url"))
    timeline = EventStoreTimeline(url)
    try:
        yield timeline
    finally:
        timeline.close()


def _queued(at: datetime, attempt: str = "a1") -> AttemptQueued:
    return AttemptQueued(at=at, attempt=attempt)


def test_L4_the_timeline_lists_runs_queued_and_unclaimed_past_the_cutoff(store: EventStoreTimeline) -> None:
    """Listed: queued (or republished) at or before the cutoff and not claimed since. Not listed:
    claimed, parked, queued after the cutoff, never queued."""
    store.append("run-old", [RunStarted(), _queued(T0)])
    store.append("run-claimed", [RunStarted(), _queued(T0), AttemptClaimed(attempt="a1")])
    store.append("run-new", [RunStarted(), _queued(T0 + 2 * HOUR)])
    parked = OrphanSwept(at=T0, attempt="a1", parked=True, reason="unclaimed")
    store.append("run-parked", [RunStarted(), _queued(T0), parked])
    again = OrphanSwept(at=T0 + 2 * HOUR, attempt="a1", parked=False, reason="unclaimed")
    store.append("run-republished", [RunStarted(), _queued(T0), again])
    requeued = [RunStarted(), _queued(T0 - HOUR), AttemptClaimed(attempt="a1"), _queued(T0, "a2")]
    store.append("run-requeued", requeued)
    store.append("run-never", [RunStarted()])
    assert store.queued_unclaimed(T0 + HOUR) == ["run-old", "run-requeued"]
    assert store.queued_unclaimed(T0 + 3 * HOUR) == ["run-new", "run-old", "run-republished", "run-requeued"]
    assert store.queued_unclaimed(T0 - 2 * HOUR) == []


class Listing:
    """The outbox of an in-memory timeline (every run it was told of)."""

    def __init__(self, runs: Sequence[str]) -> None:
        self.runs = list(runs)
        self.asked = 0

    def queued_unclaimed(self, before: datetime) -> Sequence[str]:
        self.asked += 1
        return self.runs


def _orphans(tl: InMemoryTimeline, n: int) -> list[str]:
    runs = [f"run-{i}" for i in range(n)]
    for run in runs:
        tl.append(run, [RunStarted(), _queued(T0)])
    return runs


def test_L4_one_sweeper_at_a_time_the_other_changes_nothing() -> None:
    """While one runner holds the sweeper's lease, another's sweep looks at nothing."""
    tl, queue, lease, clock = InMemoryTimeline(), InProcessQueue(), InProcessLease(lapse=60.0), ManualClock()
    runs = _orphans(tl, 3)
    clock.advance(4 * HOUR.total_seconds())
    held = lease.acquire(SWEEPER_KEY, "runner-a")
    assert held is not None
    listing = Listing(runs)
    before = [checksum(tl, r) for r in runs]
    b = Sweeper(lease, listing, tl, queue, "runner-b", cutoff=600.0, clock=clock).sweep_once()
    assert not b.held and listing.asked == 0
    assert [checksum(tl, r) for r in runs] == before and queue.fetch(0.01) is None
    lease.release(held)
    a = Sweeper(lease, listing, tl, queue, "runner-a", cutoff=600.0, clock=clock).sweep_once()
    assert a.held and [s.acted for s in a.swept] == [True, True, True]
    assert all(isinstance(tl.read(r)[-1], OrphanSwept) for r in runs)


class LosesAfter:
    """A lease whose refreshes fail after ``n`` of them (another sweeper took it)."""

    def __init__(self, n: int) -> None:
        self.inner, self.n = InProcessLease(lapse=60.0), n

    def acquire(self, run_id: str, holder: str) -> object:
        return self.inner.acquire(run_id, holder)

    def refresh(self, grant: object) -> object:
        if self.n == 0:
            raise LeaseLost("taken (test)")
        self.n -= 1
        return self.inner.refresh(grant)  # type: ignore[arg-type]

    def release(self, grant: object) -> None:
        self.inner.release(grant)  # type: ignore[arg-type]


def test_L4_a_sweeper_that_loses_its_lease_stops_sweeping() -> None:
    """The lease is refreshed before each run: once lost, no further run is swept."""
    tl, queue, clock = InMemoryTimeline(), InProcessQueue(), ManualClock()
    runs = _orphans(tl, 4)
    clock.advance(4 * HOUR.total_seconds())
    report = Sweeper(
        LosesAfter(2), Listing(runs), tl, queue, "runner-a", cutoff=600.0, clock=clock
    ).sweep_once()  # type: ignore[arg-type]
    assert report.held and len(report.swept) == 2 and "LEASE_LOST" in report.detail
    assert [isinstance(tl.read(r)[-1], OrphanSwept) for r in runs] == [True, True, False, False]


# --- a runner delivery and a sweep as actors, at the two interleavings that matter ----------


class RunsFirst(InMemoryTimeline):
    """Before the first append holding a ``kind``, another actor runs to its end."""

    def __init__(self, kind: type, actor: list[Callable[[], object]]) -> None:
        super().__init__()
        self.kind, self.actor, self.fired = kind, actor, False

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        if not self.fired and self.actor and any(isinstance(r, self.kind) for r in records):
            self.fired = True
            self.actor[0]()
        return super().append(run_id, records, expected=expected)


def _rig_with_lost_publication(tmp_path: Path, tl: InMemoryTimeline, clock: ManualClock) -> RunnerRig:
    rig = make_rig(tmp_path, tl)
    tl.append("run-1", [RunStarted()])
    queue_resume(tl, rig.queue, "run-1", "a1", clock=clock)
    lost = rig.queue.fetch(1)
    assert lost is not None
    lost.ack()  # its deliveries gave up (L4) or it was never published
    clock.advance(4 * HOUR.total_seconds())
    return rig


def test_L4_C7_a_delivery_that_claims_between_the_sweepers_read_and_write_wins(tmp_path: Path) -> None:
    """The sweeper read the run queued; a runner claims and carries it on; the sweeper's record
    conflicts: it writes and publishes nothing, and the run was claimed once."""
    clock, actor = ManualClock(), []  # type: ignore[var-annotated]
    tl = RunsFirst(OrphanSwept, actor)
    rig = _rig_with_lost_publication(tmp_path, tl, clock)
    actor.append(delivery_actor(rig, "run-1", "a1"))
    report = sweeper_actor(tl, rig.queue, InProcessLease(), Listing(["run-1"]), cutoff=600.0, clock=clock)()
    assert report.held and [s.acted for s in report.swept] == [False]
    records = tl.read("run-1")
    assert [r.attempt for r in records if isinstance(r, AttemptClaimed)] == ["a1"]
    assert not [r for r in records if isinstance(r, OrphanSwept)]
    assert rig.queue.fetch(0.05) is None  # nothing republished


def test_L4_C7_a_sweep_between_a_deliverys_admission_and_its_claim_claims_once(tmp_path: Path) -> None:
    """A runner admitted the delivery; the sweeper republishes before its claim lands: the claim
    conflicts and is read again (redelivered); the republication claims; the run is claimed once
    and every later delivery of the attempt applies nothing."""
    clock, actor = ManualClock(), []  # type: ignore[var-annotated]
    tl = RunsFirst(AttemptClaimed, actor)
    rig = _rig_with_lost_publication(tmp_path, tl, clock)
    actor.append(
        sweeper_actor(tl, rig.queue, InProcessLease(), Listing(["run-1"]), cutoff=600.0, clock=clock)
    )
    first = delivery_actor(rig, "run-1", "a1")()
    assert first.handled is Handled.REDELIVER, first.detail
    republished = rig.runner().run_once(1)
    assert republished is not None and republished.handled is Handled.RAN, republished.detail
    assert republished.delivery.republished == 1
    late = delivery_actor(rig, "run-1", "a1")()
    assert late.handled is Handled.DONE, late.detail
    records = tl.read("run-1")
    assert [r.attempt for r in records if isinstance(r, AttemptClaimed)] == ["a1"]
    assert [r.parked for r in records if isinstance(r, OrphanSwept)] == [False]


class DownQueue(InProcessQueue):
    """A queue whose publications fail (the server went away after ``attempt_queued``)."""

    def publish(self, delivery: object) -> bool:
        from scratchbank.domain.errors import QueueUnavailable

        raise QueueUnavailable("the server went away (test)")


def test_L4_a_run_whose_publication_failed_is_found_by_the_outbox_and_carried_on(tmp_path: Path) -> None:
    """queue_resume appended attempt_queued, then its publication failed (QUEUE_UNAVAILABLE): the
    timeline lists the run past the cutoff, the sweeper publishes it again, a runner claims it."""
    from scratchbank.adapters.memory import InMemoryBankStore
    from scratchbank.application.service import ScratchService
    from scratchbank.domain.errors import QueueUnavailable
    from scratchbank.domain.resume_gate import ResumeRequest

    clock = ManualClock()
    tl = EventStoreTimeline(f"sqlite:///{tmp_path}/timeline.db")
    try:
        tl.append("run-1", [RunStarted()])
        down = ScratchService(tl, InMemoryBankStore(), clock=clock, queue=DownQueue())
        with pytest.raises(QueueUnavailable):
            down.queue_resume("run-1", ResumeRequest(), attempt="a1")
        rig = make_rig(tmp_path, tl)
        assert tl.queued_unclaimed(clock.now()) == ["run-1"]
        clock.advance(600.0)
        report = sweeper_actor(tl, rig.queue, InProcessLease(), tl, cutoff=600.0, clock=clock)()
        assert [s.acted for s in report.swept] == [True]
        handled = rig.runner().run_once(1)
        assert handled is not None and handled.handled is Handled.RAN, handled.detail
        assert [r.attempt for r in tl.read("run-1") if isinstance(r, AttemptClaimed)] == ["a1"]
        assert tl.queued_unclaimed(clock.now()) == []
    finally:
        tl.close()
