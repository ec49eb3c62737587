"""A run driven step by step: a sandbox, a store and a timeline that wait at a gate, and a call in a
thread.

First written for tests/rules/test_[AC]*.py: Issue 18 classes 1-3 and the lock's flows (A16, A18,
R2, X3, X6, C8), each a named test."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.run_lock import MemoryRunLock
from scratchbank.application.cancellation import Deadline
from scratchbank.application.ports import ByteSink, RunLock, StagedRestore
from scratchbank.application.resume import resume
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import ResumeRequest
from scratchbank.domain.errors import TimelineUnreadable
from scratchbank.domain.records import Record
from scratchbank.testing.clocks import ManualClock

RUN = "run-1"


OLD = {"work/a.txt": b"old"}


NEW = {"work/a.txt": b"new", "work/b.txt": b"newer"}


WAIT = 30.0  # an event that never comes fails the test instead of hanging it


class GatedSandbox(FakeSandbox):
    """A FakeSandbox whose archive (or restore) waits for ``go`` once it has begun."""

    def __init__(self, files: dict[str, bytes] | None = None, *, gate: str = "archive", **kw: Any) -> None:
        super().__init__(files, **kw)
        self.gate, self.begun, self.go = gate, threading.Event(), threading.Event()

    def _wait(self, op: str) -> None:
        if op == self.gate:
            self.begun.set()
            assert self.go.wait(WAIT)

    def archive(
        self, dest: ByteSink, *, compress: bool, verify: bool, deadline: Deadline | None = None
    ) -> Any:
        self._wait("archive")
        return super().archive(dest, compress=compress, verify=verify, deadline=deadline)

    def stage_restore(
        self, src: Any, *, compressed: bool, listing: ByteSink, need_bytes: int = 0
    ) -> StagedRestore:
        self._wait("restore")
        return super().stage_restore(src, compressed=compressed, listing=listing, need_bytes=need_bytes)


class Rig:
    """One run's ports: timeline, store, lock on a manual clock."""

    def __init__(self, lock: RunLock | None = None) -> None:
        self.clock = ManualClock()
        self.timeline = InMemoryTimeline()
        self.store = InMemoryBankStore()
        self.lock = lock or MemoryRunLock(self.clock)

    def records(self) -> tuple[Record, ...]:
        return tuple(self.timeline.read(RUN))

    def teardown(self, files: dict[str, bytes] | None, execution: str | None, **kw: Any) -> Any:
        box = kw.pop("sandbox", None) or FakeSandbox(dict(files) if files is not None else None)
        return bank_at_teardown(
            RUN,
            timeline=self.timeline,
            store=self.store,
            sandbox=box,
            run_finished=False,
            clock=self.clock,
            execution=execution,
            **kw,
        )

    def resume(self, box: FakeSandbox | None = None, **kw: Any) -> Any:
        return resume(
            RUN,
            ResumeRequest(),
            timeline=self.timeline,
            store=self.store,
            sandbox=box if box is not None else FakeSandbox({}),
            clock=self.clock,
            lock=kw.pop("lock", self.lock),
            **kw,
        )


def objects(store: InMemoryBankStore) -> dict[str, dict[str | None, bytes]]:
    """What the store holds, every run's objects by name (a copy)."""
    return {run: dict(named) for run, named in store.stored.items()}


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as error:  # handed to the test, which asserts on it
            out.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


class BlipTimeline(InMemoryTimeline):
    """The first read fails (a blip); while it is failing, ``meanwhile`` runs (another actor)."""

    def __init__(self) -> None:
        super().__init__()
        self.blips = 0
        self.meanwhile: Callable[[], None] | None = None

    def read(self, run_id: str) -> Sequence[Record]:
        if self.meanwhile is not None:
            act, self.meanwhile = self.meanwhile, None
            self.blips += 1
            act()
            raise TimelineUnreadable("a blip")
        return super().read(run_id)


class GatedStore(InMemoryBankStore):
    """A store whose put waits for ``go`` once it has begun (a put in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.begun, self.go = threading.Event(), threading.Event()

    def put(self, run_id: str, archive: Path, *, sha256: str, **kw: Any) -> str:
        self.begun.set()
        assert self.go.wait(WAIT)
        return super().put(run_id, archive, sha256=sha256, **kw)
