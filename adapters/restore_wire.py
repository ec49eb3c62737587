"""The restore script's wire protocol (restore.sh), host side: the framing of the
stream into the sandbox (data frames, the end frame with the host's digest), the
conversation of a one-exec restore (listing, awaiting the verdict, commit and the
directory modes, or discard), the staged tree's listing read back as manifest lines,
and its exit codes.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

from scratchbank.application.bank_format.manifest_line import line_of
from scratchbank.application.ports import (
    ByteSink,
    StagedRestore,
)
from scratchbank.domain.errors import (
    OutputOverBound,
    StreamBroken,
)

from .exec_output import LIST_BYTES, QUIET_BYTES, SAID_CHARS, ExecResult, said

STREAM_BROKE, TAR_REFUSED, DISCARDED = 20, 21, 22
#: a listing line's stats ("MODEHEX SIZE\n") and name ("./" + 4096 bytes + NUL) at most
ENTRY_BYTES = 32 + 4100


def listing_bound(entries: int | None) -> int:
    """The bytes a restore's listing may take: what ``entries`` entries can need, twice
    over (implicit parents), at least 1 MiB; LIST_BYTES when the count is not known."""
    if entries is None:
        return LIST_BYTES
    return max(1 << 20, 2 * entries * ENTRY_BYTES)


def _mode_kind(mode_hex: str) -> str:
    fmt = int(mode_hex, 16) & 0o170000
    return {0o100000: "file", 0o040000: "dir", 0o120000: "symlink", 0o010000: "fifo"}.get(fmt, "other")


#: GNU find's %y letters (restore.sh's one-walk ":TYPE SIZE" lines); any other is "other"
_LETTER_KINDS = {b":f": "file", b":d": "dir", b":l": "symlink", b":p": "fifo"}
_OTHER_LETTERS = frozenset({b":s", b":c", b":b", b":D", b":U", b":?"})


def _letter_kind(word: bytes) -> str:
    kind = _LETTER_KINDS.get(word)
    if kind is None:
        if word not in _OTHER_LETTERS:
            raise ValueError(word)
        kind = "other"
    return kind


# -- the restore script's framing and listing ------------------------------------------------
_PLAIN = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/+,=@")


def printf_escaped(path: str) -> bytes:
    """A path as one word of ASCII for ``printf %b`` ("." for the root): every byte not
    plainly safe as ``\\0ooo``, so a name may hold a space, a newline, any byte."""
    if not path:
        return b"."
    raw = path.encode("utf-8", "surrogateescape")
    return b"".join(bytes([c]) if c in _PLAIN else b"\\0%03o" % c for c in raw)


def write_modes(dir_modes: Iterable[tuple[str, int]], out: BinaryIO) -> None:
    """The directory modes as restore.sh's commit reads them ("OCTAL ESCAPED-NAME"
    lines, deepest first), then back to the file's start."""
    for path, mode in dir_modes:
        out.write(b"%o %s\n" % (mode, printf_escaped(path)))
    out.seek(0)


def commit_notes(done: ExecResult) -> str:
    """What a commit left behind, from its stderr's note lines ("" when nothing)."""
    lines = done.stderr.split(b"\n")
    notes = [said(line, 300) for line in lines if line.startswith(b"scratchbank: note:")]
    return "; ".join(notes)[:SAID_CHARS]


class FramedStream:
    """``src`` as restore.sh reads it: "data N\\n" + N bytes per frame, then
    "end COUNT MD5\\n" once ``src`` ends (so no EOF is needed; v4 cannot send one).

    Its MD5 is the host's one digest of the stream (the canonical writer takes none for a
    sandbox: issue 24): what the sandbox's ``md5sum`` must find, a check of the way in
    (the sandbox that sums is the one the bytes go to: it could report any sum), at a third of BusyBox's
    ``sha256sum`` CPU (ADR 0003). 4 MiB frames: the sandbox runs one ``dd`` per frame (a
    1 GB stream was ~1,000 processes at 1 MiB, 256 now)."""

    FRAME = 1 << 22

    def __init__(self, src: BinaryIO) -> None:
        self._src = src
        self._digest = hashlib.md5(usedforsecurity=False)
        self._pending: collections.deque[bytes] = collections.deque()  # a frame's head and payload
        self._at = 0  # into the first pending piece
        self._ended = False
        self.sent = 0

    @property
    def digest(self) -> str:
        return self._digest.hexdigest()

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all with ``n`` < 0), b"" once the end frame is out: a piece
        of a frame as read, never the frame copied into a buffer and cut from its front
        (that cost a 4 MiB frame 3.7x a 1 MiB one's host CPU)."""
        if n < 0:
            return b"".join(iter(lambda: self.read(1 << 30), b""))
        while not self._pending and not self._ended:
            self._next_frame()
        if not self._pending:
            return b""
        head = self._pending[0]
        if self._at == 0 and len(head) <= n:
            return self._pending.popleft()
        piece = head[self._at : self._at + n]
        self._at += len(piece)
        if self._at >= len(head):
            self._pending.popleft()
            self._at = 0
        return piece

    def _next_frame(self) -> None:
        chunks, size = [], 0
        while size < self.FRAME:
            chunk = self._src.read(self.FRAME - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size:
            for chunk in chunks:
                self._digest.update(chunk)
            self.sent += size
            self._pending.append(b"data %d\n" % size)
            self._pending.extend(chunks)
        else:
            self._pending.append(b"end %d %s\n" % (self.sent, self.digest.encode()))
            self._ended = True


class _ThenVerdict:
    """stdin of a conversing restore: the framed stream, then (blocking until the host
    answers) "commit\n" and the framed directory modes, or "discard\n"."""

    def __init__(self, framed: FramedStream) -> None:
        self._framed = framed
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._tail: FramedStream | None = None
        self._head = b""
        self.committed = False

    def discard(self) -> None:
        self.answer(None)

    #: the exec ended (exec_pump): a read waiting for the verdict returns (a discard)
    abandon = discard

    def answer(self, modes: BinaryIO | None) -> None:
        """The verdict, once (later calls do nothing): modes to commit with, or None."""
        with self._lock:
            if self._ready.is_set():
                return
            if modes is not None:
                self._head, self._tail, self.committed = b"commit\n", FramedStream(modes), True
            else:
                self._head = b"discard\n"
            self._ready.set()

    def read(self, n: int = -1) -> bytes:
        data = self._framed.read(n)
        if data:
            return data
        self._ready.wait()
        if self._head:
            data, self._head = self._head, b""
            return data
        return self._tail.read(n) if self._tail is not None else b""


class _Conversation:
    """stdout of a conversing restore: kept in ``raw`` up to the end of the listing the
    script announced and its "awaiting verdict" line; then ``then`` runs (in the reading
    thread). What it raises is kept (``error``) and answered with a discard, never raised
    into the transport. Bounded (ADR 0008): the listing by ``bound``; any byte between
    the announced listing and that line, or a listing announced past ``bound``, is
    OutputOverBound (the exec is cut, the verdict a discard); after the verdict, output
    past ``after`` bytes is cut too, unless the verdict was commit (then it is dropped:
    the commit's exit status says whether the tree is in place)."""

    HEAD = 512
    MARK = b"scratchbank-awaiting-verdict\n"

    def __init__(
        self,
        raw: BinaryIO,
        then: Callable[[], None],
        *,
        give_up: Callable[[], None],
        bound: int = LIST_BYTES,
        after: int = QUIET_BYTES,
        committed: Callable[[], bool] = lambda: False,
    ) -> None:
        self._raw, self._then, self._give_up = raw, then, give_up
        self._bound, self._after, self._committed = bound, after, committed
        self._head = bytearray()
        self._need: int | None = None
        self.got = 0
        self.answered = False
        self.error: BaseException | None = None

    def write(self, data: bytes) -> int:
        self.got += len(data)
        if self.answered:
            return self._after_verdict(len(data))
        limit = self._bound if self._need is None else self._need
        if self.got > limit:
            what = "announced" if self._need is not None else "its bound"
            self._over(f"the restore script printed past the listing {what} ({limit} bytes)")
        self._raw.write(data)
        if self._need is None and len(self._head) < self.HEAD:
            self._head += data[: self.HEAD - len(self._head)]
            self._need = self._needed()
        if not self.answered and self._need is not None and self.got >= self._need:
            self._raw.flush()
            mark = os.pread(self._raw.fileno(), len(self.MARK), self._need - len(self.MARK))
            if mark != self.MARK:
                self._over("the restore script's listing did not end where it announced")
            self._answer()
        return len(data)

    def _after_verdict(self, n: int) -> int:
        past = self.got - (self._need or 0)
        if past > self._after and not self._committed():
            self._over(f"the restore script printed more than {self._after} bytes after its listing")
        return n

    def _over(self, why: str) -> None:
        error = OutputOverBound(f"{why}: the exec was cut")
        if self.error is None:
            self._fail(error)
        raise error

    def _needed(self) -> int | None:
        """Bytes of output up to the "awaiting verdict" line, once the two head lines are in."""
        lines = bytes(self._head).split(b"\n", 2)
        if len(lines) < 3:
            if len(self._head) >= self.HEAD:
                self._fail(
                    StreamBroken(f"unreadable output of the restore script: {bytes(self._head[:80])!r}")
                )
            return None
        try:
            stats, names = _tree_sizes(lines[1])
        except StreamBroken as error:
            self._fail(error)
            return None
        need = len(lines[0]) + len(lines[1]) + 2 + stats + names + len(self.MARK)
        if need > self._bound:
            self._fail(
                OutputOverBound(
                    f"the restore's listing announces {need} bytes, past its bound of {self._bound}"
                )
            )
            return None
        return need

    def _answer(self) -> None:
        self.answered = True
        self._raw.flush()
        at = self._raw.tell()
        try:
            self._then()
        except BaseException as error:  # raised by the caller once the exec has ended
            self._fail(error)
        finally:
            self._raw.seek(at)

    def _fail(self, error: BaseException) -> None:
        self.error, self.answered = error, True
        self._give_up()


def _staged_header(raw: BinaryIO, token: str) -> StagedRestore:
    raw.seek(0)
    words = raw.readline(200).split()
    if len(words) != 3 or words[0] != b"scratchbank-staged" or not words[1].isdigit():
        raise StreamBroken("the restore script did not confirm what it staged")
    return StagedRestore(token, int(words[1]), words[2].decode("ascii", "replace"))


def _tree_sizes(line: bytes) -> tuple[int, int]:
    """restore.sh's "STATS_BYTES NAMES_BYTES" line."""
    words = line.split()
    if len(words) != 2 or not all(w.isdigit() and len(w) < 16 for w in words):
        raise StreamBroken(f"unreadable listing from the sandbox: {line[:60]!r}")
    return int(words[0]), int(words[1])


#: A batch of GNU find's one-walk stats lines whose sizes print as ``int`` prints them,
#: and a batch of names that are their own JSON string ("./", then printable ASCII but
#: ``"`` and ``\``): such a batch is written by one comprehension (issue 24 item 2), not
#: an entry at a time through ``_manifest_line``; any other batch goes through it.
_PLAIN_STATS = re.compile(rb"(?::[fdlp] (?:0|[1-9][0-9]{0,17})\n)*+")
_PLAIN_NAMES = re.compile(rb"(?:\./[\x20\x21\x23-\x5b\x5d-\x7e]*+\x00)*+")
_KIND_WORDS = {
    ord(letter): b'", "%s", ' % kind
    for letter, kind in ((b"f", b"file"), (b"d", b"dir"), (b"l", b"symlink"), (b"p", b"fifo"))
}
_DIR = ord("d")


def write_listing(raw: BinaryIO, out: ByteSink) -> None:
    """restore.sh's listing (the byte counts of stats and names, "MODEHEX SIZE" lines,
    NUL-separated names in the same order), read from ``raw``'s current position,
    written to ``out`` as manifest lines, in bounded memory (two cursors over one file),
    a batch of names (64 KiB of them) at a time."""
    stats_bytes, names_bytes = _tree_sizes(raw.readline(40))
    fd, at = raw.fileno(), raw.tell()
    stats = itertools.chain.from_iterable(_records(fd, at, at + stats_bytes, b"\n"))
    for names in _records(fd, at + stats_bytes, at + stats_bytes + names_bytes, b"\x00"):
        lines = list(itertools.islice(stats, len(names)))
        out.write(_written(lines, names[: len(lines)]))
        if len(lines) < len(names):
            raise StreamBroken("the sandbox's listing has more names than entries")
    if next(stats, None) is not None:
        raise StreamBroken("the sandbox's listing has more entries than names")


def _written(stats: list[bytes], names: list[bytes]) -> bytes:
    """A batch of entries as manifest lines: plain ones by one comprehension, others each."""
    if (
        stats
        and _PLAIN_STATS.fullmatch(b"\n".join(stats) + b"\n") is not None
        and _PLAIN_NAMES.fullmatch(b"\x00".join(names) + b"\x00") is not None
    ):
        words = _KIND_WORDS
        return b"".join(
            [
                b'["' + n[2:] + words[s[1]] + (b"0" if s[1] == _DIR else s[3:]) + b"]\n"
                for s, n in zip(stats, names, strict=True)
            ]
        )
    return "".join([_manifest_line(s, n) for s, n in zip(stats, names, strict=True)]).encode("ascii")


def _records(fd: int, start: int, end: int | None, sep: bytes) -> Iterator[list[bytes]]:
    """Records ending in ``sep`` between two offsets of a file (pread: its own cursor), a
    64 KiB read's worth at a time."""
    pending: list[bytes] = []  # a long record's pieces, each read once (a name of many reads
    # copied whole again per read cost its length squared)
    offset = start
    while end is None or offset < end:
        chunk = os.pread(fd, 1 << 16 if end is None else min(1 << 16, end - offset), offset)
        if not chunk:
            break
        offset += len(chunk)
        if sep not in chunk:
            pending.append(chunk)
            continue
        first, *complete, last = chunk.split(sep)
        yield [b"".join([*pending, first]), *complete]
        pending = [last] if last else []
    if pending:
        raise StreamBroken("the sandbox's listing ends inside an entry")


def _manifest_line(stat_line: bytes, name: bytes) -> str:
    words = stat_line.split()
    if len(words) != 2 or not name.startswith(b"./") or not words[1].isdigit():
        raise StreamBroken(f"unreadable listing entry {stat_line[:60]!r} {name[:60]!r}")
    try:
        kind = _letter_kind(words[0]) if words[0][:1] == b":" else _mode_kind(words[0].decode("ascii"))
    except ValueError:
        raise StreamBroken(f"unreadable mode in the listing: {stat_line[:60]!r}") from None
    path = name[2:].decode("utf-8", "surrogateescape")
    return line_of(path, kind, 0 if kind == "dir" else int(words[1])) + "\n"
