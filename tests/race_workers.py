"""Worker processes for the race tests: each one a resume or a teardown, as an engine's
process would run it, on the real timeline store (SQLite file or PostgreSQL), a
filesystem bank store shared by all, and the run's lock next to the timeline (A16).

Every racer of a round starts at a barrier shared by all of them. With a ``window`` (the
staggered race), the first racer starts alone and the others wait until a restore is staging;
that restore is held open until every other racer has ended: each later racer reads the run
while an earlier one is restoring (the window two claims were once recorded in), by events,
not sleeps.
"""

from __future__ import annotations

import multiprocessing.queues
import queue
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


#: How long a held window waits for the other racers (a bug that lets two racers stage
#: makes each wait this long, then the test's count of claims fails).
WINDOW_SECONDS = 30.0


class HeldRestore(FakeSandbox):
    """A sandbox whose staging says so (``staging``) and then waits until ``others`` racers
    have ended (a token each on ``ended``): the restore window stays open while they race."""

    def __init__(self, window: tuple[Any, Any, int] | None) -> None:
        super().__init__({})
        self.window = window
        self.holding = False

    def stage_restore(
        self, src: Any, *, compressed: bool, listing: ByteSink, need_bytes: int = 0
    ) -> StagedRestore:
        if self.window is not None:
            staging, ended, others = self.window
            self.holding = True
            staging.set()
            deadline = time.monotonic() + WINDOW_SECONDS
            try:
                for _ in range(others):
                    ended.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                pass
        return super().stage_restore(src, compressed=compressed, listing=listing, need_bytes=need_bytes)


def race_one(task: dict[str, Any]) -> dict[str, Any]:
    timeline = EventStoreTimeline(task["url"])
    store = FilesystemBankStore(task["banks"])
    window = task.get("window")
    box = HeldRestore(window)
    try:
        lock = open_run_lock(task["url"]) if task.get("lock", True) else None
        task["barrier"].wait(timeout=60)
        if window is not None and not task["first"]:
            window[0].wait(timeout=WINDOW_SECONDS)  # the first racer's restore is staging
        if task["role"] == "teardown":
            report = bank_at_teardown(
                task["run"],
                timeline=timeline,
                store=store,
                sandbox=FakeSandbox(dict(FILES)),
                run_finished=False,
                execution=task.get("execution"),
            )
            return {"role": "teardown", "result": "recorded" if report.recorded else "lost"}
        request = ResumeRequest(consents=Consents())
        try:
            out = resume(task["run"], request, timeline=timeline, store=store, sandbox=box, lock=lock)
        except ResumeSuperseded:
            return {"role": "resume", "result": "superseded", "files": box.files}
        except RunLocked:
            return {"role": "resume", "result": "locked", "files": box.files}
        restored = out.restore is not None and out.restore.record.restored
        return {
            "role": "resume",
            "result": "restored" if restored else "went on",
            "files": box.files,
            "why": repr(out)[:1500],
        }
    except Exception:  # reported to the parent, which fails the test with it
        return {"role": task["role"], "result": "error", "error": traceback.format_exc()}
    finally:
        if window is not None and not box.holding:
            window[1].put(task["role"])  # one racer fewer to wait for
        timeline.close()


def serve(tasks: multiprocessing.queues.Queue[Any], results: multiprocessing.queues.Queue[Any]) -> None:
    """A long-lived racer: one process serves every round (spawning costs ~1 s each)."""
    while (task := tasks.get()) is not None:
        results.put(race_one(task))
