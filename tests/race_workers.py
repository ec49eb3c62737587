"""Worker processes for the race tests: each one a resume or a teardown, as an engine's
process would run it, on the real timeline store (SQLite file or PostgreSQL), a
filesystem bank store shared by all, and the run's lock next to the timeline (A16).

Every racer of a round starts at a barrier shared by all of them; then each waits its
``stagger`` (0 for all: they start together; a step apart: a later racer reads the run
while an earlier one is restoring, the window two claims were recorded in). A resume's
sandbox takes ``restore_pause`` to stage, to hold that window open.
"""

from __future__ import annotations

import multiprocessing.queues
import time
import traceback
from typing import Any

from scratchbank.adapters.config import open_run_lock
from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.memory import FakeSandbox
from scratchbank.application.ports import ByteSink, StagedRestore
from scratchbank.application.resume import resume
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import Consents, ResumeRequest
from scratchbank.domain.errors import ResumeSuperseded, RunLocked

FILES = {"verify.sh": b"#!/bin/sh\nexit 0\n", "clone/README": b"docs"}


class SlowRestore(FakeSandbox):
    """A sandbox whose staging takes ``pause`` seconds: the restore window stays open."""

    def __init__(self, pause: float) -> None:
        super().__init__({})
        self.pause = pause

    def stage_restore(
        self, src: Any, *, compressed: bool, listing: ByteSink, need_bytes: int = 0
    ) -> StagedRestore:
        time.sleep(self.pause)
        return super().stage_restore(src, compressed=compressed, listing=listing, need_bytes=need_bytes)


def race_one(task: dict[str, Any]) -> dict[str, Any]:
    timeline = EventStoreTimeline(task["url"])
    store = FilesystemBankStore(task["banks"])
    try:
        lock = open_run_lock(task["url"]) if task.get("lock", True) else None
        task["barrier"].wait(timeout=60)
        time.sleep(task.get("stagger", 0.0))
        if task["role"] == "teardown":
            report = bank_at_teardown(
                task["run"],
                timeline=timeline,
                store=store,
                sandbox=FakeSandbox(dict(FILES)),
                run_finished=False,
            )
            return {"role": "teardown", "result": "recorded" if report.recorded else "lost"}
        box = SlowRestore(task.get("restore_pause", 0.0))
        request = ResumeRequest(consents=Consents())
        try:
            out = resume(task["run"], request, timeline=timeline, store=store, sandbox=box, lock=lock)
        except ResumeSuperseded:
            return {"role": "resume", "result": "superseded", "files": box.files}
        except RunLocked:
            return {"role": "resume", "result": "locked", "files": box.files}
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
