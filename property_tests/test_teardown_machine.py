"""A stateful audit of whole teardowns over a fault-injecting sandbox and store.

Each step changes the scratch, or tears the sandbox down while a script of faults plays
out: every ``archive`` call (one tar pass) completes clean, completes raced, or fails
(an exec blip, a broken stream, the sandbox gone for good, a tar failure); the store
refuses the first few uploads or every one; the cap may be small; the store may keep
no bank. The model says what the one record must say, read from RULES.md and not from
the code under test:

- T8: up to 3 bank tries; T16: up to 3 tar passes while a pass races;
- T10: up to 3 uploads of the same archive per try, never a new tar for an upload;
- T16: the last complete archive (a clean one, else the last that raced) is banked even
  when a later pass or try fails, for any reason;
- T9 / A7: a later try never replaces what an earlier try saw with less
  (files > empty > nothing known): it stops, recording what the earlier one saw;
- T19: a sandbox gone before anything was archived is ``unknown``, and the earlier bank
  stays; T20: over the cap, or a store that keeps no bank, stores nothing and says why.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.cancellation import Deadline
from scratchbank.application.teardown import Budgets, bank_at_teardown
from scratchbank.domain import fold
from scratchbank.domain.errors import ArchiveFailed, BankWriteFailed, ExecFailed, SandboxGone, StreamBroken
from scratchbank.domain.objects import BankStamp
from scratchbank.domain.records import ScratchBanked
from scratchbank.testing.builders import resumed, started
from scratchbank.testing.clocks import ManualClock

FAILS = {
    "exec": lambda: ExecFailed("exec blip"),
    "stream": lambda: StreamBroken("stream broke"),
    "gone": lambda: SandboxGone("pod deleted"),
    "tar": lambda: ArchiveFailed("tar: ./x: Cannot open"),
}
EVENTS = st.sampled_from(["clean", "clean", "raced", "exec", "stream", "gone", "tar"])
UNKNOWN, EMPTY, FILES = 0, 1, 2  # T9's order


class FlakyStore(InMemoryBankStore):
    def __init__(self, fail_puts: int, keeps: bool) -> None:
        super().__init__(keeps_banks=keeps)
        self.fail_puts = fail_puts

    def put(
        self,
        run_id: str,
        archive: Path,
        *,
        sha256: str,
        stamp: BankStamp | None = None,
        deadline: Deadline | None = None,
    ) -> str:
        if self.fail_puts:
            self.fail_puts -= 1
            raise BankWriteFailed("store blip")
        return super().put(run_id, archive, sha256=sha256, stamp=stamp, deadline=deadline)


@attrs.frozen
class Said:
    """What the model says the teardown records: what it saw, and the archive it banked."""

    seen: int
    banked: str | None = None  # "clean" | "raced": the kind of archive stored, if any
    why: str = ""  # "cap" | "keeps no bank" | "upload" | "tar" when files were not banked


def model(files: bool, script: list[str], fail_puts: int, keeps: bool, over_cap: bool) -> Said:
    """The ADR's procedure, step by step as RULES.md tells it."""
    calls = iter([*script, *["clean"] * 9])
    gone = False
    kept: str | None = None  # T16: the last complete archive, a clean one before one that raced
    best: Said | None = None
    for _ in range(3):  # T8: three bank tries
        seen, failed = None, None
        for _ in range(3):  # T16: tar again while it races, three passes at most
            event = "gone" if gone else next(calls)
            gone = gone or event == "gone"
            if event in FAILS:
                failed = event
                break
            if not files:
                seen = EMPTY
                break
            kept = event if kept is None or event == "clean" or kept == "raced" else kept
            if event == "clean":
                break
        if failed is not None and kept is None:
            try_said = Said(FILES if failed == "tar" else UNKNOWN, why="tar" if failed == "tar" else "")
        elif seen == EMPTY:
            try_said = Said(EMPTY)
        elif over_cap:
            try_said = Said(FILES, why="cap")
        elif not keeps:
            try_said = Said(FILES, why="keeps no bank")
        else:
            uploads = min(3, fail_puts)  # T10: three uploads of the same archive
            fail_puts -= uploads
            try_said = Said(FILES, banked=kept) if uploads < 3 else Said(FILES, why="upload")
        if best is not None and try_said.seen < best.seen:
            return best  # A7: a try that knows less stops; the earlier one is recorded
        best = try_said if best is None or _rank(try_said) >= _rank(best) else best
        if best.banked or best.seen == EMPTY or best.why in ("cap", "keeps no bank"):
            return best
    assert best is not None
    return best


def _rank(said: Said) -> int:
    return said.seen * 10 + (2 if said.banked == "clean" else 1 if said.banked else 0)


class Teardowns(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.timeline = InMemoryTimeline()
        self.files: dict[str, bytes] = {}
        self.bank: bytes | None = None  # what the store holds under the recorded bank

    @initialize()
    def start(self) -> None:
        self.timeline.append("run-1", [started()])

    @rule(files=st.dictionaries(st.sampled_from(["a", "b/c", "d/e/f"]), st.binary(max_size=64), max_size=3))
    def the_scratch_changes(self, files: dict[str, bytes]) -> None:
        self.files = files

    @rule(
        script=st.lists(EVENTS, max_size=9),
        fail_puts=st.sampled_from([0, 0, 1, 2, 3, 5, 9]),
        keeps=st.booleans() | st.just(True),
        small_cap=st.booleans(),
    )
    def the_sandbox_is_torn_down(
        self, script: list[str], fail_puts: int, keeps: bool, small_cap: bool
    ) -> None:
        store = FlakyStore(fail_puts, keeps)
        if self.bank is not None:
            store.banks["run-1"] = self.bank
        box = _scripted(self.files, script)
        before = len(self.timeline.read("run-1"))
        report = bank_at_teardown(
            "run-1",
            timeline=self.timeline,
            store=store,
            sandbox=box,
            run_finished=False,
            budgets=Budgets(cap_bytes=64 if small_cap else 1 << 20),
            clock=ManualClock(),
        )
        records = self.timeline.read("run-1")[before:]
        assert report.recorded and len(records) == 1  # T6: one record per teardown
        rec = records[0]
        assert isinstance(rec, ScratchBanked)
        said = model(bool(self.files), script, fail_puts, keeps, small_cap and _over(self.files))
        self._check(rec, said, store)
        self.timeline.append("run-1", [resumed()])  # the next sandbox

    def _check(self, rec: ScratchBanked, said: Said, store: FlakyStore) -> None:
        if said.banked:
            assert rec.banked, (rec, said)
            assert rec.sha256 == hashlib.sha256(store.only("run-1")).hexdigest()
            assert bool(rec.raced) == (said.banked == "raced"), (rec, said)
            self.bank = store.only("run-1")
        elif said.seen == EMPTY:
            assert rec.empty and store.only("run-1") is None, rec  # T4
            self.bank = None
        elif said.seen == UNKNOWN:
            assert rec.unknown, (rec, said)  # T19: the earlier bank stays, and still decides
            assert store.only("run-1") == self.bank
        else:
            assert rec.files_unbanked and rec.reason, (rec, said)  # R1 will refuse: named why
            key = {"cap": "cap", "keeps no bank": "keeps no bank", "upload": "upload", "tar": "tar"}[said.why]
            assert key in rec.reason, (rec, said)
            self.bank = None
        assert (fold(self.timeline.read("run-1")).bank is not None) == (
            self.bank is not None
        ) or said.seen == UNKNOWN


def _over(files: dict[str, bytes]) -> bool:
    """Is the archive of these files past a 64-byte cap? (A gzip'd tar always is.)"""
    return bool(files)


def _scripted(files: dict[str, bytes], script: list[str]) -> FakeSandbox:
    """A fake sandbox whose archive calls play ``script`` out, then complete clean."""
    box = FakeSandbox(dict(files))
    faults: list[BaseException | None] = []
    gone = False
    for event in script:
        gone = gone or event == "gone"
        if gone:
            faults.append(SandboxGone("pod deleted"))
        elif event in FAILS:
            faults.append(FAILS[event]())
        else:
            faults.append(None)
            box.races.append(("./log",) if event == "raced" else ())
    if gone:
        faults += [SandboxGone("pod deleted")] * 9
    box.faults["archive"] = faults
    return box


TestTeardowns = Teardowns.TestCase
# Whole teardowns (tar, gzip, uploads) per step: fewer, shorter stories than the fold's.
TestTeardowns.settings = settings(
    settings.default, max_examples=min(120, settings.default.max_examples), stateful_step_count=8
)
