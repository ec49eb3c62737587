"""Timelines whose restore record fails to land, a parked run and a timeline held busy.

First written for tests/test_load_without_lies.py: Issue 26: load without lies. A report says
``recorded`` only for a record known to have landed; a busy timeline waits for a call slot and is
never read as unreadable (R15)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain.errors import TimelineWriteFailed
from scratchbank.domain.records import Record, ScratchRestored
from scratchbank.testing.builders import node, started

FILES = {"verify.sh": b"#!/bin/sh\n", "clone/README": b"docs"}


class RestoreRecordFails(InMemoryTimeline):
    """Every append of a ``scratch_restored`` fails; ``lands`` says whether it landed anyway
    (a reply lost on the way back) or not at all (a lost append)."""

    def __init__(self, *, lands: bool) -> None:
        super().__init__()
        self.lands = lands

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        if any(isinstance(r, ScratchRestored) for r in records):
            if self.lands:
                super().append(run_id, records, expected=expected)
            raise TimelineWriteFailed("the store went away (injected)")
        return super().append(run_id, records, expected=expected)


def parked(timeline: InMemoryTimeline) -> InMemoryBankStore:
    store = InMemoryBankStore()
    timeline.append("run-1", [started(), node("clone", "tool")])
    report = bank_at_teardown(
        "run-1", timeline=timeline, store=store, sandbox=FakeSandbox(dict(FILES)), run_finished=False
    )
    assert report.recorded
    return store


def restored_records(timeline: InMemoryTimeline) -> list[Record]:
    return [r for r in timeline.read("run-1") if isinstance(r, ScratchRestored)]


N = 200


def held(tmp_path: Path) -> tuple[EventStoreTimeline, tuple[Record, ...]]:
    """A timeline whose only call slot another caller holds; its own line bound is long."""
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db", in_flight=1, wait_seconds=5.0)
    timeline.append("run-1", [started()])
    before = tuple(timeline.read("run-1"))
    assert timeline._slots.acquire(1.0) == ""
    return timeline, before
