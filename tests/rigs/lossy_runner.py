"""The runner's lost replies: timelines that lose a reply, move before a queue or are overtaken, and
leases that are lost.

First written for tests/rules/test_[CL]*.py: The runner and the queue, exactly once (issue #19): a
claim whose reply was lost keeps its consent (C4), one queueing path at the judged version (C5, C6),
every lost append settled by reading."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest
from nats_server import nats_url  # noqa: F401 - a fixture

from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.ports import Timeline
from scratchbank.domain.errors import TimelineWriteFailed
from scratchbank.domain.records import (
    AttemptQueued,
    Record,
    ScratchBanked,
)

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
    from rigs.outbox import fresh_postgres
    from scratchbank.adapters.event_store import EventStoreTimeline

    timeline = EventStoreTimeline(fresh_postgres(request.getfixturevalue("postgres_url")))
    try:
        yield timeline
    finally:
        timeline.close()


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
