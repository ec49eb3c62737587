"""Processes racing on one parked run (resumes and teardowns, SQLite and PostgreSQL) and what each got.

First written for tests/rules/test_[AC]*.py: Claims under real races (C7, R10, A16): 2 to 8
processes on one parked run, on SQLite and on PostgreSQL, resumes against resumes and against a
teardown, under the run's lock."""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from race_workers import FILES, serve

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.memory import FakeSandbox
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain.records import RunStarted
from scratchbank.testing.builders import node

#: Rounds per shape and store; the counts are printed (pytest -s) for the report.
ROUNDS = 3


#: Rounds of the staggered race per store (strict: one ``run_resumed`` in every round).
STAGGERED_ROUNDS = 12


SHAPES = [(2, 0), (4, 0), (8, 0), (3, 1), (7, 1)]  # (resumes, teardowns)


WORKERS = 8


COUNTS: dict[str, dict[str, int]] = {}


#: The parked execution's id: the racing teardown is that execution's sandbox's (A18), as the
#: service's and the runner's teardowns name theirs. (A teardown that names none banks the
#: execution latest at its first read: one that first reads after a resume's claim would bank as
#: the new execution's, and the race would be another test's.)
PARKED = "x-parked"


@pytest.fixture(scope="module")
def racers() -> Iterator[tuple[Any, Any, Any]]:
    """Eight long-lived spawned processes (each round reuses them) and a manager for barriers."""
    ctx = multiprocessing.get_context("spawn")
    manager = ctx.Manager()
    tasks, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=serve, args=(tasks, results), daemon=True) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    try:
        yield manager, tasks, results
    finally:
        for _ in procs:
            tasks.put(None)
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
        manager.shutdown()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/timeline.db"
    import psycopg

    url: str = request.getfixturevalue("postgres_url")
    name = "race_" + uuid.uuid4().hex[:12]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name


def parked_run(url: str, banks: Path) -> tuple[str, int]:
    """A run parked with a bank of FILES by its execution ``PARKED``; (run id, the timeline's length)."""
    run_id = "run-" + uuid.uuid4().hex[:8]
    timeline = EventStoreTimeline(url)
    try:
        timeline.append(run_id, [RunStarted(execution=PARKED), node("clone", "tool")], expected=0)
        report = bank_at_teardown(
            run_id,
            timeline=timeline,
            store=FilesystemBankStore(banks),
            sandbox=FakeSandbox(dict(FILES)),
            run_finished=False,
            execution=PARKED,
        )
        assert report.recorded
        return run_id, len(timeline.read(run_id))
    finally:
        timeline.close()


def race(
    racers: tuple[Any, Any, Any],
    url: str,
    banks: Path,
    resumes: int,
    teardowns: int,
    *,
    window: bool = False,
    lock: bool = True,
) -> list[Any]:
    """One round: ``resumes`` and ``teardowns`` racing processes on a parked run. ``window``:
    the first resume starts alone and its restore is held open while the others race
    (race_workers.HeldRestore)."""
    manager, tasks, results = racers
    run_id, version = parked_run(url, banks)
    barrier = manager.Barrier(resumes + teardowns)
    roles = ["teardown"] * teardowns + ["resume"] * resumes
    held = (manager.Event(), manager.Queue(), len(roles) - 1) if window else None
    for i, role in enumerate(roles):
        task = {
            "url": url,
            "banks": str(banks),
            "run": run_id,
            "role": role,
            "barrier": barrier,
            "lock": lock,
            "execution": PARKED,
        }
        tasks.put(task | {"window": held, "first": i == teardowns})
    got = [results.get(timeout=120) for _ in roles]
    errors = [g["error"] for g in got if g["result"] == "error"]
    assert not errors, errors[0]
    timeline = EventStoreTimeline(url)
    try:
        after = timeline.read(run_id)[version:]
    finally:
        timeline.close()
    return [got, after]
