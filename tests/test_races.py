"""Claims under real races (C7, R10, A16): 2 to 8 processes on one parked run, on SQLite
and on PostgreSQL, resumes against resumes and against a teardown, under the run's lock.

Every round: all racers start together at a barrier. Exactly one claim lands; every
other resume is refused RUN_LOCKED (or superseded) and writes nothing; a teardown that
lost the run writes nothing either, and one that recorded first is decided on again by
the resumes, which restore the bank it recorded. The staggered race starts four resumes
a step apart, so each later one reads the run while the first is still restoring: the
window that recorded two ``run_resumed`` in about one round of three before the lock.
A fixed number of rounds runs in CI.
"""

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
from scratchbank.domain.records import RunResumed, ScratchBanked, ScratchRestored
from scratchbank.testing.builders import node, started

#: Rounds per shape and store; the counts are printed (pytest -s) for the report.
ROUNDS = 3
#: Rounds of the staggered race per store (strict: one ``run_resumed`` in every round).
STAGGERED_ROUNDS = 12
SHAPES = [(2, 0), (4, 0), (8, 0), (3, 1), (7, 1)]  # (resumes, teardowns)
WORKERS = 8
COUNTS: dict[str, dict[str, int]] = {}


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
    """A run parked with a bank of FILES; (run id, the timeline's length)."""
    run_id = "run-" + uuid.uuid4().hex[:8]
    timeline = EventStoreTimeline(url)
    try:
        timeline.append(run_id, [started(), node("clone", "tool")], expected=0)
        report = bank_at_teardown(
            run_id,
            timeline=timeline,
            store=FilesystemBankStore(banks),
            sandbox=FakeSandbox(dict(FILES)),
            run_finished=False,
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
    stagger: float = 0.0,
    restore_pause: float = 0.0,
    lock: bool = True,
) -> list[Any]:
    manager, tasks, results = racers
    run_id, version = parked_run(url, banks)
    barrier = manager.Barrier(resumes + teardowns)
    roles = ["teardown"] * teardowns + ["resume"] * resumes
    for i, role in enumerate(roles):
        task = {
            "url": url,
            "banks": str(banks),
            "run": run_id,
            "role": role,
            "barrier": barrier,
            "lock": lock,
        }
        tasks.put(task | {"stagger": i * stagger, "restore_pause": restore_pause})
    got = [results.get(timeout=120) for _ in roles]
    errors = [g["error"] for g in got if g["result"] == "error"]
    assert not errors, errors[0]
    timeline = EventStoreTimeline(url)
    try:
        after = timeline.read(run_id)[version:]
    finally:
        timeline.close()
    return [got, after]


def test_A16_C7_staggered_resumes_record_exactly_one_run_resumed_in_every_round(
    racers: tuple[Any, Any, Any], store_url: str, tmp_path: Path
) -> None:
    """Four processes resume one parked run a step apart, each later one while the first
    restores: every round records one ``run_resumed`` and one restore; the others are
    refused RUN_LOCKED (retryable) and write nothing."""
    backend = store_url.split(":", 1)[0]
    counts = COUNTS.setdefault(f"{backend} staggered 4r", {})
    for _ in range(STAGGERED_ROUNDS):
        got, after = race(racers, store_url, tmp_path / "banks", 4, 0, stagger=0.1, restore_pause=0.5)
        outcomes = [g["result"] for g in got]
        kinds = [type(r).__name__ for r in after]
        for outcome in outcomes:
            counts[outcome] = counts.get(outcome, 0) + 1
        counts["run_resumed"] = counts.get("run_resumed", 0) + kinds.count("RunResumed")
        counts["rounds"] = counts.get("rounds", 0) + 1
        assert kinds.count("RunResumed") == 1, (outcomes, kinds)
        assert kinds == ["RunResumed", "ScratchRestored"], (outcomes, kinds)
        assert outcomes.count("restored") == 1, outcomes
        assert outcomes.count("locked") + outcomes.count("superseded") == 3, outcomes
    print(f"\nraces {COUNTS}")


@pytest.mark.parametrize(("resumes", "teardowns"), SHAPES, ids=[f"{r}r+{t}t" for r, t in SHAPES])
def test_C7_exactly_one_racer_claims_the_run_and_the_others_write_nothing(
    racers: tuple[Any, Any, Any], store_url: str, tmp_path: Path, resumes: int, teardowns: int
) -> None:
    backend = store_url.split(":", 1)[0]
    counts = COUNTS.setdefault(f"{backend} {resumes}r+{teardowns}t", {})
    for _ in range(ROUNDS):
        got, after = race(racers, store_url, tmp_path / "banks", resumes, teardowns)
        outcomes = [g["result"] for g in got if g["role"] == "resume"]
        teardown = [g["result"] for g in got if g["role"] == "teardown"]
        kinds = [type(r).__name__ for r in after]
        # exactly one resume restores; every other resume is superseded
        assert outcomes.count("restored") == 1, (outcomes, kinds)
        losers = outcomes.count("superseded") + outcomes.count("locked")
        assert losers == resumes - 1, (outcomes, kinds)
        assert [g["files"] for g in got if g.get("result") == "restored"] == [FILES]
        # the losers wrote nothing: one claim, one restore record, at most the teardown's
        assert sum(isinstance(r, RunResumed) for r in after) == 1, kinds
        assert sum(isinstance(r, ScratchRestored) for r in after) == 1, kinds
        recorded = teardown.count("recorded")
        assert sum(isinstance(r, ScratchBanked) for r in after) == recorded, (teardown, kinds)
        if recorded:  # a teardown that won recorded before every claim
            assert isinstance(after[0], ScratchBanked), kinds
        assert len(after) == 2 + recorded, kinds
        for key in ("rounds", f"teardown {'won' if recorded else 'lost'}" if teardowns else ""):
            if key:
                counts[key] = counts.get(key, 0) + 1
        counts["losers' writes"] = counts.get("losers' writes", 0) + len(after) - 2 - recorded
        counts["superseded"] = counts.get("superseded", 0) + outcomes.count("superseded")
        counts["locked"] = counts.get("locked", 0) + outcomes.count("locked")
    print(f"\nraces {COUNTS}")
