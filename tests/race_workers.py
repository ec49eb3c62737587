"""Worker processes for the race tests: each one a resume or a teardown, as an engine's
process would run it, on the real timeline store (SQLite file or PostgreSQL) and a
filesystem bank store shared by all.

Every racer's first append waits at a barrier shared by all the racers of a round:
all of them have read the run and decided before any of them writes, which is the
race two resumes "started together" run, made certain instead of likely.
"""

from __future__ import annotations

import multiprocessing.queues
import threading
import traceback
from collections.abc import Sequence
from typing import Any

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.memory import FakeSandbox
from scratchbank.application.resume import resume
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import Consents, ResumeRequest
from scratchbank.domain.errors import ResumeSuperseded
from scratchbank.domain.records import Record

FILES = {"verify.sh": b"#!/bin/sh\nexit 0\n", "clone/README": b"docs"}


class BarrierTimeline(EventStoreTimeline):
    """The real store; the first append waits until every racer of the round is there."""

    def __init__(self, url: str, barrier: Any) -> None:
        super().__init__(url)
        self.barrier = barrier
        self._waited = threading.Event()

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        if not self._waited.is_set():
            self._waited.set()
            self.barrier.wait(timeout=60)
        return super().append(run_id, records, expected=expected)


def race_one(task: dict[str, Any]) -> dict[str, Any]:
    timeline = BarrierTimeline(task["url"], task["barrier"])
    store = FilesystemBankStore(task["banks"])
    try:
        if task["role"] == "teardown":
            report = bank_at_teardown(
                task["run"],
                timeline=timeline,
                store=store,
                sandbox=FakeSandbox(dict(FILES)),
                run_finished=False,
            )
            return {"role": "teardown", "result": "recorded" if report.recorded else "lost"}
        box = FakeSandbox({})
        request = ResumeRequest(consents=Consents())
        try:
            out = resume(task["run"], request, timeline=timeline, store=store, sandbox=box)
        except ResumeSuperseded:
            return {"role": "resume", "result": "superseded", "files": box.files}
        restored = out.restore is not None and out.restore.record.restored
        return {"role": "resume", "result": "restored" if restored else "went on", "files": box.files}
    except Exception:  # reported to the parent, which fails the test with it
        return {"role": task["role"], "result": "error", "error": traceback.format_exc()}
    finally:
        timeline.close()


def serve(tasks: multiprocessing.queues.Queue[Any], results: multiprocessing.queues.Queue[Any]) -> None:
    """A long-lived racer: one process serves every round (spawning costs ~1 s each)."""
    while (task := tasks.get()) is not None:
        results.put(race_one(task))
