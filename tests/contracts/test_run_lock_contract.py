"""The run's lock (A16, ADR 0007): the RunLock contract on every adapter (memory, real
SQLite files, real PostgreSQL), across real processes, and the runner's handed-in lease."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import eventually

from scratchbank.adapters.run_lock import MemoryRunLock, PostgresRunLock, SqliteRunLock
from scratchbank.application.ports import RunLock
from scratchbank.testing.clocks import ManualClock
from scratchbank.testing.contracts import RunLockContract


class TestMemoryRunLockContract(RunLockContract):
    def make(self) -> RunLock:
        self.clock = ManualClock()
        return MemoryRunLock(self.clock)

    def pass_time(self, lock: RunLock, seconds: float) -> None:
        self.clock.advance(seconds)


class TestSqliteRunLockContract(RunLockContract):
    @pytest.fixture(autouse=True)
    def _folder(self, tmp_path: Path) -> None:
        self.folder = tmp_path

    def make(self) -> RunLock:
        self.clock = ManualClock()
        return SqliteRunLock(self.folder / f"{uuid.uuid4().hex[:8]}.locks", clock=self.clock)

    def pass_time(self, lock: RunLock, seconds: float) -> None:
        self.clock.advance(seconds)


@pytest.fixture(scope="module")
def lock_database(postgres_url: str) -> str:
    """A database of its own, so the contract's fixed run ids meet no other test's rows."""
    import psycopg

    name = "locks_" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres_url.rsplit("/", 1)[0] + "/" + name


class TestPostgresRunLockContract(RunLockContract):
    """The server's clock judges expiry: the lapse clause really waits one short lease."""

    TTL = 1.0

    @pytest.fixture(autouse=True)
    def _database(self, lock_database: str) -> Iterator[None]:
        self.url = lock_database
        yield
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("DELETE FROM scratchbank_run_locks")

    def make(self) -> RunLock:
        lock = PostgresRunLock(self.url)
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("DELETE FROM scratchbank_run_locks")
        return lock

    def pass_time(self, lock: RunLock, seconds: float) -> None:
        """Waits on the server's own clock (the one that judges expiry) until it moved on."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:

            def server_now() -> float:
                row = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
                assert row is not None
                return float(row[0])

            start = server_now()
            eventually(
                lambda: server_now() >= start + seconds, what="the server's clock moves on", interval=0.1
            )
