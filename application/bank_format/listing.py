"""A staged tree's listing (manifest lines a sandbox wrote to a host file), compared
with the bank's manifest, so the host does not grow with the member count.

The comparison is a merge of two sorted streams (issue 24): the listing's lines sorted
on the host in bounded memory (runs of ``RUN_BYTES`` sorted in memory, spilled to
temporary files past the first, merged back), against the member log's manifest lines
in the same byte order (its index). No row per listed entry lands anywhere; memory is a
run's whatever the member count.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

from scratchbank.domain.errors import StreamBroken

from .manifest_line import line_of, parse_line
from .members import DIR, IMPLICIT, Comparison
from .spill_log import MemberLog, OverBudget

_BATCH_BYTES = 1 << 19
#: the memory a run's lines may take, sorted at once (a run); a longer listing spills runs to disk
RUN_BYTES = 4 << 20
#: what a line held in memory costs besides its bytes (a bytes object's header, a list slot)
_OBJECT_BYTES = 41
#: runs spilled before they are merged into one (each read back holds ~150 KB)
_MAX_RUNS = 16
#: lines compared a block at a time while the two streams agree (a list compare, in C)
_BLOCK = 4096

_LINE = (
    rb'\["(?:[\x20\x21\x23-\x5b\x5d-\x7e]++|\\["\\bfnrt])*+", '
    rb'"(?:file|dir|symlink|fifo|other)", (?:0|[1-9][0-9]{0,17})\]'
)
#: A line exactly as ``line_of`` writes it, but for a path with a ``\u`` escape:
#: printable ASCII but ``"`` and ``\``, or their short escapes. Such a line IS its
#: canonical form (``line_of(*parse_line(line))``), so it is compared as it is, without
#: its JSON decoded (issue 24); any other line goes through ``parse_line``, refusals and
#: all. A whole batch of such lines is checked by one match (``_LINES``); possessive
#: (``++``, ``*+``: a path's run never gives back, as nothing after it could match), 11x
#: faster than a character at a time.
_CANONICAL = re.compile(_LINE + rb"\n?")
_LINES = re.compile(rb"(?:" + _LINE + rb"\n)*")


def load_listing(log: MemberLog, listing: BinaryIO) -> Comparison:
    """Read the listing file from its start; compare it with the log's manifest."""
    runs = _Runs(log)
    try:
        for lines in _canonical_batches(listing, runs.count):
            runs.add(lines)
        return _merge(runs.sorted(), log.sorted_lines(), _implicit_dir(log))
    except OverBudget as over:
        raise StreamBroken(
            f"the restored tree's listing takes the member log past its temp-disk budget "
            f"({over.budget} bytes, twice over with the listing; Limits.member_log_bytes)"
        ) from None
    finally:
        runs.close()


def _canonical_batches(listing: BinaryIO, count: Callable[[int], None]) -> Iterator[list[bytes]]:
    """The listing's lines in canonical form (no newline), ~512 KiB of them at a time: a
    batch of canonical lines by one match and one split; any other batch line by line
    (blank lines skipped, the rest through ``parse_line``)."""
    listing.seek(0)
    canonical, lines_match = _CANONICAL.fullmatch, _LINES.fullmatch
    pending: list[bytes] = []  # the unfinished line's pieces, each read once (a line of many reads
    # copied whole again per read cost its length squared: 40 s of CPU for a 64 MiB line)
    while True:
        read = listing.read(_BATCH_BYTES)  # in bulk: one read per 512 KiB of lines
        count(len(read))
        if read:
            cut = read.rfind(b"\n") + 1
            if not cut:
                pending.append(read)
                continue
            chunk = b"".join([*pending, read[:cut]])
            pending = [read[cut:]] if cut < len(read) else []
        elif pending:
            chunk, pending = b"".join(pending), []
        else:
            return
        ended = chunk.endswith(b"\n")
        if not ended:
            chunk += b"\n"  # only the last line may lack its newline
        if lines_match(chunk) is not None:
            yield chunk[:-1].split(b"\n")
            continue
        out: list[bytes] = []
        lines = chunk[:-1].split(b"\n")
        for at, raw in enumerate(lines):
            if canonical(raw) is not None:
                out.append(raw)
            elif raw.strip():
                # decoded with its newline, as it was read before issue 24: json.loads sniffs a
                # line's encoding, and a UTF-16 line without it would read as the entry it spells
                whole = raw if at == len(lines) - 1 and not ended else raw + b"\n"
                out.append(line_of(*parse_line(whole)).encode("ascii"))
        yield out


def _implicit_dir(log: MemberLog) -> Callable[[bytes], bool]:
    """Whether a listed line the manifest lacks is a directory the bank left implicit."""

    def implicit(line: bytes) -> bool:
        path, kind, _ = parse_line(line)
        return kind == DIR and log.kind(path) == IMPLICIT

    return implicit


def _merge(
    listed: Iterator[bytes], manifest: Iterator[bytes], implicit: Callable[[bytes], bool]
) -> Comparison:
    """Manifest lines the listing lacks (missing); listed lines the manifest lacks, but a
    directory the bank left implicit (unexpected). Both streams sorted; a line repeated
    in either counts as the NOT EXISTS queries it replaces did (once matched, never
    missing nor unexpected again). Where the two agree, a block at a time (a list
    compare, in C); elsewhere a line at a time."""
    ls, ms = _Cursor(listed), _Cursor(manifest)
    last: bytes | None = None  # the last line both streams held
    missing = unexpected = 0
    while True:
        a, i = ls.ahead()
        b, j = ms.ahead()
        k = min(_BLOCK, len(a) - i, len(b) - j)
        if k > 1 and a[i] == b[j] and a[i + k - 1] == b[j + k - 1] and a[i : i + k] == b[j : j + k]:
            last = a[i + k - 1]
            ls.at, ms.at = i + k, j + k
            continue
        x = a[i] if i < len(a) else None
        y = b[j] if j < len(b) else None
        if x is not None and x in (last, y):
            last = x
            ls.at = i + 1
        elif y is not None and y == last:
            ms.at = j + 1
        elif x is not None and (y is None or x < y):
            if not implicit(x):
                unexpected += 1
            ls.at = i + 1
        elif y is not None:
            missing += 1
            ms.at = j + 1
        else:
            return Comparison(missing, unexpected)


class _Cursor:
    """A sorted stream read a block at a time: ``buf[at:]`` is what is ahead."""

    def __init__(self, lines: Iterator[bytes]) -> None:
        self._lines = lines
        self.buf: list[bytes] = []
        self.at = 0
        self._ended = False

    def ahead(self) -> tuple[list[bytes], int]:
        """The buffer and the position in it, with a block ahead unless the stream ends
        (refilled four blocks at a time: a line-at-a-time stretch copies the rest of the
        buffer once per three blocks, not per line)."""
        if not self._ended and len(self.buf) - self.at < _BLOCK:
            more = list(itertools.islice(self._lines, 4 * _BLOCK))
            self._ended = len(more) < 4 * _BLOCK
            self.buf = self.buf[self.at :] + more
            self.at = 0
        return self.buf, self.at


class _Runs:
    """The listing's lines, sorted: one run in memory, or runs spilled to temporary
    files and merged. Its bytes count against the log's temp-disk budget (twice over
    with the log, as when the listing landed in it)."""

    def __init__(self, log: MemberLog) -> None:
        self._log = log
        self._lines: list[bytes] = []
        self._held = 0
        self._files: list[BinaryIO] = []
        self._stack = contextlib.ExitStack()
        self.bytes = 0

    def count(self, n: int) -> None:
        self.bytes += n
        used = self._log.disk_bytes() + self.bytes
        if used > 2 * self._log.budget:
            raise OverBudget(self._log.budget, used)

    def add(self, lines: list[bytes]) -> None:
        self._lines.extend(lines)
        self._held += sum(map(len, lines)) + _OBJECT_BYTES * len(lines)
        if self._held >= RUN_BYTES:
            self._spill()

    def _spill(self) -> None:
        self._lines.sort()
        self._files.append(self._run(self._lines))
        self._lines, self._held = [], 0
        if len(self._files) >= _MAX_RUNS:  # merged into one: what the runs hold read back stays bounded
            runs, self._files = self._files, []
            self._files.append(self._run(heapq.merge(*(_read_run(run) for run in runs))))
            for run in runs:
                run.close()

    def _run(self, lines: Iterable[bytes]) -> BinaryIO:
        """A temporary file of sorted lines, back at its start."""
        run = self._stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 - closed by close()
        it = iter(lines)
        while block := list(itertools.islice(it, _BLOCK)):
            run.write(b"\n".join(block) + b"\n")
        run.seek(0)
        return run

    def sorted(self) -> Iterator[bytes]:
        self._lines.sort()
        if not self._files:
            return iter(self._lines)
        return heapq.merge(iter(self._lines), *(_read_run(run) for run in self._files))

    def close(self) -> None:
        self._stack.close()
        self._files.clear()


def _read_run(run: BinaryIO) -> Iterator[bytes]:
    """A spilled run's lines (canonical lines hold no newline), read 64 KiB at a time."""
    pending: list[bytes] = []  # a long line's pieces, each read once (never copied again per read)
    while chunk := run.read(1 << 16):  # 64 KiB: a run read back holds little, whatever the count of runs
        if b"\n" not in chunk:
            pending.append(chunk)
            continue
        first, *complete, last = chunk.split(b"\n")
        yield b"".join([*pending, first])
        yield from complete
        pending = [last] if last else []
