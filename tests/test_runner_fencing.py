"""Fencing: a stale lease holder never lands a write after the new holder's first one.

On every Timeline adapter: in memory, SQLite, PostgreSQL.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from runner_rigs import checksum, types

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.fencing import FencedTimeline, Token
from scratchbank.application.ports import Timeline
from scratchbank.domain.errors import Fenced, TimelineConflict
from scratchbank.domain.records import AttemptClaimed, LeaseTaken, NodeFinished, RunStarted


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def timeline(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Timeline]:
    if request.param == "memory":
        yield InMemoryTimeline()
        return
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/timeline.db"
    else:
        url = request.getfixturevalue("postgres_url")
    tl = EventStoreTimeline(url)
    try:
        yield tl
    finally:
        tl.close()


def _run(timeline: Timeline) -> str:
    run = f"run-{uuid.uuid4().hex[:10]}"
    timeline.append(run, [RunStarted()])
    return run


def _node(name: str) -> NodeFinished:
    return NodeFinished(node=name, succeeded=True, kind="tool", in_sandbox=True, on_cycle=False)


def test_fence_stale_write_after_the_new_holders_first_is_refused(timeline: Timeline) -> None:
    """A paused holder wakes after a newer holder wrote: refused FENCED, nothing lands."""
    run = _run(timeline)
    stale = FencedTimeline(timeline, run, Token("a", 1))
    stale.read(run)
    stale.append(run, [_node("one")])
    fresh = FencedTimeline(timeline, run, Token("b", 2))
    fresh.append(run, [AttemptClaimed(attempt="a2")], expected=len(fresh.read(run)))
    before = checksum(timeline, run)
    with pytest.raises(Fenced) as refused:
        stale.append(run, [_node("two")])
    assert refused.value.code == "FENCED"
    with pytest.raises(Fenced):
        stale.read(run)
    assert checksum(timeline, run) == before


def test_fence_a_stale_write_before_the_new_holders_first_lands_and_the_claim_reads_again(
    timeline: Timeline,
) -> None:
    """The stale write lands first; the new holder's claim from its older read conflicts."""
    run = _run(timeline)
    stale = FencedTimeline(timeline, run, Token("a", 1))
    fresh = FencedTimeline(timeline, run, Token("b", 2))
    stale.read(run)
    seen = len(fresh.read(run))
    stale.append(run, [_node("one")])
    with pytest.raises(TimelineConflict):
        fresh.append(run, [AttemptClaimed(attempt="a2")], expected=seen)
    fresh.append(run, [AttemptClaimed(attempt="a2")], expected=len(fresh.read(run)))
    assert types(timeline.read(run)) == [
        "run_started",
        "lease_taken",
        "node_finished",
        "lease_taken",
        "attempt_claimed",
    ]


def test_fence_racing_holders_no_stale_record_follows_the_new_token(timeline: Timeline) -> None:
    """A stale holder writes in a loop while the new holder takes over: none of its records
    lands after the newer token, and it is refused from then on."""
    run = _run(timeline)
    stale = FencedTimeline(timeline, run, Token("a", 1))
    fresh = FencedTimeline(timeline, run, Token("b", 2))
    refused, writing, stop = threading.Event(), threading.Event(), threading.Event()

    def write_until_fenced() -> None:
        for i in range(100_000):  # bounded: it is fenced within a few writes of the claim
            if stop.is_set():
                return
            try:
                stale.append(run, [_node(f"stale-{i}")])
            except Fenced:
                refused.set()
                return
            if i == 5:
                writing.set()
            # A breath between writes, as a slow holder has: without it, on a server a
            # round trip away, the stale writer (one round trip a write) starves the new
            # holder's read-then-claim (two) for good. The writes still race the claim.
            stop.wait(0.002)

    writer = threading.Thread(target=write_until_fenced)
    writer.start()
    try:
        assert writing.wait(60)
        for _ in range(2000):
            try:
                fresh.append(run, [AttemptClaimed(attempt="a2")], expected=len(fresh.read(run)))
                break
            except TimelineConflict:
                continue
        writer.join(60)
    finally:
        stop.set()
        writer.join(60)
    assert refused.is_set()
    records = list(timeline.read(run))
    taken = [i for i, r in enumerate(records) if isinstance(r, LeaseTaken) and r.token == 2]
    assert len(taken) == 1
    after = records[taken[0] :]
    assert not [r for r in after if isinstance(r, NodeFinished)]


# --- a property: any interleaving of three holders' reads and writes ------------------

OPS = st.lists(st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from(["read", "write"])), max_size=30)


@settings(deadline=None, derandomize=True, max_examples=200)
@given(OPS)
def test_fence_property_no_write_lands_after_a_newer_token(ops: list[tuple[int, str]]) -> None:
    """Model (issue #13, item 4): a holder's write lands iff no newer holder has written yet;
    else it is refused FENCED. So no record lands after a newer token's first record."""
    tl = InMemoryTimeline()
    run = _run(tl)
    holders = {t: FencedTimeline(tl, run, Token(f"h{t}", t)) for t in (1, 2, 3)}
    newest_written = 0
    for token, op in ops:
        holder = holders[token]
        if op == "read":
            fenced = newest_written > token
            try:
                holder.read(run)
                assert not fenced
            except Fenced:
                assert fenced
            continue
        try:
            holder.append(run, [_node(f"h{token}")])
            assert newest_written <= token
            newest_written = max(newest_written, token)
        except Fenced:
            assert newest_written > token
    newest = 0
    for record in tl.read(run):
        if isinstance(record, LeaseTaken):
            newest = max(newest, record.token)
        elif isinstance(record, NodeFinished):
            assert int(record.node[1:]) == newest


def test_fence_records_round_trip_on_the_wire() -> None:
    """The runner's two records keep every field through the codec (the timeline's storage)."""
    from scratchbank.domain.records import ResumeRefused
    from scratchbank.domain.wire import decode, encode

    for rec in (
        LeaseTaken(holder="runner-a", token=42, attempt="a2"),
        ResumeRefused(code="SCRATCH_NOT_PORTABLE", rule="R2", hint="relaunch", attempt="a3"),
    ):
        assert decode(encode(rec)) == rec


#: every call of the BankStore port
STORE_CALLS = {"put", "fetch", "delete", "sweep", "stat", "objects"}


def test_fence_a_stale_store_write_is_refused_by_a_proxy_that_overrides_only_its_hook(tmp_path: Path) -> None:
    """The fenced store (and the test rig's held store) forward every BankStore call over
    ForwardingBankStore and override only ``before``: a stale holder's put, delete and
    sweep are refused Fenced with the store unchanged; reads pass."""
    import hashlib
    import io

    from held_runner import HeldBankStore

    from scratchbank.adapters.memory import InMemoryBankStore
    from scratchbank.application.fencing import FencedBankStore
    from scratchbank.application.ports import ForwardingBankStore

    for proxy in (FencedBankStore, HeldBankStore):
        assert issubclass(proxy, ForwardingBankStore)
        assert not STORE_CALLS & set(vars(proxy)), proxy  # no call spelled again
    timeline, inner = InMemoryTimeline(), InMemoryBankStore()
    run = _run(timeline)
    stale = FencedTimeline(timeline, run, Token("runner-a", 1))
    stale.announce()
    archive = tmp_path / "bank.tgz"
    archive.write_bytes(b"bank")
    digest = hashlib.sha256(b"bank").hexdigest()
    name = FencedBankStore(inner, stale).put(run, archive, sha256=digest)
    FencedTimeline(timeline, run, Token("runner-b", 2)).announce()
    before = (inner.objects(run), inner.stat(run, name))
    store = FencedBankStore(inner, stale)
    for write in (
        lambda: store.put(run, archive, sha256=digest),
        lambda: store.delete(run, name),
        lambda: store.sweep(run),
    ):
        with pytest.raises(Fenced):
            write()
    assert (inner.objects(run), inner.stat(run, name)) == before
    assert store.fetch(run, io.BytesIO(), max_bytes=1 << 20, name=name).bytes == 4
