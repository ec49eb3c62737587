"""Read a bank as a stream, on an allow-list, and write it back out canonically.

Every bank is untrusted input: it was produced inside a sandbox that may be hostile,
and the sandbox's tar is no safety net (BusyBox strips ``../`` and carries on; host
and sandbox parsers disagree on PAX and GNU long names). So the host never extracts
a bank to check it. It parses the gzip and tar stream itself, in bounded memory,
refuses anything outside a small allow-list with a named reason, and re-serialises
the members it accepted as a canonical archive (plain ustar/PAX, no owners, no setid
bits) — the only bytes a sandbox ever extracts.

The same parse gives the manifest (path, type, size) recorded with a bank and
checked against the restored tree.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import zlib
from collections.abc import Callable
from typing import BinaryIO

import attrs

from scratchbank.domain.errors import HostileArchive

BLOCK = 512
FILE, DIR, SYMLINK, HARDLINK, FIFO = "file", "dir", "symlink", "hardlink", "fifo"


@attrs.frozen
class Limits:
    """Caps checked while streaming (a bomb is refused before it is expanded)."""

    uncompressed_bytes: int = 4 << 30
    members: int = 200_000
    depth: int = 128
    name_bytes: int = 4096
    component_bytes: int = 255
    header_bytes: int = 1 << 20
    host_directory: bool = False  # links pointing outside are refused too (X6)


@attrs.frozen
class Member:
    path: str  # normalised, relative, no "./"; "" is the archive's root directory
    type: str
    size: int
    mode: int
    mtime: int
    linkname: str = ""


def _refuse(why: str) -> HostileArchive:
    return HostileArchive(f"bank refused on the host: {why}")


def _octal(field: bytes, what: str) -> int:
    if field and field[0] & 0x80:  # GNU base-256
        value = int.from_bytes(field, "big") & ~(0x80 << (8 * (len(field) - 1)))
        return value
    text = field.rstrip(b"\x00 ").lstrip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise _refuse(f"bad number in the {what} field") from None


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _cstring(field: bytes) -> bytes:
    return field.split(b"\x00", 1)[0]


def _pax(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            raise _refuse("malformed PAX header")
        try:
            length = int(data[pos:space])
        except ValueError:
            raise _refuse("malformed PAX header length") from None
        record = data[space + 1 : pos + length]
        if length <= 0 or pos + length > len(data) or not record.endswith(b"\n"):
            raise _refuse("malformed PAX record")
        key, sep, value = record[:-1].partition(b"=")
        if not sep:
            raise _refuse("malformed PAX record")
        out[_text(key)] = _text(value)
        pos += length
    return out


class TarReader:
    """An incremental tar parser: ``feed`` raw tar bytes, ``close`` at the end.

    Calls ``on_member`` for each accepted member before its data, then ``on_data`` with
    its data in chunks. Raises HostileArchive, naming why, on anything off the list.
    """

    def __init__(
        self,
        limits: Limits = Limits(),
        on_member: Callable[[Member], None] | None = None,
        on_data: Callable[[bytes], None] | None = None,
    ) -> None:
        self.limits = limits
        self.on_member = on_member
        self.on_data = on_data
        self.members: list[Member] = []
        self.total = 0
        self._buf = bytearray()
        self._pos = 0
        self._state = "header"
        self._remaining = 0  # data bytes left of the current member
        self._padding = 0
        self._special: tuple[str, bytearray] | None = None  # PAX / GNU long name being read
        self._pax: dict[str, str] = {}
        self._longname: str | None = None
        self._longlink: str | None = None
        self._zero_blocks = 0
        self._ended = False
        self._seen: dict[str, str] = {}
        self._emit_data = False

    # -- feeding ----------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        # Consume by moving an offset, compacting once per feed: deleting from the
        # front of the buffer per block would copy it again for every member.
        self._buf += data
        try:
            while True:
                if self._state == "data":
                    if not self._take_data():
                        return
                elif len(self._buf) - self._pos >= BLOCK:
                    block = bytes(self._buf[self._pos : self._pos + BLOCK])
                    self._pos += BLOCK
                    self._header(block)
                else:
                    return
        finally:
            del self._buf[: self._pos]
            self._pos = 0

    def _take_data(self) -> bool:
        available = len(self._buf) - self._pos
        if self._remaining:
            n = min(self._remaining, available)
            if n == 0:
                return False
            chunk = bytes(self._buf[self._pos : self._pos + n])
            self._pos += n
            available -= n
            self._remaining -= n
            if self._special is not None:
                self._special[1].extend(chunk)
            elif self._emit_data and self.on_data is not None:
                self.on_data(chunk)
            if self._remaining:
                return False
        if self._padding:
            n = min(self._padding, available)
            self._pos += n
            self._padding -= n
            if self._padding:
                return False
        self._state = "header"
        if self._special is not None:
            kind, data = self._special
            self._special = None
            self._finish_special(kind, bytes(data))
        return True

    def close(self) -> None:
        if self._state == "data" or self._special is not None:
            raise _refuse("the archive ends inside a member (truncated)")
        if not self._ended:
            raise _refuse("no end-of-archive marker (truncated)")
        if any(self._buf[self._pos :]):
            raise _refuse("trailing data after the end-of-archive marker")

    # -- headers ----------------------------------------------------------------------
    def _header(self, block: bytes) -> None:
        if self._ended:
            if any(block):
                raise _refuse("trailing data after the end-of-archive marker")
            return
        if not any(block):
            self._zero_blocks += 1
            if self._zero_blocks == 2:
                if self._pax or self._longname or self._longlink:
                    raise _refuse("extended header with no member")
                self._ended = True
            return
        if self._zero_blocks:
            raise _refuse("a lone zero block inside the archive")
        stored = _octal(block[148:156], "checksum")
        computed = sum(block[:148]) + 8 * 32 + sum(block[156:])
        if stored != computed:
            raise _refuse("header checksum mismatch (corrupt)")
        kind = chr(block[156]) if block[156] else "0"
        size = _octal(block[124:136], "size")
        if kind in "xLK":
            if size > self.limits.header_bytes:
                raise _refuse("extended header too large")
            self._start_data(size, special=kind)
            return
        self._member(block, kind, size)

    def _start_data(self, size: int, *, special: str | None = None, emit: bool = False) -> None:
        self._remaining = size
        self._padding = (-size) % BLOCK
        self._special = (special, bytearray()) if special else None
        self._emit_data = emit
        self._state = "data"

    def _finish_special(self, kind: str, data: bytes) -> None:
        if kind == "x":
            self._pax.update(_pax(data))
        elif kind == "L":
            if self._longname is not None:
                raise _refuse("two GNU long names for one member")
            self._longname = _text(_cstring(data))
        else:
            self._longlink = _text(_cstring(data))

    def _member(self, block: bytes, kind: str, size: int) -> None:
        pax, self._pax = self._pax, {}
        longname, self._longname = self._longname, None
        longlink, self._longlink = self._longlink, None
        if kind == "g":
            raise _refuse("global PAX headers are not accepted")
        if any(k.startswith("GNU.sparse") for k in pax) or kind == "S":
            raise _refuse("sparse members are not accepted")
        if longname is not None and "path" in pax:
            raise _refuse("a GNU long name combined with a PAX path")
        name = _cstring(block[0:100])
        if block[257:263] == b"ustar\x00":
            prefix = _cstring(block[345:500])
            if prefix:
                name = prefix + b"/" + name
        path_text = pax.get("path", longname if longname is not None else _text(name))
        link_text = pax.get("linkpath", longlink if longlink is not None else _text(_cstring(block[157:257])))
        if "size" in pax:
            try:
                size = int(pax["size"])
            except ValueError:
                raise _refuse("bad PAX size") from None
        try:
            mtime = int(float(pax["mtime"])) if "mtime" in pax else _octal(block[136:148], "mtime")
        except ValueError:
            raise _refuse("bad PAX mtime") from None
        mode = _octal(block[100:108], "mode") & 0o777  # setuid, setgid, sticky cleared
        self._accept(kind, path_text, link_text, size, mode, mtime)

    # -- the allow-list ---------------------------------------------------------------
    def _normalise(self, raw: str, what: str) -> str:
        if "\x00" in raw:
            raise _refuse(f"NUL in a {what}")
        if raw.startswith("/"):
            raise _refuse(f"absolute {what} {raw!r}")
        encoded = raw.encode("utf-8", "surrogateescape")
        if len(encoded) > self.limits.name_bytes:
            raise _refuse(f"{what} longer than {self.limits.name_bytes} bytes")
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        for part in parts:
            if part == "..":
                raise _refuse(f"'..' in {what} {raw!r}")
            if len(part.encode("utf-8", "surrogateescape")) > self.limits.component_bytes:
                raise _refuse(f"a component of {raw!r} is longer than 255 bytes")
        if len(parts) > self.limits.depth:
            raise _refuse(f"{raw!r} is deeper than {self.limits.depth}")
        return "/".join(parts)

    def _accept(self, kind: str, raw: str, link: str, size: int, mode: int, mtime: int) -> None:
        path = self._normalise(raw, "name")
        if kind in "07":
            if raw.endswith("/"):
                raise _refuse(f"regular file {raw!r} named like a directory")
            mtype = FILE
        elif kind == "5":
            mtype = DIR
        elif kind == "2":
            mtype = SYMLINK
        elif kind == "1":
            mtype = HARDLINK
        elif kind == "6":
            mtype = FIFO
        elif kind in "34":
            raise _refuse(f"device node {raw!r}")
        else:
            raise _refuse(f"member type {kind!r} of {raw!r} is not accepted")
        if mtype != FILE and size:
            raise _refuse(f"{mtype} {raw!r} carries data")
        if path == "" and mtype != DIR:
            raise _refuse("the archive's root is not a directory")
        if path in self._seen:
            raise _refuse(f"duplicate member {path!r}")
        self._check_parents(path)
        linkname = ""
        if mtype == HARDLINK:
            target = self._normalise(link, "hard link target")
            if self._seen.get(target) != FILE:
                raise _refuse(f"hard link {path!r} to {link!r}, not an earlier regular file")
            linkname, size = target, 0
        elif mtype == SYMLINK:
            linkname = link
            if self.limits.host_directory and not self._inside(path, link):
                raise _refuse(f"symlink {path!r} points outside the scratch ({link!r})")
        if len(self._seen) >= self.limits.members:
            raise _refuse(f"more than {self.limits.members} members")
        self.total += size
        if self.total > self.limits.uncompressed_bytes:
            raise _refuse(f"more than {self.limits.uncompressed_bytes} bytes uncompressed (a bomb?)")
        self._seen[path] = mtype
        member = Member(path, mtype, size, mode, mtime, linkname)
        if mtype != FIFO:  # a fifo holds no data and may block a restore: dropped
            self.members.append(member)
            if self.on_member is not None:
                self.on_member(member)
        self._start_data(size, emit=mtype == FILE)

    def _check_parents(self, path: str) -> None:
        parts = path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            kind = self._seen.get(parent)
            if kind == SYMLINK:
                raise _refuse(f"{path!r} lies under the symlink {parent!r}")
            if kind is not None and kind != DIR:
                raise _refuse(f"{path!r} lies under the non-directory {parent!r}")

    @staticmethod
    def _inside(path: str, target: str) -> bool:
        if target.startswith("/"):
            return False
        depth = len(path.split("/")) - 1
        for part in target.split("/"):
            if part == "..":
                depth -= 1
                if depth < 0:
                    return False
            elif part not in ("", "."):
                depth += 1
        return True


class GzipReader:
    """Feed gzip bytes, get tar bytes, with a cap on what it expands to."""

    def __init__(self, sink: Callable[[bytes], None], limit: int) -> None:
        self._d = zlib.decompressobj(wbits=31)
        self._sink = sink
        self._limit = limit
        self.out = 0

    def _ended(self) -> bool:
        return bool(self._d.eof)

    def feed(self, data: bytes) -> None:
        if self._ended():
            if data:
                raise _refuse("trailing data after the gzip stream")
            return
        try:
            while data:
                chunk = self._d.decompress(data, 1 << 20)
                self.out += len(chunk)
                if self.out > self._limit:
                    raise _refuse("the gzip stream expands past the cap (a bomb?)")
                if chunk:
                    self._sink(chunk)
                if self._ended():
                    if self._d.unused_data:
                        raise _refuse("trailing data after the gzip stream")
                    return
                data = self._d.unconsumed_tail
        except zlib.error as error:
            raise _refuse(f"corrupt gzip stream ({error})") from None

    def close(self) -> None:
        if not self._d.eof:
            raise _refuse("the gzip stream is truncated")


def manifest_lines(members: list[Member]) -> list[str]:
    """One JSON line per member (root excluded), sorted: the bank's expected tree.

    Hard links count as the regular files they are once extracted; a symlink's size is
    its target's length; directories have no size.
    """
    sizes = {m.path: m.size for m in members if m.type == FILE}
    lines = []
    for m in members:
        if m.path == "":
            continue
        if m.type == HARDLINK:
            kind, size = FILE, sizes.get(m.linkname, 0)
        elif m.type == SYMLINK:
            kind, size = SYMLINK, len(m.linkname.encode("utf-8", "surrogateescape"))
        elif m.type == DIR:
            kind, size = DIR, 0
        else:
            kind, size = m.type, m.size
        lines.append(json.dumps([m.path, kind, size]))
    return sorted(lines)


@attrs.frozen
class Manifest:
    entries: int
    bytes: int
    sha256: str

    @classmethod
    def of(cls, members: list[Member]) -> Manifest:
        lines = manifest_lines(members)
        digest = hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()
        total = sum(m.size for m in members if m.type == FILE)
        return cls(len(lines), total, digest)


class CanonicalWriter:
    """Writes accepted members back out as a plain PAX archive (gzip optional)."""

    def __init__(self, out: BinaryIO, *, gzip_level: int | None = None) -> None:
        self._out = out
        self._z = zlib.compressobj(gzip_level, zlib.DEFLATED, 31) if gzip_level is not None else None
        self._pending = 0
        self.bytes = 0
        self._digest = hashlib.sha256()

    def _write(self, data: bytes) -> None:
        if self._z is not None:
            data = self._z.compress(data)
        if data:
            self._out.write(data)
            self.bytes += len(data)
            self._digest.update(data)

    def member(self, m: Member) -> None:
        self._pad()
        info = tarfile.TarInfo(m.path + "/" if m.type == DIR and m.path else (m.path or "."))
        info.type = {
            FILE: tarfile.REGTYPE,
            DIR: tarfile.DIRTYPE,
            SYMLINK: tarfile.SYMTYPE,
            HARDLINK: tarfile.LNKTYPE,
        }[m.type]
        info.size = m.size if m.type == FILE else 0
        info.mode = m.mode
        info.mtime = m.mtime
        info.linkname = m.linkname
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        self._write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        self._pending = (-info.size) % BLOCK

    def data(self, chunk: bytes) -> None:
        self._write(chunk)

    def _pad(self) -> None:
        if self._pending:
            self._write(b"\x00" * self._pending)
            self._pending = 0

    def finish(self) -> str:
        """End the archive; return the SHA-256 of every byte written."""
        self._pad()
        self._write(b"\x00" * (2 * BLOCK))
        if self._z is not None:
            tail = self._z.flush()
            self._out.write(tail)
            self.bytes += len(tail)
            self._digest.update(tail)
        return self._digest.hexdigest()
