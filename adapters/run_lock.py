"""The run's lock (A16, ADR 0007): a lease row per run, in SQLite or PostgreSQL, in memory,
or the runner's JetStream KV lease handed in.

Every adapter keeps one row per run: ``holder`` ("" once released or broken), ``token``
(grows with every new holder and every break: a grant whose token is not the row's is
fenced), ``since`` and ``expires``. A lease is live while ``expires`` is ahead of the
store's clock: PostgreSQL's ``now()``; SQLite's and memory's injected clock (the host's
wall clock by default). Nothing holds a connection between calls, so a dead process's
lease simply lapses.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scratchbank.application.ports import Clock, LockGrant, LockHolder, SystemClock
from scratchbank.application.run_lock import HandedLock, MemoryRunLock, Row, RowLock, lost
from scratchbank.domain.errors import LockUnavailable

__all__ = ["HandedLock", "MemoryRunLock", "PostgresRunLock", "SqliteRunLock"]
from scratchbank.domain.runs import check_run_id

#: Every call to a lock store ends within this (its own timeouts, then LockUnavailable).
CALL_SECONDS = 5.0

_SQLITE_TABLE = """CREATE TABLE IF NOT EXISTS run_locks (
    run_id TEXT PRIMARY KEY, holder TEXT NOT NULL, token INTEGER NOT NULL,
    since REAL NOT NULL, expires REAL NOT NULL)"""


class SqliteRunLock(RowLock):
    """The embedded default: a row per run in a SQLite file next to the timeline's.

    Each call is one ``BEGIN IMMEDIATE`` transaction on a connection of its own, so it
    excludes other threads of this process and other processes alike; the busy timeout
    is the call's deadline (LockUnavailable past it).
    """

    def __init__(
        self, path: Path | str, *, clock: Clock | None = None, call_seconds: float = CALL_SECONDS
    ) -> None:
        self.path, self.clock, self.call_seconds = Path(path), clock or SystemClock(), call_seconds

    def holder(self, run_id: str) -> LockHolder | None:
        if not self.path.exists():  # nobody ever locked a run here: reading creates nothing
            return None
        return super().holder(run_id)

    @contextlib.contextmanager
    def _txn(self) -> Iterator[Any]:
        """One transaction; the file and its table are made by the first one (lazily, so
        opening the lock and reading it change nothing on disk)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=self.call_seconds, isolation_level=None)
        except (OSError, sqlite3.Error) as error:
            raise LockUnavailable(f"cannot open the lock file {self.path}: {error}") from error
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_SQLITE_TABLE)
            yield conn
            conn.execute("COMMIT")
        except sqlite3.Error as error:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise LockUnavailable(f"the lock file {self.path}: {error}") from error
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()

    def _get(self, txn: Any, run_id: str) -> Row | None:
        sql = "SELECT holder, token, since, expires FROM run_locks WHERE run_id = ?"
        row = txn.execute(sql, (run_id,)).fetchone()
        return None if row is None else (str(row[0]), int(row[1]), float(row[2]), float(row[3]))

    def _put(self, txn: Any, run_id: str, row: Row) -> None:
        txn.execute("INSERT OR REPLACE INTO run_locks VALUES (?, ?, ?, ?, ?)", (run_id, *row))


_PG_TABLE = """CREATE TABLE IF NOT EXISTS scratchbank_run_locks (
    run_id text PRIMARY KEY, holder text NOT NULL, token bigint NOT NULL,
    since timestamptz NOT NULL, expires timestamptz NOT NULL)"""

_PG_ACQUIRE = """INSERT INTO scratchbank_run_locks AS l (run_id, holder, token, since, expires)
VALUES (%(run)s, %(holder)s, 1, now(), now() + make_interval(secs => %(ttl)s))
ON CONFLICT (run_id) DO UPDATE SET holder = EXCLUDED.holder, token = l.token + 1,
    since = EXCLUDED.since, expires = EXCLUDED.expires
WHERE l.holder = '' OR l.expires <= now()
RETURNING holder, token, since, expires"""

_PG_REFRESH = """UPDATE scratchbank_run_locks SET expires = now() + make_interval(secs => %(ttl)s)
WHERE run_id = %(run)s AND holder = %(holder)s AND token = %(token)s
RETURNING holder, token, since, expires"""

_PG_RELEASE = """UPDATE scratchbank_run_locks SET holder = '', expires = now()
WHERE run_id = %(run)s AND holder = %(holder)s AND token = %(token)s"""

_PG_HOLDER = """SELECT holder, token, since, expires, expires > now() FROM scratchbank_run_locks
WHERE run_id = %(run)s"""

_PG_BREAK = """WITH old AS (SELECT run_id, holder, token, since, expires, expires > now() AS live
    FROM scratchbank_run_locks WHERE run_id = %(run)s FOR UPDATE)
UPDATE scratchbank_run_locks l SET holder = '', token = l.token + 1, since = now(), expires = now()
FROM old WHERE l.run_id = old.run_id
RETURNING old.holder, old.token, old.since, old.expires, old.live"""


class PostgresRunLock:
    """A lease row per run on PostgreSQL, judged by the server's ``now()``.

    One short connection per call (no advisory lock, nothing pinned between calls);
    ``statement_timeout``/``lock_timeout`` and ``connect_timeout`` bound each call.
    """

    def __init__(self, url: str, *, call_seconds: float = CALL_SECONDS) -> None:
        self.url, self.call_seconds = url, call_seconds
        with self._conn() as conn, conn.transaction():
            # racing creators: IF NOT EXISTS alone still collides in the catalog
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('scratchbank_run_locks'))")
            conn.execute(_PG_TABLE)

    @contextlib.contextmanager
    def _conn(self) -> Iterator[Any]:
        import psycopg

        ms = int(self.call_seconds * 1000)
        try:
            with psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=max(2, int(self.call_seconds)),
                options=f"-c statement_timeout={ms} -c lock_timeout={ms}",
            ) as conn:
                yield conn
        except psycopg.Error as error:
            raise LockUnavailable(f"the lock's database: {error}") from error

    def _one(self, sql: str, **params: Any) -> Any:
        with self._conn() as conn:
            return conn.execute(sql, params).fetchone()

    def acquire(self, run_id: str, holder: str, *, ttl: float) -> LockGrant | None:
        check_run_id(run_id)
        if not holder:
            raise ValueError("a lock holder needs a name")
        row = self._one(_PG_ACQUIRE, run=run_id, holder=holder, ttl=ttl)
        return None if row is None else LockGrant(run_id, row[0], int(row[1]), row[2], row[3])

    def refresh(self, grant: LockGrant, *, ttl: float) -> LockGrant:
        row = self._one(_PG_REFRESH, run=grant.run_id, holder=grant.holder, token=grant.token, ttl=ttl)
        if row is None:
            raise lost(grant)
        return LockGrant(grant.run_id, grant.holder, grant.token, grant.since, row[3])

    def release(self, grant: LockGrant) -> None:
        with self._conn() as conn:
            conn.execute(_PG_RELEASE, {"run": grant.run_id, "holder": grant.holder, "token": grant.token})

    def holder(self, run_id: str) -> LockHolder | None:
        row = self._one(_PG_HOLDER, run=check_run_id(run_id))
        if row is None or not row[0]:
            return None
        return LockHolder(row[0], int(row[1]), row[2], row[3], bool(row[4]))

    def break_lock(self, run_id: str, *, by: str) -> LockHolder | None:
        row = self._one(_PG_BREAK, run=check_run_id(run_id))
        if row is None or not row[0]:
            return None
        return LockHolder(row[0], int(row[1]), row[2], row[3], bool(row[4]))
