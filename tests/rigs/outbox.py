"""The outbox: queued attempts, listings, lost publications and a queue that is down.

First written for tests/rules/test_L_engines.py: The outbox (L4, issue #19): no run left queued for
ever."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from runner_rigs import RunnerRig, make_rig, queue_resume

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.inprocess import InProcessLease, InProcessQueue
from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.domain.errors import LeaseLost
from scratchbank.domain.records import AttemptQueued, Record, RunStarted
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


class DownQueue(InProcessQueue):
    """A queue whose publications fail (the server went away after ``attempt_queued``)."""

    def publish(self, delivery: object) -> bool:
        from scratchbank.domain.errors import QueueUnavailable

        raise QueueUnavailable("the server went away (test)")
