"""Processes that take the run's lock, or hold it and die.

First written for tests/contracts/test_run_lock_contract.py: The run's lock (A16, ADR 0007): the
RunLock contract on every adapter (memory, real SQLite files, real PostgreSQL), across real
processes, and the runner's handed-in lease."""

from __future__ import annotations

from typing import Any

from scratchbank.adapters.run_lock import SqliteRunLock


def _acquire_in_process(path: str, holder: str, barrier: Any, ttl: float) -> bool:
    lock = SqliteRunLock(path)
    barrier.wait(timeout=60)
    return lock.acquire("run-1", holder, ttl=ttl) is not None


def _hold_and_die(path: str, ttl: float) -> None:
    lock = SqliteRunLock(path)
    assert lock.acquire("run-1", "x-doomed", ttl=ttl) is not None
