"""Read a bank as a stream, on an allow-list, and write it back out canonically.

Every bank is untrusted input: it was produced inside a sandbox that may be hostile,
and the sandbox's tar is no safety net (BusyBox strips ``../`` and carries on; host
and sandbox parsers disagree on PAX and GNU long names). So the host never extracts
a bank to check it. It parses the gzip and tar stream itself, in bounded memory,
refuses anything outside a small allow-list with a named reason, and re-serialises
the members it accepted as a canonical archive (plain ustar/PAX, no owners, no setid
bits) — the only bytes a sandbox ever extracts.

The reader only moves forward: every size is read by the header grammar
(tar_header.py) with a range, a PAX size must equal the ustar size, and the bytes a
member consumes are exactly that size. ``feed`` and ``close`` (and GzipReader's) are
the one boundary where any exception raised while parsing becomes a named refusal
(UnreadableArchive), at bank time and at restore time alike; a failure of what
consumes the parsed stream (``on_member``/``on_data``) passes through as it is.

The accepted members go to a MemberLog on disk (manifest.py): the manifest (path,
type, size) recorded with a bank and checked against the restored tree.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

import attrs

from scratchbank.domain.errors import HostileArchive, UnreadableArchive

from .manifest import (
    DEFAULT_BUDGET,
    DIR,
    FIFO,
    FILE,
    HARDLINK,
    IMPLICIT,
    SYMLINK,
    Manifest,
    Member,
    MemberLog,
    OverBudget,
    PathTaken,
)
from .symlink_tree import first_escaping_link
from .tar_header import BLOCK, RawHeader, cstring, pax_mtime, pax_records, read_header, refuse, text

__all__ = [
    "BLOCK",
    "DIR",
    "FIFO",
    "FILE",
    "HARDLINK",
    "SYMLINK",
    "CanonicalWriter",
    "GzipReader",
    "Limits",
    "Manifest",
    "Member",
    "MemberLog",
    "TarReader",
    "dir_modes",
    "manifest_lines",
]

_KINDS = {"0": FILE, "7": FILE, "5": DIR, "2": SYMLINK, "1": HARDLINK, "6": FIFO}
_DIR_CACHE = 4096


@attrs.frozen
class Limits:
    """Caps checked while streaming (a bomb is refused before it is expanded).

    ``members`` is what a user may bank (a million tiny files fits twice over); the host's
    guard is ``member_log_bytes``, the temp disk the member log may take (manifest.py): a
    bank whose members (and implicit parents) would pass it is refused by name."""

    uncompressed_bytes: int = 4 << 30
    members: int = 2_000_000
    member_log_bytes: int = DEFAULT_BUDGET
    depth: int = 128
    name_bytes: int = 4096
    component_bytes: int = 255
    header_bytes: int = 1 << 20
    host_directory: bool = False  # links leading outside are refused too (X6)


class _Downstream(Exception):
    """A failure of the consumer of the parsed stream: re-raised as it was, unnamed here."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


@contextlib.contextmanager
def _named(state: list[HostileArchive]) -> Iterator[None]:
    """The boundary: a refusal stays a refusal; any other parse failure becomes one."""
    if state:
        raise state[0]
    try:
        yield
    except _Downstream as failure:
        raise failure.error from None
    except HostileArchive as error:
        state.append(error)
        raise
    except PathTaken as taken:
        state.append(_taken(taken))
        raise state[0] from None
    except OverBudget as over:
        state.append(
            refuse(
                f"the member log is over its temp-disk budget ({over.budget} bytes, "
                f"Limits.member_log_bytes): too many members or implicit parents"
            )
        )
        raise state[0] from None
    except Exception as error:
        state.append(UnreadableArchive(f"bank refused on the host: the parser failed ({error!r:.200})"))
        raise state[0] from error


def _taken(taken: PathTaken) -> HostileArchive:
    if taken.existing == IMPLICIT:
        return refuse(f"{taken.path!r} is a parent of earlier members but not a directory")
    return refuse(f"duplicate member {taken.path!r}")


def _call(callback: Callable[[Member], None] | Callable[[bytes], None] | None, arg: object) -> None:
    if callback is None:
        return
    try:
        callback(arg)  # type: ignore[arg-type]
    except Exception as error:
        raise _Downstream(error) from error


@attrs.define
class _Pending:
    """Extended headers read so far for the next member."""

    pax: dict[str, str] | None = None
    longname: bytes | None = None
    longlink: bytes | None = None

    def empty(self) -> bool:
        return self.pax is None and self.longname is None and self.longlink is None


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
        self.log = MemberLog(limits.member_log_bytes)
        self.total = 0
        self._buf = b""
        self._pos = 0
        self._remaining = 0  # data bytes left of the current member (or extended header)
        self._padding = 0
        self._special: tuple[str, bytearray] | None = None
        self._pending = _Pending()
        self._emit = False
        self._zero_blocks = 0
        self._ended = False
        self._refused: list[HostileArchive] = []
        self._dirs: collections.OrderedDict[str, None] = collections.OrderedDict()

    @property
    def members(self) -> MemberLog:
        """The accepted members, in order (on disk; iterate, or ``Manifest.of`` them)."""
        return self.log

    # -- the boundary ----------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        with _named(self._refused):
            self._feed(data)

    def close(self) -> None:
        with _named(self._refused):
            self._close()

    # -- moving forward ----------------------------------------------------------------
    def _feed(self, data: bytes) -> None:
        # Consume by moving an offset over the bytes fed (no copy: a member's data is
        # sliced from them once); only a partial header block is carried to the next feed.
        self._buf = self._buf[self._pos :] + data if self._pos < len(self._buf) else data
        self._pos = 0
        while self._step():
            pass
        self._buf = self._buf[self._pos :]
        self._pos = 0

    def _step(self) -> bool:
        if self._remaining or self._padding:
            return self._take_data()
        if len(self._buf) - self._pos < BLOCK:
            return False
        block = self._buf[self._pos : self._pos + BLOCK]
        self._pos += BLOCK
        self._header(block)
        return True

    def _take_data(self) -> bool:
        available = len(self._buf) - self._pos
        n = min(self._remaining, available)
        if n:
            start = self._pos
            self._pos += n
            available -= n
            self._remaining -= n
            if self._special is not None:
                self._special[1].extend(memoryview(self._buf)[start : start + n])
            elif self._emit and self.on_data is not None:  # data nobody reads is not even sliced
                _call(self.on_data, self._buf[start : start + n])
        if self._remaining:
            return False
        skip = min(self._padding, available)
        self._pos += skip
        self._padding -= skip
        if self._padding:
            return False
        if self._special is not None:
            kind, payload = self._special
            self._special = None
            self._finish_special(kind, bytes(payload))
        return True

    def _close(self) -> None:
        if self._remaining or self._padding or self._special is not None:
            raise refuse("the archive ends inside a member (truncated)")
        if not self._ended:
            raise refuse("no end-of-archive marker (truncated)")
        if any(self._buf[self._pos :]):
            raise refuse("trailing data after the end-of-archive marker")
        self.log.flush()
        if self.limits.host_directory:
            escaping = first_escaping_link(self.log)
            if escaping is not None:
                raise refuse(f"symlink {escaping[0]!r} points outside the scratch ({escaping[1]!r})")

    # -- headers ---------------------------------------------------------------------
    def _header(self, block: bytes) -> None:
        if self._ended:
            if any(block):
                raise refuse("trailing data after the end-of-archive marker")
            return
        if not any(block):
            self._zero_blocks += 1
            if self._zero_blocks == 2:
                if not self._pending.empty():
                    raise refuse("extended header with no member")
                self._ended = True
            return
        if self._zero_blocks:
            raise refuse("a lone zero block inside the archive")
        header = read_header(block, max_size=self.limits.uncompressed_bytes)
        if header.kind in "xLK":
            if header.size > self.limits.header_bytes:
                raise refuse("extended header too large")
            self._start_data(header.size, special=header.kind)
            return
        if header.kind == "g":
            raise refuse("global PAX headers are not accepted")
        if header.kind == "S":
            raise refuse("sparse members are not accepted")
        self._member(header)

    def _start_data(self, size: int, *, special: str | None = None, emit: bool = False) -> None:
        self._remaining = size
        self._padding = (-size) % BLOCK
        self._special = (special, bytearray()) if special else None
        self._emit = emit

    def _finish_special(self, kind: str, data: bytes) -> None:
        pending = self._pending
        if kind == "x":
            if pending.pax is not None:
                raise refuse("two PAX headers for one member")
            pending.pax = pax_records(data)
            return
        name = cstring(data)
        if any(data[len(name) :]):
            raise refuse("malformed GNU long name or link")
        if kind == "L":
            if pending.longname is not None:
                raise refuse("two GNU long names for one member")
            pending.longname = name
        else:
            if pending.longlink is not None:
                raise refuse("two GNU long link names for one member")
            pending.longlink = name

    def _member(self, header: RawHeader) -> None:
        pending, self._pending = self._pending, _Pending()
        pax = pending.pax or {}
        if pending.longname is not None and "path" in pax:
            raise refuse("a GNU long name combined with a PAX path")
        if pending.longlink is not None and "linkpath" in pax:
            raise refuse("a GNU long link name combined with a PAX linkpath")
        if "size" in pax and int(pax["size"]) != header.size:
            raise refuse(f"PAX size {pax['size']} contradicts the header's size {header.size}")
        raw = pax.get("path", text(pending.longname if pending.longname is not None else header.name))
        link = pax.get(
            "linkpath", text(pending.longlink if pending.longlink is not None else header.linkname)
        )
        mtime = pax_mtime(pax["mtime"]) if "mtime" in pax else header.mtime
        kind = _KINDS.get(header.kind)
        if kind is None:
            what = "device node" if header.kind in "34" else f"member type {header.kind!r} of"
            raise refuse(f"{what} {raw!r} is not accepted")
        self._accept(kind, raw, link, header.size, header.mode & 0o777, mtime)

    # -- the allow-list ---------------------------------------------------------------
    def _normalise(self, raw: str, what: str) -> str:
        if "\x00" in raw:
            raise refuse(f"NUL in a {what}")
        if raw.startswith("/"):
            raise refuse(f"absolute {what} {raw!r}")
        ascii_only = raw.isascii()  # then a length in characters is one in bytes
        if (len(raw) if ascii_only else len(raw.encode("utf-8", "surrogateescape"))) > self.limits.name_bytes:
            raise refuse(f"{what} longer than {self.limits.name_bytes} bytes")
        parts = [p for p in raw.split("/") if p not in ("", ".")]
        if (
            ascii_only
            and ".." not in parts
            and max(map(len, parts), default=0) <= self.limits.component_bytes
        ):
            if len(parts) > self.limits.depth:
                raise refuse(f"{raw!r} is deeper than {self.limits.depth}")
            return "/".join(parts)
        for part in parts:  # the refusal names the first bad part, as it always did
            if part == "..":
                raise refuse(f"'..' in {what} {raw!r}")
            if len(part.encode("utf-8", "surrogateescape")) > self.limits.component_bytes:
                raise refuse(f"a component of {raw!r} is longer than 255 bytes")
        if len(parts) > self.limits.depth:
            raise refuse(f"{raw!r} is deeper than {self.limits.depth}")
        return "/".join(parts)

    def _accept(self, kind: str, raw: str, link: str, size: int, mode: int, mtime: int) -> None:
        path = self._normalise(raw, "name")
        if kind == FILE and raw.endswith("/"):
            raise refuse(f"regular file {raw!r} named like a directory")
        if kind != FILE and size:
            raise refuse(f"{kind} {raw!r} carries data")
        if path == "" and kind != DIR:
            raise refuse("the archive's root is not a directory")
        linkname = self._linkname(kind, path, raw, link)
        if self.log.count >= self.limits.members:
            raise refuse(f"more than {self.limits.members} members")
        self.total += size
        if self.total > self.limits.uncompressed_bytes:
            raise refuse(f"more than {self.limits.uncompressed_bytes} bytes uncompressed (a bomb?)")
        member = Member(path, kind, size, mode, mtime, linkname)
        self._record(member)
        if kind != FIFO:  # a fifo holds no data and may block a restore: dropped
            _call(self.on_member, member)
        self._start_data(size, emit=kind == FILE)

    def _linkname(self, kind: str, path: str, raw: str, link: str) -> str:
        if kind == HARDLINK:
            target = self._normalise(link, "hard link target")
            if self.log.kind(target) != FILE:
                raise refuse(f"hard link {raw!r} to {link!r}, not an earlier regular file")
            return target
        if kind == SYMLINK:
            if not link or "\x00" in link:
                raise refuse(f"symlink {raw!r} with an empty or NUL target")
            if len(link.encode("utf-8", "surrogateescape")) > self.limits.name_bytes:
                raise refuse(f"symlink {raw!r} target longer than {self.limits.name_bytes} bytes")
            return link
        return ""

    def _record(self, member: Member) -> None:
        self._check_parents(member.path)
        self.log.add(member)  # a duplicate raises PathTaken (now, or when its batch lands)
        self._remember_dir(member)

    def _check_parents(self, path: str) -> None:
        # A directory in the cache had every parent of its own checked when it went in
        # (and a checked parent stays a directory: anything else at its path is a
        # duplicate), so a member whose parent is cached needs no walk.
        parent = path.rpartition("/")[0]
        if not parent or parent in self._dirs:
            return
        parts = path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in self._dirs:
                continue
            kind = self.log.kind(parent)
            if kind == SYMLINK:
                raise refuse(f"{path!r} lies under the symlink {parent!r}")
            if kind is None:
                self.log.add_implicit(parent)
            elif kind not in (DIR, IMPLICIT):
                raise refuse(f"{path!r} lies under the non-directory {parent!r}")
            self._dirs[parent] = None
            if len(self._dirs) > _DIR_CACHE:
                self._dirs.popitem(last=False)

    def _remember_dir(self, member: Member) -> None:
        if member.type == DIR and member.path:
            self._dirs[member.path] = None
            if len(self._dirs) > _DIR_CACHE:
                self._dirs.popitem(last=False)


class GzipReader:
    """Feed gzip bytes, get tar bytes, with a cap on what it expands to."""

    def __init__(self, sink: Callable[[bytes], None], limit: int) -> None:
        self._d = zlib.decompressobj(wbits=31)
        self._sink = sink
        self._limit = limit
        self._refused: list[HostileArchive] = []
        self.out = 0

    def feed(self, data: bytes) -> None:
        with _named(self._refused):
            self._feed(data)

    def close(self) -> None:
        with _named(self._refused):
            if not self._d.eof:
                raise refuse("the gzip stream is truncated")

    def _ended(self) -> bool:
        return bool(self._d.eof)

    def _feed(self, data: bytes) -> None:
        if self._ended():
            if data:
                raise refuse("trailing data after the gzip stream")
            return
        try:
            while data:
                chunk = self._d.decompress(data, 1 << 20)
                self.out += len(chunk)
                if self.out > self._limit:
                    raise refuse("the gzip stream expands past the cap (a bomb?)")
                if chunk:
                    self._pass_on(chunk)
                if self._ended():
                    if self._d.unused_data:
                        raise refuse("trailing data after the gzip stream")
                    return
                data = self._d.unconsumed_tail
        except zlib.error as error:
            raise refuse(f"corrupt gzip stream ({error})") from None

    def _pass_on(self, chunk: bytes) -> None:
        try:
            self._sink(chunk)
        except HostileArchive:
            raise
        except _Downstream:
            raise
        except Exception as error:
            raise _Downstream(error) from error


def manifest_lines(members: Iterable[Member]) -> list[str]:
    """One JSON line per member (root excluded), sorted: the bank's expected tree.

    Hard links count as the regular files they are once extracted; a symlink's size is
    its target's length; directories have no size.
    """
    if isinstance(members, MemberLog):
        return list(members.lines())
    log = MemberLog()
    try:
        for m in members:
            log.add(m)
        return list(log.lines())
    finally:
        log.close()


class CanonicalWriter:
    """Writes accepted members back out as a plain PAX archive (gzip optional).

    Every header is built from the validated member (normalised path, kind, size,
    mode without setid bits, mtime in range, owners 0 and unnamed); no raw field of
    the bank is ever copied.
    """

    def __init__(self, out: BinaryIO, *, gzip_level: int | None = None, writable_dirs: bool = False) -> None:
        self._out = out
        self._writable_dirs = writable_dirs
        self._z = zlib.compressobj(gzip_level, zlib.DEFLATED, 31) if gzip_level is not None else None
        self._pending = 0
        self.bytes = 0
        self.tar_bytes = 0
        self._digest = hashlib.sha256()

    def _write(self, data: bytes) -> None:
        self.tar_bytes += len(data)
        if self._z is not None:
            data = self._z.compress(data)
        if data:
            self._out.write(data)
            self.bytes += len(data)
            self._digest.update(data)

    def _emit(self, data: bytes) -> None:
        if data:
            self._out.write(data)
            self.bytes += len(data)
            self._digest.update(data)

    def member(self, m: Member) -> None:
        """Write a member's header; with ``writable_dirs`` a directory is written u+rwx
        (its banked mode is applied after extraction: ``dir_modes``)."""
        header = header_of(m, m.mode | 0o700) if self._writable_dirs and m.type == DIR else header_of(m)
        if self._pending:  # the previous member's padding and this header: one write
            header = bytes(self._pending) + header
            self._pending = 0
        self._write(header)
        self._pending = (-m.size) % BLOCK if m.type == FILE else 0

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
            self._emit(self._z.flush())
        return self._digest.hexdigest()


def dir_modes(log: MemberLog) -> Iterator[tuple[str, int]]:
    """The directories whose banked mode is not u+rwx, deepest first (the root last, as
    ""): a non-root tar (BusyBox's) cannot fill a 0555 directory it has just made, so a
    sandbox stream writes directories u+rwx and these modes are applied after."""
    for d in log.members_of(DIR, deepest_first=True):
        if d.mode & 0o700 != 0o700:
            yield d.path, d.mode & 0o777


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
