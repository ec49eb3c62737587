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


def _utf8(line: str) -> bytes:
    """A manifest line as the database stores TEXT (and orders it: by these bytes)."""
    return line.encode("utf-8", "surrogatepass")


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
    """Accepted members, in order: in memory until a first batch of ``BATCH`` rows lands, on
    disk from then on (a small bank's log never opens a database). Iterating yields them as
    ``Member``.

    Writes are batched (``BATCH`` rows per ``executemany``, looked up in memory until
    then). A conflict is raised as PathTaken by ``add`` itself: with the pending batch
    in memory, or with a row already on disk (one indexed lookup, once a batch has
    landed). Never when a batch lands: by then the reader would have streamed the
    member on (the X2 escape in issue 10's attack findings).
    """

    BATCH = 2048

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self._db: sqlite3.Connection | None = None  # opened when the first batch lands (``flush``)
        self.budget = budget
        self._filter = bytearray()  # built when the first batch lands (``flush``): issue 26
        self._mask, self._marks = _FILTER_BITS - 1, 0
        self._indexed: set[str] = set()
        self._page_size = 0
        self._pending: dict[bytes, _Row] = {}
        self._salt = secrets.token_bytes(16)
        self._hasher = hashlib.blake2b(digest_size=16, key=self._salt)  # copied per key
        self._landed = False
        self._seq = 0
        self.count = 0

    def _open(self) -> sqlite3.Connection:
        """The log's database, opened at the first batch that lands: a log that never holds
        ``BATCH`` rows (a small bank's) keeps them in memory and opens none (~0.3 ms)."""
        if self._db is None:
            db = sqlite3.connect("", isolation_level=None, check_same_thread=False)  # one user at a time
            db.execute("PRAGMA cache_size = -4096")
            db.execute("PRAGMA temp_store = FILE")
            db.execute("PRAGMA journal_mode = OFF")  # a private, throwaway database: never rolled back
            db.execute("PRAGMA synchronous = OFF")
            self._page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
            db.executescript(_SCHEMA)
            db.execute("BEGIN")
            self._db = db
        return self._db

    def close(self) -> None:
        if self._db is not None:
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
        size, link = m.size, _b(m.linkname)
        if held is None:
            self._mark(key)
        else:  # an implicit parent arriving as a directory keeps its size and link, pending or
            size, link = held[1], held[2]  # landed alike (the upsert sets neither)
        path = b"" if m.type == IMPLICIT else _b(m.path)
        self._pending[key] = (self._seq, key, path, m.type, size, m.mode, m.mtime, link, line)
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
        db = self._open()
        before = db.total_changes
        db.executemany(_UPSERT, rows)
        if db.total_changes - before != len(rows):
            self._conflict(rows)
        self._check_budget(self.budget)

    def finish(self) -> None:
        """The stream ended: what is pending lands if a batch landed before (as ``flush``);
        a log that never landed keeps its rows in memory (each was checked as it came)."""
        if self._landed:
            self.flush()

    def _in_memory(self) -> list[_Row] | None:
        """Every row, in order (``seq``), when none has landed: the reads below answer from
        them as the database would (``None`` once a batch landed: they read the database)."""
        return None if self._landed else sorted(self._pending.values())

    def disk_bytes(self) -> int:
        """The size of the log's database (what it takes on the temp disk; none yet: 0)."""
        if self._db is None:
            return 0
        return int(self._db.execute("PRAGMA page_count").fetchone()[0]) * self._page_size

    def _check_budget(self, budget: int) -> None:
        used = self.disk_bytes()
        if used > budget:
            raise OverBudget(self.budget, used)

    def _conflict(self, rows: list[_Row]) -> None:
        for row in rows:
            found = self._open().execute("SELECT seq, type FROM members WHERE key = ?", (row[1],)).fetchone()
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
        for (key,) in self._open().execute("SELECT key FROM members"):
            self._mark(bytes(key))
        for key in self._pending:
            self._mark(key)

    def _may_hold(self, key: bytes) -> bool:
        a, b = int.from_bytes(key[:3], "little") & self._mask, int.from_bytes(key[3:6], "little") & self._mask
        return bool(self._filter[a >> 3] & (1 << (a & 7)) and self._filter[b >> 3] & (1 << (b & 7)))

    def _index_lines(self, *tables: str) -> None:
        for table in tables:
            if table not in self._indexed:
                self._open().execute(_LINE_INDEXES[table])
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
        found = self._open().execute("SELECT type, size, link FROM members WHERE key = ?", (key,)).fetchone()
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
        held = self._in_memory()
        rows: Iterable[tuple[bytes, str, int, int, int, bytes]]
        if held is not None:
            rows = [(r[2], r[3], r[4], r[5], r[6], r[7]) for r in held]
        else:
            self.flush()
            rows = self._open().execute(
                "SELECT path, type, size, mode, mtime, link FROM members ORDER BY seq"
            )
        for path, kind, size, mode, mtime, link in rows:
            if kind not in (FIFO, IMPLICIT):
                yield Member(_s(path), kind, size, mode, mtime, _s(link))

    def members_of(self, kind: str, *, deepest_first: bool = False) -> Iterator[Member]:
        """Members of one kind (not IMPLICIT: their paths are not kept)."""
        if kind == IMPLICIT:
            raise ValueError("implicit parents are kept by key only")
        held = self._in_memory()
        rows: Iterable[tuple[bytes, int, int, int, bytes]]
        if held is not None:
            chosen = [r for r in held if r[3] == kind]
            if deepest_first:
                chosen.sort(key=lambda r: r[2], reverse=True)  # as the database's path DESC: bytes
            rows = [(r[2], r[4], r[5], r[6], r[7]) for r in chosen]
        else:
            self.flush()
            order = "path DESC" if deepest_first else "seq"
            rows = self._open().execute(
                f"SELECT path, size, mode, mtime, link FROM members WHERE type = ? ORDER BY {order}", (kind,)
            )
        for path, size, mode, mtime, link in rows:
            yield Member(_s(path), kind, size, mode, mtime, _s(link))

    def lines(self) -> Iterator[str]:
        held = self._in_memory()
        if held is not None:  # in the database's order of TEXT: its UTF-8 bytes
            yield from sorted((r[8] for r in held if r[8] != ""), key=_utf8)
            return
        self.flush()
        self._index_lines("members")
        for (line,) in self._open().execute("SELECT line FROM members WHERE line != '' ORDER BY line"):
            yield str(line)

    def manifest(self) -> Manifest:
        digest = hashlib.sha256()
        entries = 0
        for line in self.lines():
            digest.update(b"\n" if entries else b"")
            digest.update(line.encode("ascii"))
            entries += 1
        held = self._in_memory()
        if held is not None:
            return Manifest(entries, sum(r[4] for r in held if r[3] == FILE), digest.hexdigest())
        files = "SELECT COALESCE(SUM(size), 0) FROM members WHERE type = 'file'"
        row = self._open().execute(files).fetchone()
        return Manifest(entries, int(row[0]), digest.hexdigest())

    # -- the restored tree, compared with the manifest (listing.py) ----------------------
    def sorted_lines(self) -> Iterator[bytes]:
        """The manifest lines as bytes, in byte order (its index): one side of the merge
        that compares a restored tree's sorted listing with the manifest."""
        held = self._in_memory()
        if held is not None:
            yield from sorted(_utf8(r[8]) for r in held if r[8] != "")
            return
        self.flush()
        self._index_lines("members")
        rows = self._open().execute("SELECT CAST(line AS BLOB) FROM members WHERE line != '' ORDER BY line")
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
