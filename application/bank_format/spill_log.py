"""The member log: a bank's members as the reader accepted them, spilled to SQLite on
disk, and the manifest (digest and counts) read from it.

A bank may hold up to the member cap (2M by default: a million tiny files is a scratch a
demanding user has), and the host must not grow with that count (issue 10 item 5). So every accepted member
goes into a private temporary SQLite database (``sqlite3.connect("")``: an on-disk
file SQLite deletes on close, whose page cache is capped here at 4 MiB). It answers
what the reader needs while streaming (is this path a duplicate, what kind is each
parent, what size is a hard link's target) and what the restore needs afterwards (the
manifest digest in sorted order, a comparison with the restored tree, the symlinks to
create last). Why not a keyed-hash set in memory: 1M paths still cost ~100 MiB of
Python objects, and it cannot answer "which kind" or "what size". Why not a plain file:
the duplicate and parent checks are lookups, and the manifest digest needs sorting;
SQLite does both on disk in bounded memory.

A manifest line is ``json.dumps([path, kind, size])`` (manifest_line.py) (ASCII only, so SQLite's byte
order is Python's ``sorted`` order); the manifest digest is the SHA-256 of the sorted
lines joined by newlines, as recorded on ``sandbox_scratch_banked``.

Rows are keyed by a 16-byte BLAKE2b of the path under a key drawn per log (a bank
cannot aim at a collision it cannot compute). An implicit parent directory stores
only that key, never its path: a bank of deep unique paths has ~depth implicit
parents per member, and storing each one's whole path (table and index) cost
~800 KB of temp disk per 5 KB member (T6). Nothing reads an implicit parent's path
back: the lookups, the duplicate check and the listing comparison all go by key.

Temp disk does grow with the count (~150 B per short member row, ~70 B per implicit
parent, and the index of its manifest line), so the log has a temp-disk budget (issue 14,
ADR 0002): once its database passes ``budget`` bytes, ``add`` raises OverBudget, named
by the reader as a refusal before the temp disk fills. The listing of a restored tree
never lands in it (listing.py merges it, sorted, with the manifest lines: issue 24), but
its bytes count against the budget again (twice the budget in all), as a legitimate
listing is smaller than the members' rows.

A conflict (a duplicate, a non-directory where an implicit parent stands) is found
before ``add`` returns, never later: the reader hands a member on only once its
checks are final (X2).
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
from collections.abc import Iterable, Iterator

import attrs

from .manifest_line import line_of
from .members import DIR, FIFO, FILE, HARDLINK, IMPLICIT, SYMLINK, Member, PathTaken

_SCHEMA = """
CREATE TABLE members (seq INTEGER PRIMARY KEY, key BLOB UNIQUE NOT NULL, path BLOB NOT NULL,
    type TEXT NOT NULL, size INTEGER NOT NULL, mode INTEGER NOT NULL, mtime INTEGER NOT NULL,
    link BLOB NOT NULL, line TEXT NOT NULL);
"""
#: The indexes on the manifest lines are built once, when first read (a sort on the temp
#: disk), not row by row while the bank streams in: nothing looks a line up before then.
_LINE_INDEXES = {
    "members": "CREATE INDEX members_line ON members(line)",
}
#: A filter of the keys held (two bits per key, taken from the key itself): a key whose
#: bits are not both set is not in the log, and costs no lookup on disk. ~16 bits per key
#: as the rows land, up to 2 MiB whatever the member count (~10% false positives at 3M
#: rows: a lookup, never a wrong answer); a 200-member bank's is 1 KiB, not 2 MiB (issue 26).
_FILTER_BITS = 1 << 24


@attrs.frozen
class Manifest:
    entries: int
    bytes: int
    sha256: str

    @classmethod
    def of(cls, members: Iterable[Member]) -> Manifest:
        """The manifest of members (a reader's log, or any iterable of members)."""
        if isinstance(members, MemberLog):
            return members.manifest()
        log = MemberLog()
        try:
            for m in members:
                log.add(m)
            return log.manifest()
        finally:
            log.close()


def _b(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


def _s(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


#: The default temp-disk budget of a member log: a legitimate bank of a million files
#: with long paths (~200 bytes each) takes ~700 MB; 2 GiB leaves room for twice that.
DEFAULT_BUDGET = 2 << 30


class OverBudget(Exception):
    """The member log's database passed its temp-disk budget."""

    def __init__(self, budget: int, used: int) -> None:
        super().__init__(f"{used} bytes of temp disk, past a budget of {budget}")
        self.budget, self.used = budget, used


_UPSERT = (
    "INSERT INTO members (seq, key, path, type, size, mode, mtime, link, line) VALUES (?,?,?,?,?,?,?,?,?) "
    "ON CONFLICT(key) DO UPDATE SET seq = excluded.seq, path = excluded.path, type = excluded.type, "
    "mode = excluded.mode, mtime = excluded.mtime, line = excluded.line "
    "WHERE members.type = 'implicit' AND excluded.type = 'dir'"
)
_Row = tuple[int, bytes, bytes, str, int, int, int, bytes, str]


class MemberLog:
    """Accepted members, in order, on disk. Iterating yields them as ``Member``.

    Writes are batched (``BATCH`` rows per ``executemany``, looked up in memory until
    then). A conflict is raised as PathTaken by ``add`` itself: with the pending batch
    in memory, or with a row already on disk (one indexed lookup, once a batch has
    landed). Never when a batch lands: by then the reader would have streamed the
    member on (the X2 escape in issue 10's attack findings).
    """

    BATCH = 2048

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self._db = sqlite3.connect("", isolation_level=None, check_same_thread=False)  # one user at a time
        self._db.execute("PRAGMA cache_size = -4096")
        self._db.execute("PRAGMA temp_store = FILE")
        self._db.execute("PRAGMA journal_mode = OFF")  # a private, throwaway database: never rolled back
        self._db.execute("PRAGMA synchronous = OFF")
        self.budget = budget
        self._filter = bytearray()  # built when the first batch lands (``flush``): issue 26
        self._mask, self._marks = _FILTER_BITS - 1, 0
        self._indexed: set[str] = set()
        self._page_size = int(self._db.execute("PRAGMA page_size").fetchone()[0])
        self._db.executescript(_SCHEMA)
        self._db.execute("BEGIN")
        self._pending: dict[bytes, _Row] = {}
        self._salt = secrets.token_bytes(16)
        self._hasher = hashlib.blake2b(digest_size=16, key=self._salt)  # copied per key
        self._landed = False
        self._seq = 0
        self.count = 0

    def close(self) -> None:
        self._db.close()

    # -- writing --------------------------------------------------------------------------
    def add(self, m: Member) -> None:
        """Record a member (an implicit parent arriving as a directory takes its place)."""
        self._put(m, self._line(m))
        if m.type != IMPLICIT:
            self.count += 1

    def add_implicit(self, path: str) -> None:
        """A parent directory the bank leaves implicit (it has no entry of its own)."""
        self._put(Member(path, IMPLICIT, 0, 0, 0), "")

    def key(self, path: str) -> bytes:
        """The row key of a path (keyed BLAKE2b, 16 bytes)."""
        hasher = self._hasher.copy()
        hasher.update(_b(path))
        return hasher.digest()

    def _put(self, m: Member, line: str) -> None:
        key = self.key(m.path)
        held = self._row_of(key)
        if held is not None and not (held[0] == IMPLICIT and m.type == DIR):
            raise PathTaken(m.path, held[0])
        self._seq += 1
        if held is None:
            self._mark(key)
        path = b"" if m.type == IMPLICIT else _b(m.path)
        self._pending[key] = (self._seq, key, path, m.type, m.size, m.mode, m.mtime, _b(m.linkname), line)
        if len(self._pending) >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        """Land the pending rows; raise PathTaken for the first that met a row on disk."""
        if not self._pending:
            return
        rows = list(self._pending.values())
        self._pending.clear()
        if not self._landed:  # until now every key was in memory: the filter starts here,
            # ~16 bits per row held (1 KiB at least), growing with the rows (``_grow``)
            bits = min(_FILTER_BITS, max(1 << 13, 1 << (16 * len(rows)).bit_length()))
            self._filter, self._mask = bytearray(bits // 8), bits - 1
            for row in rows:
                self._mark(row[1])
        self._landed = True
        before = self._db.total_changes
        self._db.executemany(_UPSERT, rows)
        if self._db.total_changes - before != len(rows):
            self._conflict(rows)
        self._check_budget(self.budget)

    def disk_bytes(self) -> int:
        """The size of the log's database (what it takes on the temp disk)."""
        return int(self._db.execute("PRAGMA page_count").fetchone()[0]) * self._page_size

    def _check_budget(self, budget: int) -> None:
        used = self.disk_bytes()
        if used > budget:
            raise OverBudget(self.budget, used)

    def _conflict(self, rows: list[_Row]) -> None:
        for row in rows:
            found = self._db.execute("SELECT seq, type FROM members WHERE key = ?", (row[1],)).fetchone()
            if found is not None and found[0] != row[0]:
                raise PathTaken(_s(row[2]), str(found[1]))

    def _mark(self, key: bytes) -> None:
        if not self._filter:  # nothing landed yet: ``flush`` marks the first batch
            return
        a, b = int.from_bytes(key[:3], "little") & self._mask, int.from_bytes(key[3:6], "little") & self._mask
        self._filter[a >> 3] |= 1 << (a & 7)
        self._filter[b >> 3] |= 1 << (b & 7)
        self._marks += 1
        if self._marks * 16 > self._mask + 1 and self._mask + 1 < _FILTER_BITS:
            self._grow()  # past ~16 bits per key: 16 times the size, up to its full size

    def _grow(self) -> None:
        """A filter 16 times the size (at most ``_FILTER_BITS``), every key held (landed and
        pending) marked again: three rebuilds on the way to a million rows, ~0.5 M keys re-read."""
        bits = min(_FILTER_BITS, (self._mask + 1) * 16)
        self._filter, self._mask, self._marks = bytearray(bits // 8), bits - 1, 0
        for (key,) in self._db.execute("SELECT key FROM members"):
            self._mark(bytes(key))
        for key in self._pending:
            self._mark(key)

    def _may_hold(self, key: bytes) -> bool:
        a, b = int.from_bytes(key[:3], "little") & self._mask, int.from_bytes(key[3:6], "little") & self._mask
        return bool(self._filter[a >> 3] & (1 << (a & 7)) and self._filter[b >> 3] & (1 << (b & 7)))

    def _index_lines(self, *tables: str) -> None:
        for table in tables:
            if table not in self._indexed:
                self._db.execute(_LINE_INDEXES[table])
                self._indexed.add(table)
                self._check_budget(2 * self.budget)

    # -- looking up (pending rows first) --------------------------------------------------
    def _row(self, path: str) -> tuple[str, int, bytes] | None:
        return self._row_of(self.key(path))

    def _row_of(self, key: bytes) -> tuple[str, int, bytes] | None:
        held = self._pending.get(key)
        if held is not None:
            return held[3], held[4], held[7]
        if not self._landed or not self._may_hold(key):
            return None
        found = self._db.execute("SELECT type, size, link FROM members WHERE key = ?", (key,)).fetchone()
        return None if found is None else (str(found[0]), int(found[1]), bytes(found[2]))

    def kind(self, path: str) -> str | None:
        row = self._row(path)
        return None if row is None else row[0]

    def link_of(self, path: str) -> str | None:
        row = self._row(path)
        return _s(row[2]) if row is not None and row[0] == SYMLINK else None

    def file_size(self, path: str) -> int:
        row = self._row(path)
        return row[1] if row is not None and row[0] == FILE else 0

    def _line(self, m: Member) -> str:
        if m.path == "" or m.type == FIFO:
            return ""  # not part of the manifest: the root, and fifos (never restored)
        if m.type == HARDLINK:
            return line_of(m.path, FILE, self.file_size(m.linkname))
        if m.type == SYMLINK:
            return line_of(m.path, SYMLINK, len(_b(m.linkname)))
        return line_of(m.path, m.type, m.size if m.type == FILE else 0)

    def __iter__(self) -> Iterator[Member]:
        self.flush()
        rows = self._db.execute("SELECT path, type, size, mode, mtime, link FROM members ORDER BY seq")
        for path, kind, size, mode, mtime, link in rows:
            if kind not in (FIFO, IMPLICIT):
                yield Member(_s(path), kind, size, mode, mtime, _s(link))

    def members_of(self, kind: str, *, deepest_first: bool = False) -> Iterator[Member]:
        """Members of one kind (not IMPLICIT: their paths are not kept)."""
        if kind == IMPLICIT:
            raise ValueError("implicit parents are kept by key only")
        self.flush()
        order = "path DESC" if deepest_first else "seq"
        rows = self._db.execute(
            f"SELECT path, size, mode, mtime, link FROM members WHERE type = ? ORDER BY {order}", (kind,)
        )
        for path, size, mode, mtime, link in rows:
            yield Member(_s(path), kind, size, mode, mtime, _s(link))

    def lines(self) -> Iterator[str]:
        self.flush()
        self._index_lines("members")
        for (line,) in self._db.execute("SELECT line FROM members WHERE line != '' ORDER BY line"):
            yield str(line)

    def manifest(self) -> Manifest:
        digest = hashlib.sha256()
        entries = 0
        for line in self.lines():
            digest.update(b"\n" if entries else b"")
            digest.update(line.encode("ascii"))
            entries += 1
        row = self._db.execute("SELECT COALESCE(SUM(size), 0) FROM members WHERE type = 'file'").fetchone()
        return Manifest(entries, int(row[0]), digest.hexdigest())

    # -- the restored tree, compared with the manifest (listing.py) ----------------------
    def sorted_lines(self) -> Iterator[bytes]:
        """The manifest lines as bytes, in byte order (its index): one side of the merge
        that compares a restored tree's sorted listing with the manifest."""
        self.flush()
        self._index_lines("members")
        rows = self._db.execute("SELECT CAST(line AS BLOB) FROM members WHERE line != '' ORDER BY line")
        while batch := rows.fetchmany(4096):
            yield from [row[0] for row in batch]


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
