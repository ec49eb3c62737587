"""The resume use case over fakes: a world, its checksum, and the timeline, store and sandbox that fail
or cut in.

First written for tests/test_resume_use_case.py: The resume and restore use cases end to end, with
fakes (R and X rules)."""

from __future__ import annotations

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.ports import StoredBank
from scratchbank.application.resume import ResumeOutcome, resume
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import (
    SCRATCH_NOT_PORTABLE,
    Consents,
    ResumeRequest,
)
from scratchbank.domain.errors import (
    BankGone,
    BankReadFailed,
    HostileArchive,
    RestoreRefused,
    SandboxGone,
    StreamBroken,
)
from scratchbank.domain.records import Record
from scratchbank.testing.builders import node, started

FILES = {"verify.sh": b"#!/bin/sh\n", "clone/README": b"docs"}


ACCEPT = ResumeRequest(consents=Consents(accept_scratch_loss=True))


class World:
    """One run: a timeline, a bank store, and its sandboxes."""

    def __init__(self) -> None:
        self.timeline = InMemoryTimeline()
        self.store = InMemoryBankStore()
        self.timeline.append("run-1", [started(), node("clone", "tool")])

    def park(self, files: dict[str, bytes] | None = None) -> None:
        bank_at_teardown(
            "run-1",
            timeline=self.timeline,
            store=self.store,
            sandbox=FakeSandbox(dict(files or FILES)),
            run_finished=False,
        )

    def resume(
        self, request: ResumeRequest = ResumeRequest(), sandbox: FakeSandbox | None = None, **kw: object
    ) -> tuple[ResumeOutcome, FakeSandbox]:
        box = sandbox if sandbox is not None else FakeSandbox({})
        out = resume("run-1", request, timeline=self.timeline, store=self.store, sandbox=box, **kw)  # type: ignore[arg-type]
        return out, box

    def last(self) -> Record:
        return self.timeline.read("run-1")[-1]


def _failing_fetch(*args: object, **kwargs: object) -> None:
    raise BankReadFailed("503 Slow Down")


def checksum(w: World) -> str:
    """What a refusal must leave as it was: the run's records and every bank's bytes."""
    import hashlib

    from scratchbank.domain.wire import encode

    digest = hashlib.sha256(repr([encode(r) for r in w.timeline.read("run-1")]).encode())
    for run_id, data in sorted(w.store.banks.items()):
        digest.update(run_id.encode() + data)
    return digest.hexdigest()


class Interloper(InMemoryTimeline):
    """A real timeline on which another writer appends ``cut_in`` right after this
    resume's first read: the race two resumes started together run, made certain."""

    def __init__(self, cut_in: list[Record]) -> None:
        super().__init__()
        self.cut_in = cut_in

    def read(self, run_id: str):  # type: ignore[no-untyped-def]
        records = super().read(run_id)
        if self.cut_in:
            super().append(run_id, self.cut_in, expected=len(records))
            self.cut_in = []
        return records


def interloped(cut_in: list[Record]) -> tuple[World, Interloper]:
    w = World()
    w.park()
    timeline = Interloper(cut_in)
    timeline.append("run-1", w.timeline.read("run-1"))
    w.timeline = timeline
    return w, timeline


#: From RULES.md, not from the code: X4 (the bank is gone or does not extract, host or
#: sandbox) parks SCRATCH_NOT_PORTABLE; X5 (a read that fails on the way: store, the
#: stream into the sandbox; anything unnamed is read again) parks without a code.
X4, X5 = SCRATCH_NOT_PORTABLE, None


class FaultyStore(InMemoryBankStore):
    def __init__(self, fault: Exception | None = None, corrupt: bool = False) -> None:
        super().__init__()
        self.fault, self.corrupt = fault, corrupt

    def fetch(self, run_id, dest, *, max_bytes, name=None, deadline=None):  # type: ignore[no-untyped-def]
        if self.fault is not None:
            raise self.fault
        if self.corrupt:
            dest.write(b"\x1f\x8b" + b"\x00" * 64)
            return StoredBank(66, "0" * 64)
        return super().fetch(run_id, dest, max_bytes=max_bytes, name=name, deadline=deadline)


class FaultySandbox(FakeSandbox):
    def __init__(self, at: str, fault: Exception) -> None:
        super().__init__({})
        self.at, self.fault = at, fault

    def stage_restore(self, src, *, compressed, listing, need_bytes=0):  # type: ignore[no-untyped-def]
        if self.at == "restore":
            src.read(1 << 10)
            raise self.fault
        return super().stage_restore(src, compressed=compressed, listing=listing, need_bytes=need_bytes)

    def staged_lines(self, tree: dict[str, tuple[str, bytes]]) -> list[str]:
        if self.at == "list":
            raise self.fault
        return super().staged_lines(tree)


RESTORE_STEPS = [
    ("fetch: gone", FaultyStore(BankGone("NoSuchKey")), None, X4),
    ("fetch: 503", FaultyStore(BankReadFailed("503 Slow Down")), None, X5),
    ("fetch: past the cap", FaultyStore(HostileArchive("over the cap")), None, X4),
    ("fetch: a bug", FaultyStore(RuntimeError("boom")), None, X5),
    ("host check: corrupt", FaultyStore(corrupt=True), None, X4),
    ("stream in: broke", None, FaultySandbox("restore", StreamBroken("kubectl exited 0 short")), X5),
    ("stream in: tar refused", None, FaultySandbox("restore", RestoreRefused("disk full")), X4),
    ("stream in: sandbox gone", None, FaultySandbox("restore", SandboxGone("pod deleted")), X5),
    ("stream in: an OS error", None, FaultySandbox("restore", OSError(5, "EIO")), X5),
    ("listing: a crash", None, FaultySandbox("list", ValueError("not enough values to unpack")), X5),
]
