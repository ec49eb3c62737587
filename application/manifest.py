"""The members of a bank as the reader accepted them, spilled to disk, and its manifest.

A bank may hold up to the member cap (200k by default, a million for some users), and
the host must not grow with that count (issue 10 item 5). So every accepted member
goes into a private temporary SQLite database (``sqlite3.connect("")``: an on-disk
file SQLite deletes on close, whose page cache is capped here at 4 MiB). It answers
what the reader needs while streaming (is this path a duplicate, what kind is each
parent, what size is a hard link's target) and what the restore needs afterwards (the
manifest digest in sorted order, a comparison with the restored tree, the symlinks to
create last). Why not a keyed-hash set in memory: 1M paths still cost ~100 MiB of
Python objects, and it cannot answer "which kind" or "what size". Why not a plain file:
the duplicate and parent checks are lookups, and the manifest digest needs sorting;
SQLite does both on disk in bounded memory.

A manifest line is ``json.dumps([path, kind, size])`` (ASCII only, so SQLite's byte
order is Python's ``sorted`` order); the manifest digest is the SHA-256 of the sorted
lines joined by newlines, as recorded on ``sandbox_scratch_banked``.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Iterator

import attrs

FILE, DIR, SYMLINK, HARDLINK, FIFO = "file", "dir", "symlink", "hardlink", "fifo"
IMPLICIT = "implicit"  # a parent directory with no entry of its own

_SCHEMA = """
CREATE TABLE members (seq INTEGER PRIMARY KEY, path BLOB UNIQUE NOT NULL, type TEXT NOT NULL,
    size INTEGER NOT NULL, mode INTEGER NOT NULL, mtime INTEGER NOT NULL, link BLOB NOT NULL,
    line TEXT NOT NULL);
CREATE INDEX members_line ON members(line);
CREATE TABLE listing (path BLOB NOT NULL, type TEXT NOT NULL, size INTEGER NOT NULL,
    line TEXT NOT NULL);
CREATE INDEX listing_line ON listing(line);
"""


@attrs.frozen
class Member:
    path: str  # normalised, relative, no "./"; "" is the archive's root directory
    type: str
    size: int
    mode: int
    mtime: int
    linkname: str = ""


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


@attrs.frozen
class Comparison:
    """How a restored tree differs from the manifest (implicit parent dirs allowed)."""

    missing: int
    unexpected: int

    @property
    def same(self) -> bool:
        return self.missing == 0 and self.unexpected == 0


def _b(path: str) -> bytes:
    return path.encode("utf-8", "surrogateescape")


def _s(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def line_of(path: str, kind: str, size: int) -> str:
    return json.dumps([path, kind, size])


class MemberLog:
    """Accepted members, in order, on disk. Iterating yields them as ``Member``."""

    def __init__(self) -> None:
        self._db = sqlite3.connect("", isolation_level=None, check_same_thread=False)  # one user at a time
        self._db.execute("PRAGMA cache_size = -4096")
        self._db.execute("PRAGMA temp_store = FILE")
        self._db.executescript(_SCHEMA)
        self._db.execute("BEGIN")
        self.count = 0

    def close(self) -> None:
        self._db.close()

    def kind(self, path: str) -> str | None:
        row = self._db.execute("SELECT type FROM members WHERE path = ?", (_b(path),)).fetchone()
        return None if row is None else str(row[0])

    def link_of(self, path: str) -> str | None:
        row = self._db.execute("SELECT link FROM members WHERE path = ? AND type = 'symlink'", (_b(path),))
        found = row.fetchone()
        return None if found is None else _s(found[0])

    def add_implicit(self, path: str) -> None:
        """A parent directory the bank leaves implicit (it has no entry of its own)."""
        self._db.execute(
            "INSERT INTO members (path, type, size, mode, mtime, link, line) VALUES (?, ?, 0, 0, 0, X'', '')",
            (_b(path), IMPLICIT),
        )

    def make_explicit(self, m: Member) -> None:
        """An implicit parent that arrives later as a directory entry of its own."""
        self._db.execute(
            "UPDATE members SET type = ?, mode = ?, mtime = ?, line = ? WHERE path = ?",
            (DIR, m.mode, m.mtime, self._line(m), _b(m.path)),
        )
        self.count += 1

    def file_size(self, path: str) -> int:
        row = self._db.execute("SELECT size FROM members WHERE path = ? AND type = 'file'", (_b(path),))
        found = row.fetchone()
        return 0 if found is None else int(found[0])

    def add(self, m: Member) -> bool:
        """Record a member; False (and nothing recorded) when its path is already there."""
        try:
            self._db.execute(
                "INSERT INTO members (path, type, size, mode, mtime, link, line) VALUES (?,?,?,?,?,?,?)",
                (_b(m.path), m.type, m.size, m.mode, m.mtime, _b(m.linkname), self._line(m)),
            )
        except sqlite3.IntegrityError:
            return False
        self.count += 1
        return True

    def _line(self, m: Member) -> str:
        if m.path == "" or m.type == FIFO:
            return ""  # not part of the manifest: the root, and fifos (never restored)
        if m.type == HARDLINK:
            return line_of(m.path, FILE, self.file_size(m.linkname))
        if m.type == SYMLINK:
            return line_of(m.path, SYMLINK, len(_b(m.linkname)))
        return line_of(m.path, m.type, m.size if m.type == FILE else 0)

    def __iter__(self) -> Iterator[Member]:
        rows = self._db.execute("SELECT path, type, size, mode, mtime, link FROM members ORDER BY seq")
        for path, kind, size, mode, mtime, link in rows:
            if kind not in (FIFO, IMPLICIT):
                yield Member(_s(path), kind, size, mode, mtime, _s(link))

    def members_of(self, kind: str, *, deepest_first: bool = False) -> Iterator[Member]:
        order = "path DESC" if deepest_first else "seq"
        rows = self._db.execute(
            f"SELECT path, size, mode, mtime, link FROM members WHERE type = ? ORDER BY {order}", (kind,)
        )
        for path, size, mode, mtime, link in rows:
            yield Member(_s(path), kind, size, mode, mtime, _s(link))

    def lines(self) -> Iterator[str]:
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

    # -- the restored tree, compared with the manifest ------------------------------------
    def add_listed(self, path: str, kind: str, size: int) -> None:
        self._db.execute(
            "INSERT INTO listing VALUES (?,?,?,?)", (_b(path), kind, size, line_of(path, kind, size))
        )

    def compare(self) -> Comparison:
        """Lines the manifest has and the listing lacks; listed lines the manifest lacks,
        except the directories a bank left implicit (parents with no entry of their own)."""
        missing = self._db.execute(
            "SELECT COUNT(*) FROM members m WHERE m.line != '' "
            "AND NOT EXISTS (SELECT 1 FROM listing l WHERE l.line = m.line)"
        ).fetchone()[0]
        unexpected = self._db.execute(
            "SELECT COUNT(*) FROM listing l WHERE NOT EXISTS (SELECT 1 FROM members m WHERE m.line = l.line) "
            "AND NOT (l.type = 'dir' AND EXISTS "
            "(SELECT 1 FROM members i WHERE i.path = l.path AND i.type = 'implicit'))"
        ).fetchone()[0]
        return Comparison(int(missing), int(unexpected))
