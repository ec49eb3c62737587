"""Tars of many empty members read under a member log budget.

First written for tests/rules/test_[TX]*.py: Issue 14 (X2, T6): the member cap is what a user may
bank (2M: a million tiny files fits); the host's guard is the member log's temp-disk budget
(``Limits.member_log_bytes``), refused by name before the temp disk fills, at bank time and at
restore time alike."""

from __future__ import annotations

from collections.abc import Iterator

from hostile import end, member, ustar

from scratchbank.application.bank_format.reader import Limits, TarReader

OLD_CAP = 200_000


def _empty_files(n: int) -> Iterator[bytes]:
    """``n`` empty regular files ``d<i // 1000>/f<i>``, one header block each, in 1 MiB pieces
    (built from one template: only the name and the checksum change)."""
    template = bytearray(ustar(member("x" * 20)))
    template[148:156] = b" " * 8
    base = sum(template) - sum(b"x" * 20)
    piece = bytearray()
    for i in range(n):
        name = b"d%06d/f%011d" % (i // 1000, i)  # 20 bytes, as the template
        block = bytearray(template)
        block[0:20] = name
        block[148:156] = b"%06o\x00 " % (base + sum(name))
        piece += block
        if len(piece) >= 1 << 20:
            yield bytes(piece)
            piece.clear()
    yield bytes(piece) + end()


def _read(pieces: Iterator[bytes], limits: Limits) -> TarReader:
    reader = TarReader(limits)
    for piece in pieces:
        reader.feed(piece)
    reader.close()
    return reader
