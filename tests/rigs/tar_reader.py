"""The tar reader driven on raw bytes: header fields, PAX records, a buggy reader, a reader's peak
memory.

First written for tests/rules/test_[TX]*.py: The reader's grammar (issue 10, Build 1): every header
field read with a range, PAX records on an allow-list, a reader that only moves forward, and one
boundary where any parse failure becomes a named refusal (X2 on the host, T6 at bank time)."""

from __future__ import annotations

import io
import tarfile

from hostile import end, member, pax_header, pax_payload, ustar

from scratchbank.application.bank_format.gunzip import GzipReader
from scratchbank.application.bank_format.reader import Limits, TarReader
from scratchbank.application.bank_format.writer import CanonicalWriter


def read(raw: bytes, limits: Limits = Limits()) -> TarReader:
    """Feed a raw tar in odd-sized pieces (a boundary can fall anywhere), then close."""
    reader = TarReader(limits)
    for i in range(0, len(raw), 333):
        reader.feed(raw[i : i + 333])
    reader.close()
    return reader


def canonical(raw: bytes) -> list[tarfile.TarInfo]:
    out = io.BytesIO()
    writer = CanonicalWriter(out)
    reader = TarReader(on_member=writer.member, on_data=writer.data)
    reader.feed(raw)
    reader.close()
    writer.finish()
    return list(tarfile.open(fileobj=io.BytesIO(out.getvalue())))


def with_pax(pairs: list[tuple[str, str]], name: str = "f", data: bytes = b"hello") -> bytes:
    return pax_header(pax_payload(pairs)) + ustar(member(name, size=len(data)), data) + end()


# -- header fields: one grammar, each with a range ------------------------------------------
def _block(**kw: object) -> bytes:
    return member("f", size=0, **kw).tobuf(tarfile.USTAR_FORMAT)


FIELDS = [
    ("signed size", 124, b"-0000000001\x00", "bad number in the size field"),
    ("plus size", 124, b"+0000000001\x00", "bad number in the size field"),
    ("garbage after NUL", 124, b"00000000001\x00"[:10] + b"\x00x", "bad number in the size field"),
    ("negative base-256 size", 124, b"\xff" * 12, "negative or malformed base-256"),
    ("huge base-256 size", 124, b"\x80" + b"\x7f" * 11, "size field .* out of range"),
    ("mode with high bits", 100, b"0017777\x00", "mode field .* out of range"),
    (
        "base-256 mtime past the range",
        136,
        b"\x80" + b"\x00" * 3 + b"\x7f" * 8,
        "mtime field .* out of range",
    ),
    ("uid past 32 bits", 108, b"\x80\x00\x00\x01\x00\x00\x00\x00", "uid field .* out of range"),
    ("non-octal gid", 116, b"0000008\x00", "bad number in the gid field"),
]


# -- PAX keys: the allow-list ----------------------------------------------------------------
HARMLESS = {
    "atime": "1600000000.5",
    "ctime": "1600000000.25",
    "uid": "1000",
    "gid": "1000",
    "uname": "mallory",
    "gname": "staff",
    "hdrcharset": "BINARY",
}


# -- one boundary -------------------------------------------------------------------------------
class _Buggy(TarReader):
    def _header(self, block: bytes) -> None:
        raise OverflowError("a parser bug met by hostile bytes")


# -- memory: flat in the member count (issue 10 hole 5) --------------------------------------
def _many(n: int) -> bytes:
    return b"".join(ustar(member(f"d{i % 50}/f{i}", size=1), b"z") for i in range(n)) + end()


def _peak_while_reading(raw: bytes) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        reader = TarReader()
        for i in range(0, len(raw), 1 << 16):
            reader.feed(raw[i : i + (1 << 16)])
        reader.close()
        lines = sum(1 for _ in reader.log.lines())
        assert lines == len(raw) // 1024 - 1
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def check(data: bytes, limits: Limits = Limits()) -> TarReader:
    reader = TarReader(limits)
    gunzip = GzipReader(reader.feed, limits.uncompressed_bytes)
    for i in range(0, len(data), 999):
        gunzip.feed(data[i : i + 999])
    gunzip.close()
    reader.close()
    return reader
