"""Hostile bytes never cost a record (issue 10 hole 3): a parse failure at bank time still
writes ``sandbox_scratch_banked`` (T6), and at resume the run parks with its restore
record (X4), whatever the bytes make the parser do."""

from __future__ import annotations

import tarfile

import pytest
from hostile import end, gz, member, pax_header, pax_payload, record_for, ustar

from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.application.ports import ArchiveReport, ByteSink
from scratchbank.application.resume import resume
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import SCRATCH_NOT_PORTABLE, ResumeRequest
from scratchbank.domain.records import ScratchBanked, ScratchRestored
from scratchbank.testing.builders import node, started
from scratchbank.testing.clocks import ManualClock

HOSTILE = {
    "PAX mtime past any float": [("mtime", "1e400")],
    "PAX mtime past the range": [("mtime", "99999999999999999999")],
    "negative PAX size": [("size", "-1536")],
    "unknown PAX key": [("SCHILY.xattr.security.capability", "x")],
}


def bank_of(pairs: list[tuple[str, str]]) -> bytes:
    raw = (
        ustar(member("./", tarfile.DIRTYPE))
        + pax_header(pax_payload(pairs))
        + ustar(member("f", size=2), b"ok")
    )
    return gz(raw + end())


class HostileSandbox(FakeSandbox):
    """A compromised sandbox: its tar streams whatever bytes it likes."""

    def __init__(self, data: bytes) -> None:
        super().__init__({"f": b"ok"})
        self.data = data

    def archive(self, dest: ByteSink, *, compress: bool, verify: bool, **_: object) -> ArchiveReport:
        self._step("archive")
        dest.write(self.data if compress else b"")
        return ArchiveReport(False)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_T6_a_bank_the_parser_chokes_on_is_still_recorded(case: str) -> None:
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-t", [started(), node("clone", "tool")])
    sandbox = HostileSandbox(bank_of(HOSTILE[case]))
    report = bank_at_teardown(
        "run-t", timeline=timeline, store=store, sandbox=sandbox, run_finished=False, clock=ManualClock()
    )
    last = timeline.read("run-t")[-1]
    assert isinstance(last, ScratchBanked) and report.recorded
    assert not last.banked and "refused on the host" in last.reason, last
    assert store.banks == {}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_X4_a_bank_the_parser_chokes_on_parks_the_run_with_its_record(case: str) -> None:
    data = bank_of(HOSTILE[case])
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    record = record_for(data)
    assert isinstance(record, ScratchBanked)
    timeline.append("run-r", [started(), record])
    store.banks["run-r"] = data
    box = FakeSandbox({})
    out = resume("run-r", ResumeRequest(), timeline=timeline, store=store, sandbox=box)
    assert out.restore is not None and out.restore.park is not None
    assert out.restore.park.code == SCRATCH_NOT_PORTABLE and "refused_on_host" in out.restore.record.reason
    last = timeline.read("run-r")[-1]
    assert isinstance(last, ScratchRestored) and not last.restored
    assert box.files == {} and box.staged == {}  # nothing reached the scratch, nothing left staged
