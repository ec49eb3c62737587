"""The grammar of a tar header block and of PAX records: every field read with a range.

A bank comes from a sandbox that may be hostile, and extractors disagree on whatever
the grammar leaves loose (a signed octal size, a PAX size that contradicts the ustar
one, an unknown PAX key one reader honours and another drops). So every number is
read by one strict grammar (octal, or GNU base-256 for positive values only) and
checked against its range, and PAX records are read on an allow-list: the keys we
use (``path``, ``linkpath``, ``size``, ``mtime``) and a short list of harmless ones
normalised away (``atime``, ``ctime``: times we do not restore; ``uid``, ``gid``,
``uname``, ``gname``: owners we ignore; ``hdrcharset``: BINARY or UTF-8, both read as
bytes). Anything else is refused by name.
"""

from __future__ import annotations

import re
import struct
import zlib
from typing import NamedTuple

from scratchbank.domain.errors import HostileArchive

BLOCK = 512
MAX_MTIME = 8**11 - 1  # what an 11-digit ustar field holds: the year 4147
MAX_ID = 2**32 - 1
MAX_MODE = 0o7777
USED_PAX_KEYS = frozenset({"path", "linkpath", "size", "mtime"})
DROPPED_PAX_KEYS = frozenset({"atime", "ctime", "uid", "gid", "uname", "gname", "hdrcharset"})
#: ``hdrcharset`` only says how to read ``path``/``linkpath``: we read both as bytes anyway
#: (undecodable bytes kept by surrogateescape), so only its two standard values pass.
HDRCHARSETS = frozenset({"BINARY", "ISO-IR 10646 2000 UTF-8"})

#: An octal field: leading spaces, octal digits, then only NULs and spaces (what
#: ``number`` accepted as strip-then-translate; property_tests/test_header_grammar.py).
_OCTAL = re.compile(rb" *([0-7]*)[ \x00]*")
#: The six number fields of a header, joined by ``|`` (in no field's grammar, so each
#: group stays within its field): one match reads them all when all are plain octal.
_NUMBERS = re.compile(rb"\|".join([rb" *([0-7]*)[ \x00]*"] * 6))
_CHECKSUM_HIGH = 8 * 255 * BLOCK
#: One header block's fields in one call: name, mode, uid, gid, size, mtime, checksum,
#: type, linkname, magic (with version), ustar prefix.
_FIELDS = struct.Struct("100s8s8s8s12s12s8sB100s8s80x155s12x")
_DIGITS = re.compile(r"^[0-9]{1,20}$")
_TIME = re.compile(r"^-?[0-9]{1,20}(\.[0-9]{1,20})?$")
_PAX_LENGTH = re.compile(rb"^[1-9][0-9]{0,9}$")
_PAX_KEY = re.compile(rb"^[A-Za-z0-9._-]{1,64}$")


def refuse(why: str) -> HostileArchive:
    return HostileArchive(f"bank refused on the host: {why}")


def number(field: bytes, what: str, high: int) -> int:
    """An octal field (or GNU base-256, positive only) within ``[0, high]``.

    Octal: optional leading spaces, octal digits, then only NULs and spaces (no sign,
    no underscore, nothing after the terminator)."""
    octal = _OCTAL.fullmatch(field)
    if octal is not None:
        value = int(octal[1] or b"0", 8)
    elif field[:1] == b"\x80":
        value = int.from_bytes(field[1:], "big")
    elif field[:1] and field[0] & 0x80:
        raise refuse(f"negative or malformed base-256 number in the {what} field")
    else:
        raise refuse(f"bad number in the {what} field")
    if value > high:
        raise refuse(f"the {what} field ({value}) is out of range")
    return value


_ODD = int.from_bytes(b"\x01" * BLOCK, "little")
_ADLER = 65521


def byte_sum(block: bytes) -> int:
    """``sum(block)`` of a 512-byte block, in three C calls rather than 512 additions.

    Adler-32's first half is ``1 + sum`` modulo 65521, and a block's sum is at most
    512 * 255 < 2 * 65521: two candidates, 65521 apart (odd), so of different parity;
    the sum's parity is the count of odd bytes'. Exact (property_tests/test_header_grammar.py)."""
    if len(block) != BLOCK:
        return sum(block)
    low = ((zlib.adler32(block) & 0xFFFF) - 1) % _ADLER
    odd = (int.from_bytes(block, "little") & _ODD).bit_count() & 1
    return low if low & 1 == odd else low + _ADLER


def checksum_ok(block: bytes, field: bytes | None = None) -> bool:
    """The header checksum, unsigned sum only (what every tar writes)."""
    if field is None:
        field = block[148:156]
    stored = number(field, "checksum", _CHECKSUM_HIGH)
    return stored == byte_sum(block) - sum(field) + 8 * 32


def cstring(field: bytes) -> bytes:
    end = field.find(b"\x00")
    return field if end < 0 else field[:end]


def text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def pax_records(data: bytes) -> dict[str, str]:
    """``<length> <key>=<value>\\n`` records, each key once, every key on the allow-list."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        key, value, pos = _pax_record(data, pos)
        if key in out:
            raise refuse(f"PAX key {key!r} given twice")
        if key.startswith("GNU.sparse"):
            raise refuse("sparse members are not accepted")
        if key not in USED_PAX_KEYS and key not in DROPPED_PAX_KEYS:
            raise refuse(f"PAX key {key!r} is not accepted")
        _check_pax_value(key, value)
        out[key] = value
    return out


def _pax_record(data: bytes, pos: int) -> tuple[str, str, int]:
    space = data.find(b" ", pos, pos + 12)
    if space < 0 or not _PAX_LENGTH.match(data[pos:space]):
        raise refuse("malformed PAX record length")
    end = pos + int(data[pos:space])
    record = data[space + 1 : end]
    if end > len(data) or not record.endswith(b"\n"):
        raise refuse("malformed PAX record")
    key, sep, value = record[:-1].partition(b"=")
    if not sep or not _PAX_KEY.match(key):
        raise refuse(f"malformed PAX key {key[:64]!r}")
    return key.decode("ascii"), text(value), end


def _check_pax_value(key: str, value: str) -> None:
    if key in ("size", "uid", "gid") and not _DIGITS.match(value):
        raise refuse(f"bad PAX {key} {value[:40]!r}")
    if key in ("mtime", "atime", "ctime") and not _TIME.match(value):
        raise refuse(f"bad PAX {key} {value[:40]!r}")
    if key == "hdrcharset" and value not in HDRCHARSETS:
        raise refuse(f"PAX hdrcharset {value[:40]!r} is not accepted")
    if key in ("uid", "gid") and int(value) > MAX_ID:
        raise refuse(f"PAX {key} {value} is out of range")


class RawHeader(NamedTuple):
    """One header block's fields, each read by the grammar and within its range."""

    kind: str
    name: bytes
    linkname: bytes
    size: int
    mode: int
    mtime: int


def read_header(block: bytes, *, max_size: int) -> RawHeader:
    """Parse a (non-zero) header block; refuse any field off the grammar or its range.

    The fast path reads the six numbers with one match; anything it does not take
    (base-256, a field off the grammar, a value out of range) is read again field by
    field, in the order that names the first fault (property_tests/test_header_grammar.py).
    """
    name, mode, uid, gid, size, mtime, checksum, kind, linkname, magic, prefix = _FIELDS.unpack(block)
    plain = _NUMBERS.fullmatch(b"|".join((checksum, uid, gid, size, mode, mtime)))
    if plain is None:
        return _read_slowly(
            block, max_size, name, mode, uid, gid, size, mtime, checksum, kind, linkname, magic, prefix
        )
    c, u, g, sz, md, mt = plain.groups()
    c, u, g = int(c or b"0", 8), int(u or b"0", 8), int(g or b"0", 8)
    sz, md, mt = int(sz or b"0", 8), int(md or b"0", 8), int(mt or b"0", 8)
    if c > _CHECKSUM_HIGH or u > MAX_ID or g > MAX_ID or sz > max_size or md > MAX_MODE or mt > MAX_MTIME:
        return _read_slowly(
            block, max_size, name, mode, uid, gid, size, mtime, checksum, kind, linkname, magic, prefix
        )
    if c != byte_sum(block) - sum(checksum) + 8 * 32:
        raise refuse("header checksum mismatch (corrupt)")
    if magic != b"ustar\x0000":
        if magic != b"ustar  \x00":
            raise refuse("not a ustar or GNU tar header")
        prefix = b""
    name = cstring(name)
    prefix = cstring(prefix)
    return RawHeader(
        chr(kind) if kind else "0", prefix + b"/" + name if prefix else name, cstring(linkname), sz, md, mt
    )


def _read_slowly(
    block: bytes,
    max_size: int,
    name: bytes,
    mode: bytes,
    uid: bytes,
    gid: bytes,
    size: bytes,
    mtime: bytes,
    checksum: bytes,
    kind: int,
    linkname: bytes,
    magic: bytes,
    prefix: bytes,
) -> RawHeader:
    if not checksum_ok(block, checksum):
        raise refuse("header checksum mismatch (corrupt)")
    if magic not in (b"ustar\x0000", b"ustar  \x00"):
        raise refuse("not a ustar or GNU tar header")
    number(uid, "uid", MAX_ID)
    number(gid, "gid", MAX_ID)
    name = cstring(name)
    prefix = cstring(prefix) if magic == b"ustar\x0000" else b""
    return RawHeader(
        kind=chr(kind) if kind else "0",
        name=prefix + b"/" + name if prefix else name,
        linkname=cstring(linkname),
        size=number(size, "size", max_size),
        mode=number(mode, "mode", MAX_MODE),
        mtime=number(mtime, "mtime", MAX_MTIME),
    )


def pax_mtime(value: str) -> int:
    """The whole seconds of a PAX time, within the ustar range."""
    seconds = int(value.split(".", 1)[0])
    if not 0 <= seconds <= MAX_MTIME:
        raise refuse(f"PAX mtime {value[:40]!r} is out of range")
    return seconds
