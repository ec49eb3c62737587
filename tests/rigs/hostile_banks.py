"""Hostile banks (PAX records that make the parser fail) and a fake sandbox that archives them.

First written for tests/rules/test_[TX]*.py: Hostile bytes never cost a record (issue 10 hole 3): a
parse failure at bank time still writes ``sandbox_scratch_banked`` (T6), and at resume the run parks
with its restore record (X4), whatever the bytes make the parser do."""

from __future__ import annotations

import tarfile

from hostile import end, gz, member, pax_header, pax_payload, ustar

from scratchbank.adapters.memory import FakeSandbox
from scratchbank.application.ports import ArchiveReport, ByteSink

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
