"""Rules T: banking and its retries. The adapters tier's tests of T8 on the event store (tests/tiers.py:
a file of tests/rules/ has its tier in its name): a retried append lands once (issue 26).

An append whose insert landed but whose answer was lost (a connection cut after the commit) is
TimelineWriteFailed to its caller, who retries it (T8). Without an expected position the retry
would read the new length and insert the same records again after themselves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import OperationalError

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.domain.errors import TimelineWriteFailed
from scratchbank.domain.records import NodeFinished, RunStarted
from scratchbank.testing.builders import node, started


def _lossy(timeline: EventStoreTimeline, *, lands: bool) -> list[int]:
    """The next insert raises as a lost reply: after it committed (``lands``) or before."""
    real: Callable[[Any], None] = timeline._insert_events
    left = [1]

    def insert(stored: Any) -> None:
        if left and not lands:
            left.pop()
            raise OperationalError("server closed the connection unexpectedly")
        real(stored)
        if left:
            left.pop()
            raise OperationalError("server closed the connection unexpectedly")

    timeline._insert_events = insert
    return left


def _kinds(timeline: EventStoreTimeline, run_id: str) -> list[str]:
    return [type(r).__name__ for r in timeline.read(run_id)]


def test_T8_an_append_retried_after_its_answer_was_lost_lands_once(tmp_path: Path) -> None:
    """No expected position: the insert committed, its answer was lost; the caller's retry
    with the same records finds them in place and writes nothing more.
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline.append``."""
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db")
    timeline.append("run-1", [started()])
    records = [node("n1")]
    _lossy(timeline, lands=True)
    with pytest.raises(TimelineWriteFailed):
        timeline.append("run-1", records)
    assert timeline.append("run-1", records) == 2
    assert _kinds(timeline, "run-1") == ["RunStarted", "NodeFinished"]
    assert timeline.append("run-1", records) == 3  # a later append of the same records is its own


def test_T8_an_append_at_its_position_retried_after_its_answer_was_lost_is_no_conflict(
    tmp_path: Path,
) -> None:
    """With an expected position: the retry of a landed append is not another writer's conflict.
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline.append``."""
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db")
    timeline.append("run-1", [started()])
    _lossy(timeline, lands=True)
    with pytest.raises(TimelineWriteFailed):
        timeline.append("run-1", [node("n1")], expected=1)
    assert timeline.append("run-1", [node("n1")], expected=1) == 2
    assert _kinds(timeline, "run-1") == ["RunStarted", "NodeFinished"]


def test_T8_an_append_whose_answer_was_lost_before_it_landed_lands_on_retry(tmp_path: Path) -> None:
    """The insert failed before committing, and another writer took its place since: the
    retry lands once, after the other writer's records.
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline.append``."""
    url = f"sqlite:///{tmp_path}/t.db"
    timeline, other = EventStoreTimeline(url), EventStoreTimeline(url)
    timeline.append("run-1", [started()])
    _lossy(timeline, lands=False)
    with pytest.raises(TimelineWriteFailed):
        timeline.append("run-1", [node("n1")])
    other.append("run-1", [RunStarted()], expected=1)
    assert timeline.append("run-1", [node("n1")]) == 3
    read = timeline.read("run-1")
    assert [type(r) for r in read] == [RunStarted, RunStarted, NodeFinished]


def test_T2_a_small_scratchs_member_log_holds_no_fixed_size_filter() -> None:
    """The host's member log of a 200-member bank holds well under its 2 MiB key filter (built
    only once rows land on disk: 100 MiB at 50 teardowns at once before, issue 26); a path
    repeated past the first landed batch is still caught.
    Proves ``scratchbank.application.bank_format.spill_log.MemberLog.flush``."""
    import tracemalloc

    from scratchbank.application.bank_format.members import Member, PathTaken
    from scratchbank.application.bank_format.spill_log import MemberLog

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        log = MemberLog()
        for i in range(200):
            log.add(Member(f"d/f{i}", "file", i, 0o644, 0))
        log.flush()  # the end of the stream: its rows land
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 512 * 1024, f"{held} bytes held for 200 members"
    with pytest.raises(PathTaken):
        log.add(Member("d/f7", "file", 1, 0o644, 0))
    for i in range(200, 2 * MemberLog.BATCH + 10):  # rows after the end's flush: the filter grows
        log.add(Member(f"d/f{i}", "file", i, 0o644, 0))
    for path in ("d/f7", f"d/f{MemberLog.BATCH}"):
        with pytest.raises(PathTaken):
            log.add(Member(path, "file", 1, 0o644, 0))
    assert sorted(m.path for m in log) == sorted(f"d/f{i}" for i in range(2 * MemberLog.BATCH + 10))
    log.close()


def test_T8_a_lost_append_retried_after_another_append_landed_still_lands_once(tmp_path: Path) -> None:
    """The lost insert committed, another append of this process landed after it, then the
    lost one is retried: still written once.
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline.append``."""
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db")
    timeline.append("run-1", [started()])
    real = timeline._insert_events
    _lossy(timeline, lands=True)
    with pytest.raises(TimelineWriteFailed):
        timeline.append("run-1", [node("n1")])
    timeline._insert_events = real
    assert timeline.append("run-1", [RunStarted()]) == 3
    assert timeline.append("run-1", [node("n1")]) == 2  # where its records end: they landed first
    assert _kinds(timeline, "run-1") == ["RunStarted", "NodeFinished", "RunStarted"]


def test_T8_two_lost_appends_on_one_run_each_land_once_on_their_retries(tmp_path: Path) -> None:
    """Two appends to one run lose their answers (two callers on one timeline object), both
    had committed: each retry finds its own records in place, neither is written twice.
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline.append``."""
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db")
    timeline.append("run-1", [started()])
    real = timeline._insert_events
    for name in ("n1", "n2"):
        _lossy(timeline, lands=True)
        with pytest.raises(TimelineWriteFailed):
            timeline.append("run-1", [node(name)])
        timeline._insert_events = real
    assert timeline.append("run-1", [node("n1")]) == 2
    assert timeline.append("run-1", [node("n2")]) == 3
    assert _kinds(timeline, "run-1") == ["RunStarted", "NodeFinished", "NodeFinished"]


def test_T8_two_lost_appends_at_their_positions_retried_are_no_conflict(tmp_path: Path) -> None:
    """With expected positions: the first lost append's retry is not taken for another
    writer's conflict because a second append of the run lost its answer after it.
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline.append``."""
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db")
    timeline.append("run-1", [started()])
    real = timeline._insert_events
    for at, name in ((1, "n1"), (2, "n2")):
        _lossy(timeline, lands=True)
        with pytest.raises(TimelineWriteFailed):
            timeline.append("run-1", [node(name)], expected=at)
        timeline._insert_events = real
    assert timeline.append("run-1", [node("n1")], expected=1) == 2
    assert timeline.append("run-1", [node("n2")], expected=2) == 3
    assert _kinds(timeline, "run-1") == ["RunStarted", "NodeFinished", "NodeFinished"]


def test_T8_threads_losing_answers_on_one_run_each_land_their_records_once(tmp_path: Path) -> None:
    """Six threads append to one run through one timeline object, half their inserts losing
    the answer (committed or not, by a seeded draw) and each retried until it lands: every
    thread's records are in the run exactly once, in its own order.
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline.append``."""
    import random
    import threading

    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db")
    timeline.append("run-1", [started()])
    real = timeline._insert_events
    draws, lock = random.Random(7), threading.Lock()

    def lossy(stored: Any) -> None:
        with lock:
            lose, lands = draws.random() < 0.5, draws.random() < 0.5
        if lose and not lands:
            raise OperationalError("server closed the connection unexpectedly")
        real(stored)
        if lose:
            raise OperationalError("server closed the connection unexpectedly")

    timeline._insert_events = lossy

    def appender(t: int) -> None:
        for k in range(8):
            while True:
                try:
                    timeline.append("run-1", [node(f"t{t}-{k}")])
                    break
                except TimelineWriteFailed:
                    continue

    threads = [threading.Thread(target=appender, args=(t,)) for t in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120.0)
    timeline._insert_events = real
    names = [r.node for r in timeline.read("run-1")[1:] if isinstance(r, NodeFinished)]
    assert sorted(names) == sorted(f"t{t}-{k}" for t in range(6) for k in range(8))
    for t in range(6):
        assert [n for n in names if n.startswith(f"t{t}-")] == [f"t{t}-{k}" for k in range(8)]


@pytest.mark.parametrize("between", [False, True])
def test_T8_a_lost_append_across_a_snapshot_leaves_the_snapshot_of_what_landed(
    tmp_path: Path, between: bool
) -> None:
    """A lost append that crossed a multiple of ``snapshot_every`` (committed), retried after
    another append of the run or not: the snapshot a fresh process reads is the fold of what
    the run holds at its position, and the run holds each record once.
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline.append``."""
    from scratchbank.domain.fold import fold
    from scratchbank.domain.snapshot import state_to_data

    url = f"sqlite:///{tmp_path}/t.db"
    timeline = EventStoreTimeline(url, snapshot_every=2)
    timeline.append("run-1", [started()])
    real = timeline._insert_events
    _lossy(timeline, lands=True)
    with pytest.raises(TimelineWriteFailed):
        timeline.append("run-1", [node("n1"), node("n2")])
    timeline._insert_events = real
    if between:
        assert timeline.append("run-1", [node("n3"), node("n4")]) == 5
    assert timeline.append("run-1", [node("n1"), node("n2")]) == 3
    fresh = EventStoreTimeline(url, snapshot_every=2)
    records = fresh.read("run-1")
    assert [r.node for r in records[1:] if isinstance(r, NodeFinished)] == ["n1", "n2"] + (
        ["n3", "n4"] if between else []
    )
    snap = fresh.load_snapshot("run-1")
    assert snap is not None
    assert snap[1] == state_to_data(fold(records[: snap[0]]))
