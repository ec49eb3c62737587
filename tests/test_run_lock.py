"""The run's lock (A16, ADR 0007): the RunLock contract on every adapter (memory, real
SQLite files, real PostgreSQL), across real processes, and the runner's handed-in lease."""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import eventually

from scratchbank.adapters.inprocess import InProcessLease
from scratchbank.adapters.run_lock import HandedLock, MemoryRunLock, PostgresRunLock, SqliteRunLock
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


def _acquire_in_process(path: str, holder: str, barrier: Any, ttl: float) -> bool:
    lock = SqliteRunLock(path)
    barrier.wait(timeout=60)
    return lock.acquire("run-1", holder, ttl=ttl) is not None


def _hold_and_die(path: str, ttl: float) -> None:
    lock = SqliteRunLock(path)
    assert lock.acquire("run-1", "x-doomed", ttl=ttl) is not None
    # the process ends here without releasing: as a crash would


def test_A16_sqlite_racing_processes_get_exactly_one_grant(tmp_path: Path) -> None:
    """Four processes acquire one run's lock in one SQLite file: exactly one grant."""
    ctx = multiprocessing.get_context("spawn")
    path = str(tmp_path / "timeline.locks")
    SqliteRunLock(path)
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            got = pool.starmap(_acquire_in_process, [(path, f"x-{i}", barrier, 60.0) for i in range(4)])
    assert got.count(True) == 1


def test_A16_sqlite_a_dead_holders_lease_lapses_and_is_taken_over(tmp_path: Path) -> None:
    """A process that dies holding the lock blocks nobody past its lease (expiry survives death)."""
    ctx = multiprocessing.get_context("spawn")
    path = str(tmp_path / "timeline.locks")
    proc = ctx.Process(target=_hold_and_die, args=(path, 1.0))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 0
    lock = SqliteRunLock(path)
    held = lock.holder("run-1")
    assert held is not None
    assert held.holder == "x-doomed"
    eventually(lambda: not lock.holder("run-1").live, what="the lease lapses")  # type: ignore[union-attr]
    grant = lock.acquire("run-1", "x-next", ttl=60.0)
    assert grant is not None
    assert grant.token == held.token + 1


def test_A16_the_runner_hands_its_lease_in_and_never_contends_with_itself() -> None:
    """With the runner's grant handed in, the lock answers that grant for its run (no
    contention), refreshes through the lease, and leaves releasing it to the runner."""
    lease = InProcessLease(lapse=60.0)
    runner_grant = lease.acquire("run-1", "runner-a")
    assert runner_grant is not None
    lock = HandedLock(lease, runner_grant)
    grant = lock.acquire("run-1", "x-exec", ttl=60.0)
    assert grant is not None
    assert (grant.holder, grant.token) == ("runner-a", runner_grant.token)
    assert lock.refresh(grant, ttl=60.0).token == runner_grant.token
    lock.release(grant)
    assert lease.acquire("run-1", "runner-b") is None  # still the runner's
    other = HandedLock(lease)  # another process, without the grant: the lease refuses it
    assert other.acquire("run-1", "x-other", ttl=60.0) is None


def test_A16_postgres_racing_first_users_create_the_lock_table_once(postgres_url: str) -> None:
    """Eight processes' first calls on a fresh database all get a lock (the table's creation
    does not collide in the catalog)."""
    import threading

    import psycopg

    name = "locks_" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = postgres_url.rsplit("/", 1)[0] + "/" + name
    barrier, errors = threading.Barrier(8), []

    def first_use() -> None:
        barrier.wait(timeout=30)
        try:
            PostgresRunLock(url)
        except Exception as error:  # collected for the assertion
            errors.append(error)

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
