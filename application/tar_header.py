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

import attrs

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

_OCTAL_DIGITS = b"01234567"
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
    if field[:1] == b"\x80":
        value = int.from_bytes(field[1:], "big")
    elif field[:1] and field[0] & 0x80:
        raise refuse(f"negative or malformed base-256 number in the {what} field")
    else:
        digits = field.lstrip(b" ").rstrip(b" \x00")
        if digits.translate(None, _OCTAL_DIGITS):
            raise refuse(f"bad number in the {what} field")
        value = int(digits or b"0", 8)
    if value > high:
        raise refuse(f"the {what} field ({value}) is out of range")
    return value


def checksum_ok(block: bytes) -> bool:
    """The header checksum, unsigned sum only (what every tar writes)."""
    stored = number(block[148:156], "checksum", 8 * 255 * BLOCK)
    return stored == sum(block) - sum(block[148:156]) + 8 * 32


def cstring(field: bytes) -> bytes:
    return field.split(b"\x00", 1)[0]


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


@attrs.frozen
class RawHeader:
    """One header block's fields, each read by the grammar and within its range."""

    kind: str
    name: bytes
    linkname: bytes
    size: int
    mode: int
    mtime: int


def read_header(block: bytes, *, max_size: int) -> RawHeader:
    """Parse a (non-zero) header block; refuse any field off the grammar or its range."""
    if not checksum_ok(block):
        raise refuse("header checksum mismatch (corrupt)")
    magic = block[257:265]
    if magic not in (b"ustar\x0000", b"ustar  \x00"):
        raise refuse("not a ustar or GNU tar header")
    for field, what in ((block[108:116], "uid"), (block[116:124], "gid")):
        number(field, what, MAX_ID)
    name = cstring(block[0:100])
    prefix = cstring(block[345:500]) if magic == b"ustar\x0000" else b""
    return RawHeader(
        kind=chr(block[156]) if block[156] else "0",
        name=prefix + b"/" + name if prefix else name,
        linkname=cstring(block[157:257]),
        size=number(block[124:136], "size", max_size),
        mode=number(block[100:108], "mode", MAX_MODE),
        mtime=number(block[136:148], "mtime", MAX_MTIME),
    )


def pax_mtime(value: str) -> int:
    """The whole seconds of a PAX time, within the ustar range."""
    seconds = int(value.split(".", 1)[0])
    if not 0 <= seconds <= MAX_MTIME:
        raise refuse(f"PAX mtime {value[:40]!r} is out of range")
    return seconds
