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
from collections.abc import Callable, Iterator
from typing import BinaryIO

from scratchbank.domain.errors import StreamBroken

from .manifest_line import line_of, parse_line
from .members import DIR, IMPLICIT, Comparison
from .spill_log import MemberLog, OverBudget

_BATCH_BYTES = 1 << 20
#: the listing's bytes sorted in memory at once (a run); a longer listing spills runs to disk
RUN_BYTES = 8 << 20
#: lines compared a block at a time while the two streams agree (a list compare, in C)
_BLOCK = 4096

_LINE = (
    rb'\["(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\bfnrt])*", '
    rb'"(?:file|dir|symlink|fifo|other)", (?:0|[1-9][0-9]{0,17})\]'
)
#: A line exactly as ``line_of`` writes it, but for a path with a ``\u`` escape:
#: printable ASCII but ``"`` and ``\``, or their short escapes. Such a line IS its
#: canonical form (``line_of(*parse_line(line))``), so it is compared as it is, without
#: its JSON decoded (issue 24); any other line goes through ``parse_line``, refusals and
#: all. A whole batch of such lines is checked by one match (``_LINES``).
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
    """The listing's lines in canonical form (no newline), a batch of ~1 MiB at a time:
    a batch of canonical lines by one match and one split; any other batch line by line
    (blank lines skipped, the rest through ``parse_line``)."""
    listing.seek(0)
    canonical, lines_match = _CANONICAL.fullmatch, _LINES.fullmatch
    while batch := listing.readlines(_BATCH_BYTES):  # in bulk: one read per ~1 MiB of lines
        chunk = b"".join(batch)
        count(len(chunk))
        if not chunk.endswith(b"\n"):
            chunk += b"\n"  # only the last line may lack its newline
        if lines_match(chunk) is not None:
            yield chunk[:-1].split(b"\n")
            continue
        out: list[bytes] = []
        for raw in batch:
            if canonical(raw) is not None:
                out.append(raw.rstrip(b"\n"))
            elif raw.strip():
                out.append(line_of(*parse_line(raw)).encode("ascii"))
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
    missing nor unexpected again)."""
    last: bytes | None = None  # the last line both streams held
    while True:  # while the two agree: a block at a time
        a, b = list(itertools.islice(listed, _BLOCK)), list(itertools.islice(manifest, _BLOCK))
        if a != b:
            break
        if not a:
            return Comparison(0, 0)
        last = a[-1]
    listed, manifest = itertools.chain(a, listed), itertools.chain(b, manifest)
    missing = unexpected = 0
    x, y = next(listed, None), next(manifest, None)
    while x is not None or y is not None:
        if x is not None and x in (last, y):
            last = x
            x = next(listed, None)
        elif y is not None and y == last:
            y = next(manifest, None)
        elif y is None or (x is not None and x < y):
            assert x is not None
            if not implicit(x):
                unexpected += 1
            x = next(listed, None)
        else:
            missing += 1
            y = next(manifest, None)
    return Comparison(missing, unexpected)


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
        self._held += sum(map(len, lines))
        if self._held >= RUN_BYTES:
            self._spill()

    def _spill(self) -> None:
        self._lines.sort()
        run = self._stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 - closed by close()
        for i in range(0, len(self._lines), _BLOCK):
            run.write(b"\n".join(self._lines[i : i + _BLOCK]) + b"\n")
        run.seek(0)
        self._files.append(run)
        self._lines, self._held = [], 0

    def sorted(self) -> Iterator[bytes]:
        self._lines.sort()
        if not self._files:
            return iter(self._lines)
        return heapq.merge(iter(self._lines), *(_read_run(run) for run in self._files))

    def close(self) -> None:
        self._stack.close()
        self._files.clear()


def _read_run(run: BinaryIO) -> Iterator[bytes]:
    """A spilled run's lines (canonical lines hold no newline), read in big chunks."""
    pending = b""
    while chunk := run.read(1 << 20):
        *complete, pending = (pending + chunk).split(b"\n")
        yield from complete
