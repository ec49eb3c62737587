"""The tar reader: a bank read as a stream, on an allow-list (``TarReader``, ``Limits``).

Every bank is untrusted input: it was produced inside a sandbox that may be hostile,
and the sandbox's tar is no safety net (BusyBox strips ``../`` and carries on; host
and sandbox parsers disagree on PAX and GNU long names). So the host never extracts
a bank to check it. It parses the gzip and tar stream itself, in bounded memory,
refuses anything outside a small allow-list with a named reason; the canonical writer
(writer.py) re-serialises the members it accepted as a canonical archive (plain
ustar/PAX, no owners, no setid bits) — the only bytes a sandbox ever extracts.

The reader only moves forward: every size is read by the header grammar
(tar_header.py) with a range, a PAX size must equal the ustar size, and the bytes a
member consumes are exactly that size. ``feed`` and ``close`` (and gunzip.py's) are
the one boundary where any exception raised while parsing becomes a named refusal
(UnreadableArchive), at bank time and at restore time alike; a failure of what
consumes the parsed stream (``on_member``/``on_data``) passes through as it is.

The accepted members go to a MemberLog (spill_log.py: in memory for a small bank, on disk
past one batch): the manifest (path, type, size) recorded with a bank and checked against
the restored tree.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator

import attrs

from scratchbank.domain.errors import HostileArchive, UnreadableArchive

from .link_containment import first_escaping_link
from .members import DIR, FIFO, FILE, HARDLINK, IMPLICIT, SYMLINK, Member, PathTaken
from .spill_log import DEFAULT_BUDGET, MemberLog, OverBudget
from .tar_header import BLOCK, RawHeader, cstring, pax_mtime, pax_records, read_header, refuse, text

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
        self.log.finish()
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
