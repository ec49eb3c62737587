"""The tar header encoder: one validated member as a ustar header (PAX records when a
field does not fit), as the canonical writer writes it."""

from __future__ import annotations

from .members import DIR, FILE, HARDLINK, SYMLINK, Member
from .tar_header import BLOCK

_TYPES = {FILE: b"0", HARDLINK: b"1", SYMLINK: b"2", DIR: b"5"}
_OCTAL_MAX = 8**11  # what a 12-byte ustar number field holds (11 digits and a NUL)
_ZERO8 = b"0000000\x00"
_MAGIC = b"ustar\x0000"  # POSIX ustar, as a PAX archive has it
_TAIL = bytes(32 + 32 + 8 + 8 + 155 + 12)  # uname, gname, devmajor, devminor, prefix; padding
_PAX_NAME = b"././@PaxHeader"
_CONSTANT_SUM = 2 * sum(_ZERO8) + sum(_MAGIC) + 8 * 32  # uid, gid, magic; the checksum's spaces


def _block(name: bytes, mode: int, size: int, mtime: int, kind: bytes, link: bytes) -> bytes:
    """One ustar block, laid out field by field as tarfile's PAX writer lays it out."""
    head = name[:100].ljust(100, b"\x00") + b"%07o\x00" % mode
    numbers = b"%011o\x00%011o\x00" % (size, mtime)
    link = link[:100].ljust(100, b"\x00")
    checksum = sum(head) + sum(numbers) + kind[0] + sum(link) + _CONSTANT_SUM
    return b"".join((head, _ZERO8, _ZERO8, numbers, b"%06o\x00 " % checksum, kind, link, _MAGIC, _TAIL))


def _pax_record(key: bytes, value: bytes) -> bytes:
    """``<length> key=value\n``, the length counting its own digits."""
    length = len(key) + len(value) + 3
    total = length + 1
    while total != length + len(str(total)):
        total = length + len(str(total))
    return b"%d %s=%s\n" % (total, key, value)


def _field(value: str, key: str, pax: dict[str, str]) -> bytes:
    """A name or link for its 100-byte field: ASCII within 100 characters, else PAX."""
    try:
        raw = value.encode("ascii")
    except UnicodeEncodeError:
        pax[key] = value
        return value.encode("ascii", "replace")
    if len(raw) > 100:
        pax[key] = value
    return raw


def _pax_header(pax: dict[str, str]) -> bytes:
    """The PAX extended header (``hdrcharset=BINARY`` first when a value is not UTF-8)."""
    try:
        values = [(k.encode("ascii"), v.encode("utf-8")) for k, v in pax.items()]
        records = b""
    except UnicodeEncodeError:
        values = [(k.encode("ascii"), v.encode("utf-8", "surrogateescape")) for k, v in pax.items()]
        records = b"21 hdrcharset=BINARY\n"
    records += b"".join(_pax_record(k, v) for k, v in values)
    padding = bytes(-len(records) % BLOCK)
    return _block(_PAX_NAME, 0, len(records), 0, b"x", b"") + records + padding


def header_of(m: Member, mode: int | None = None) -> bytes:
    """The canonical header block(s) of a validated member (``mode`` in place of its own).

    Byte for byte what ``tarfile.TarInfo.tobuf(PAX_FORMAT, "utf-8", "surrogateescape")``
    writes for it, owners 0 and unnamed (property_tests/test_canonical_header.py): a
    name or link that is not ASCII or longer than 100 characters goes to a PAX record
    (its ustar field keeps the first 100 bytes, non-ASCII as ``?``), and so does a size
    or mtime an 11-digit octal field cannot hold (the field then reads 0)."""
    kind = _TYPES[m.type]
    name = m.path + "/" if m.type == DIR and m.path else (m.path or "./")
    pax: dict[str, str] = {}
    raw_name = _field(name, "path", pax)
    raw_link = _field(m.linkname, "linkpath", pax) if m.linkname else b""
    size = m.size if m.type == FILE else 0
    mtime = m.mtime
    if not 0 <= size < _OCTAL_MAX:
        pax["size"], size = str(size), 0
    if not 0 <= mtime < _OCTAL_MAX:
        pax["mtime"], mtime = str(mtime), 0
    block = _block(raw_name, (m.mode if mode is None else mode) & 0o777, size, mtime, kind, raw_link)
    return _pax_header(pax) + block if pax else block
