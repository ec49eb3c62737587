"""Rules A: readings this project chose where the design is open. The engines tier's tests of A15, A16,
A17, A19 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from email.utils import format_datetime, parsedate_to_datetime
from pathlib import Path
from typing import Any
from unittest import mock

import anyio
import attrs
import httpx
import operator_rigs
import pytest
from botocore.exceptions import ClientError
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import stdio_client
from operator_rigs import EXE, TOKEN, tree_digest
from rigs.bank_store_hooks import (
    NEW,
    OLD,
    RUN,
    AfterPut,
    FullDisk,
    ObjectsHook,
    PutHook,
    archive_of,
    assert_recorded_bank_fetchable_and_matching,
    recorded_bank,
    s3_store,
    store,  # noqa: F401 - a fixture
    stored_hours_ago,
    teardown,
)
from rigs.http_api import (
    AUTH,
    api,  # noqa: F401 - a fixture
    home,  # noqa: F401 - a fixture
    service,  # noqa: F401 - a fixture
)
from rigs.lock_processes import _acquire_in_process, _hold_and_die
from rigs.mcp_client import (
    Human,
    _env,
    _payload,
    _start_http,
    assistant_story,
    bad_arguments,
    elicitation_story,
    http_session,
    rig,  # noqa: F401 - a fixture
)
from rigs.racing_processes import (
    COUNTS,
    STAGGERED_ROUNDS,
    race,
    racers,  # noqa: F401 - a fixture
    store_url,  # noqa: F401 - a fixture
)
from rigs.s3_buckets import STAMP, _src, new_bucket, s3_client
from waiting import eventually

from scratchbank.adapters import fs_bank
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.inprocess import InProcessLease
from scratchbank.adapters.mcp_server import ask_seconds, consent_name, judge_consent
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.run_lock import HandedLock, PostgresRunLock, SqliteRunLock
from scratchbank.adapters.s3_bank import S3BankStore
from scratchbank.application.ports import BankStore, Placed, StoredBank
from scratchbank.application.resume import resume
from scratchbank.application.service import ScratchService
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import ResumeRequest, errors, fold
from scratchbank.domain.errors import BankGone, BankReadFailed, BankWriteFailed, TimelineUnreadable
from scratchbank.domain.objects import BankStamp, StoredObject, listed_now, object_name, over_bound
from scratchbank.domain.records import ScratchBanked
from scratchbank.domain.resume_gate import decide_resume
from scratchbank.domain.wire import decode, encode
from scratchbank.testing.builders import banked, node, started, unbanked
from scratchbank.testing.clocks import HUNG_SECONDS, ManualClock
from scratchbank.testing.contracts import check_bank_store

# ---- from tests/rules/test_[AN]*.py: Banks as content-named, create-only objects the record names (A17), and reconciliation (N3).


def test_A17_a_losing_teardowns_put_no_longer_overwrites_the_recorded_bank(store: BankStore) -> None:
    """An older execution's teardown passes its pre-upload check; a newer execution then
    resumes, banks and records; the loser's put lands: the recorded bank is intact.
    Proves ``scratchbank.application.resume.resume``."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    hooked = PutHook(store)

    def newer_execution_runs_and_banks() -> None:
        assert resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({})).proceeds
        timeline.append(RUN, [node("measure", "agent")])
        assert teardown(timeline, store, NEW).recorded

    hooked.before_put = newer_execution_runs_and_banks
    loser = teardown(timeline, hooked, OLD)  # type: ignore[arg-type]
    assert not loser.recorded and loser.superseded
    assert_recorded_bank_fetchable_and_matching(timeline, store)
    box = FakeSandbox({})
    out = resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=box)
    assert out.proceeds and box.files == NEW


def test_A17_a_put_that_lands_late_after_a_newer_record_leaves_the_recorded_bank(
    store: BankStore, tmp_path: Path
) -> None:
    """A put cancelled on a lost lease lands after the newer bank was recorded: it is an
    object nobody names; the recorded bank is fetchable and matches.
    Proves ``scratchbank.application.resume.resume``."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    assert teardown(timeline, store, NEW).recorded
    late, digest = archive_of(OLD, tmp_path)
    store.put(RUN, late, sha256=digest, stamp=BankStamp(RUN, "@0", late.stat().st_size, digest))
    assert_recorded_bank_fetchable_and_matching(timeline, store)
    box = FakeSandbox({})
    out = resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=box)
    assert out.proceeds and box.files == NEW


def test_A17_a_put_between_a_resumes_claim_and_its_fetch_changes_nothing_it_restores(
    store: BankStore, tmp_path: Path
) -> None:
    """The resume claimed on the recorded bank; a stray put lands before its fetch; it
    restores exactly the bank its record names. Proves ``scratchbank.application.resume.resume``."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    assert teardown(timeline, store, NEW).recorded
    hooked = PutHook(store)
    stray, digest = archive_of(OLD, tmp_path)
    hooked.before_fetch = lambda: store.put(RUN, stray, sha256=digest)  # type: ignore[assignment, func-returns-value]
    box = FakeSandbox({})
    out = resume(RUN, ResumeRequest(), timeline=timeline, store=hooked, sandbox=box)  # type: ignore[arg-type]
    assert out.proceeds and box.files == NEW


def test_A17_N3_a_put_whose_record_fails_keeps_both_banks(store: BankStore) -> None:
    """The newer teardown stores its bank, then its record fails (full disk): the recorded
    bank and the new one are both kept; status lists the new one as unrecorded.
    Proves ``scratchbank.application.resume.resume``."""
    timeline = FullDisk()
    timeline.append(RUN, [started()])
    assert teardown(timeline, store, OLD).recorded
    assert resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({})).proceeds
    timeline.full = True
    report = teardown(timeline, store, NEW, record_seconds=0.0)
    assert not report.recorded
    timeline.full = False
    assert_recorded_bank_fetchable_and_matching(timeline, store)
    assert len([o for o in store.objects(RUN) if o.name is not None]) == 2
    status = ScratchService(timeline, store, clock=ManualClock()).status(RUN)  # type: ignore[arg-type]
    assert status.unreferenced is not None and status.unreferenced.record is not None
    assert status.unreferenced.record.name == object_name(report.record.sha256)  # type: ignore[union-attr]


def test_A17_T4_an_empty_teardown_whose_record_fails_keeps_the_previous_bank(store: BankStore) -> None:
    """Before A17 the empty scratch deleted the bank, then its record failed: the bank a
    record names was gone. Now nothing is deleted until the record lands.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    timeline = FullDisk()
    timeline.append(RUN, [started()])
    assert teardown(timeline, store, OLD).recorded
    timeline.full = True
    assert not teardown(timeline, store, {}, record_seconds=0.0).recorded
    timeline.full = False
    assert_recorded_bank_fetchable_and_matching(timeline, store)


def test_A17_T4_T5_once_recorded_the_bank_no_record_needs_is_deleted(store: BankStore) -> None:
    """Empty (T4) and finished (T5): the previous bank is deleted after the record lands.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    for finished in (False, True):
        timeline = InMemoryTimeline()
        store.sweep(RUN)
        timeline.append(RUN, [started()])
        assert teardown(timeline, store, OLD).recorded
        report = bank_at_teardown(
            RUN,
            timeline=timeline,
            store=store,
            sandbox=FakeSandbox({}),
            run_finished=finished,
            clock=ManualClock(),  # type: ignore[arg-type]
        )
        assert report.recorded and fold(timeline.read(RUN)).bank is None
        assert list(store.objects(RUN)) == []


def test_A17_a_newer_bank_replaces_the_older_one_only_once_recorded(store: BankStore) -> None:
    """Two banks in a row: after the second record the first object is deleted; the second is kept.
    Proves ``scratchbank.application.resume.resume``."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    assert teardown(timeline, store, OLD).recorded
    assert resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({})).proceeds
    assert teardown(timeline, store, NEW).recorded
    assert [o.name for o in store.objects(RUN)] == [recorded_bank(timeline).object]


def test_A17_the_prune_never_deletes_a_young_unrecorded_object_and_bounds_old_ones(
    store: BankStore, tmp_path: Path
) -> None:
    """Past the count (3), only objects older than the age (1 h) are swept, oldest first: a
    put on its way to its record is never pruned. Ages are the store's (issue 26): the writers'
    stamps here say the opposite (the old object's writer ran a day ahead, the young ones' 3 h
    behind) and change nothing. Proves ``scratchbank.domain.objects.over_bound``."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    clock = ManualClock()
    strays = []
    for i, hours_old in enumerate((3, 0, 0, 0, 0)):
        path, digest = archive_of({f"f{i}": b"x" * (i + 1)}, tmp_path)
        at = clock.now() + (timedelta(days=1) if hours_old else -timedelta(hours=3, minutes=i))
        store.put(RUN, path, sha256=digest, stamp=BankStamp(RUN, "@9", path.stat().st_size, digest, "", at))
        stored_hours_ago(store, object_name(digest), hours_old)
        strays.append(object_name(digest))
    report = bank_at_teardown(
        RUN, timeline=timeline, store=store, sandbox=FakeSandbox(dict(NEW)), run_finished=False, clock=clock
    )
    assert report.recorded
    left = {o.name for o in store.objects(RUN)}
    # 2 past the count, but only one is older than the age: it alone is swept
    assert left == {recorded_bank(timeline).object, *strays[1:]}


def test_A17_a_legacy_record_reads_and_restores_from_the_old_key(tmp_path: Path) -> None:
    """A v1 `sandbox_scratch_banked` (no object) reads as naming the old key and restores from it.
    Proves ``scratchbank.domain.wire.decode``."""
    path, digest = archive_of(NEW, tmp_path)
    store = FilesystemBankStore(tmp_path / "banks")
    legacy = tmp_path / "banks/runs" / RUN / "scratch-bank.tgz"
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(path.read_bytes())
    v1 = {"type": "sandbox_scratch_banked", "v": 1, "banked": True, "empty": False, "unknown": False}
    record = decode({**v1, "bytes": path.stat().st_size, "sha256": digest})
    assert isinstance(record, ScratchBanked) and record.object is None
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started(), record])
    box = FakeSandbox({})
    out = resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=box)
    assert out.proceeds and box.files == NEW


def test_A17_the_record_names_its_object_on_the_wire_and_a_foreign_name_is_unreadable() -> None:
    """v2+ carries `object` (v3 adds the checkpoint); a foreign name makes the timeline unreadable."""
    digest = "ab" * 32
    rec = ScratchBanked(
        banked=True, empty=False, unknown=False, bytes=5, sha256=digest, object=f"banks/{digest}.tgz"
    )
    wire = encode(rec)
    assert wire["v"] >= 2 and wire["object"] == f"banks/{digest}.tgz" and decode(wire) == rec
    for bad in ("../../etc/passwd", f"banks/{'cd' * 32}.tgz", "scratch.tgz"):
        with pytest.raises(TimelineUnreadable):
            decode({**wire, "object": bad})


def test_A17_a_record_naming_an_object_outside_the_bank_prefix_is_refused_on_the_host() -> None:
    """A record held in memory (never through the wire's check) that names `../x` restores
    nothing and parks as refused on the host (X4), never "read again" forever (X5).
    Proves ``scratchbank.application.resume.resume``."""
    store = InMemoryBankStore()
    hostile = ScratchBanked(
        banked=True, empty=False, unknown=False, bytes=10, sha256="0" * 64, object="../x.tgz"
    )
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started(), hostile])
    box = FakeSandbox({})
    out = resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=box)
    assert out.restore is not None and out.restore.park is not None and box.files == {}
    assert (
        "refused_on_host" in out.restore.record.reason and "INVALID_BANK_OBJECT" in out.restore.record.reason
    )


def test_A17_a_prune_never_deletes_an_object_a_record_landing_during_it_names(store: BankStore) -> None:
    """The explorer's prune race: a record naming an object lands between a prune's read and its delete.
    Proves ``scratchbank.application.resume.resume``."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    assert teardown(timeline, store, OLD).recorded
    assert resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({})).proceeds
    hooked = ObjectsHook(store)

    def older_teardown_records_the_same_content() -> None:
        assert teardown(timeline, store, OLD).recorded  # its put found the object present

    hooked.before_objects = older_teardown_records_the_same_content
    assert teardown(timeline, hooked, NEW).recorded  # type: ignore[arg-type]
    assert hooked.before_objects is None  # the older teardown ran inside the newer one's prune
    assert_recorded_bank_fetchable_and_matching(timeline, store)


def test_A17_a_record_landing_after_a_prunes_delete_puts_its_object_back(store: BankStore) -> None:
    """The prune race's other order: old:S.put > new:prune (read, delete, re-read) > old:T.append.
    Proves ``scratchbank.application.resume.resume``."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    assert teardown(timeline, store, OLD).recorded
    assert resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({})).proceeds
    reports = _older_put_then_newer_prune(timeline, store, NEW)
    assert reports and reports[0].recorded
    assert_recorded_bank_fetchable_and_matching(timeline, store)


def _older_put_then_newer_prune(
    timeline: InMemoryTimeline, store: BankStore, newer_scratch: Any, between: Any = lambda: None
) -> list[Any]:
    """The prune race: an older teardown of ``OLD`` reads and puts, then waits while a newer
    teardown of ``newer_scratch`` (recorded: asserted) reads, prunes and re-reads (then
    ``between`` runs); then the older one records. The older one's report."""
    old_put, pruned = threading.Event(), threading.Event()
    older = AfterPut(store)

    def wait_for_the_prune() -> None:
        old_put.set()
        assert pruned.wait(60)

    older.after_put = wait_for_the_prune
    reports: list[Any] = []
    old = threading.Thread(target=lambda: reports.append(teardown(timeline, older, OLD)))  # type: ignore[arg-type]
    newer = ObjectsHook(store)

    def the_older_teardown_reads_and_puts() -> None:
        old.start()
        assert old_put.wait(60)

    newer.before_objects = the_older_teardown_reads_and_puts
    assert teardown(timeline, newer, newer_scratch).recorded  # type: ignore[arg-type]
    between()
    pruned.set()
    old.join(60)
    return reports


def test_A17_a_record_naming_an_object_an_earlier_record_named_is_looked_at_though_its_put_created_it(
    store: BankStore,
) -> None:
    """Issue 26's skipped look is not skipped here: X was recorded, replaced and pruned; a teardown
    of X's content creates X afresh while a prune whose read names X (by the old record) deletes it.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    assert teardown(timeline, store, OLD).recorded
    old_object = recorded_bank(timeline).object
    assert resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({})).proceeds
    assert teardown(timeline, store, NEW).recorded
    assert old_object not in {o.name for o in store.objects(RUN)}  # pruned once replaced
    assert resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({})).proceeds
    # the old content is put afresh while the newer prune's read names it by the old record
    reports = _older_put_then_newer_prune(timeline, store, {"notes.txt": b"a third scratch"})
    assert reports and reports[0].recorded and recorded_bank(timeline).object == old_object
    assert any("put back" in note for note in reports[0].notes)
    assert_recorded_bank_fetchable_and_matching(timeline, store)


def test_A17_a_record_naming_an_object_its_put_found_there_is_looked_at(
    store: BankStore, tmp_path: Path
) -> None:
    """Issue 26's skipped look needs the put's create: X lay unreferenced past the bound (3 h old);
    a teardown's put of X's content finds it there while a prune sweeps it as over the bound.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    now = ManualClock().now()
    for i, (files, hours_old) in enumerate(((OLD, 3), ({"a": b"1"}, 0), ({"b": b"2"}, 0), ({"c": b"3"}, 0))):
        path, digest = archive_of(files, tmp_path)
        at = now - timedelta(hours=hours_old, minutes=i)
        store.put(RUN, path, sha256=digest, stamp=BankStamp(RUN, "@9", path.stat().st_size, digest, "", at))
        stored_hours_ago(store, object_name(digest), hours_old)
    x = object_name(archive_of(OLD, tmp_path)[1])

    def swept_as_over_the_bound() -> None:  # the old content was put, found there, then swept
        assert x not in {o.name for o in store.objects(RUN)}

    reports = _older_put_then_newer_prune(timeline, store, NEW, swept_as_over_the_bound)
    assert reports and reports[0].recorded and recorded_bank(timeline).object == x
    assert any("put back" in note for note in reports[0].notes)
    assert_recorded_bank_fetchable_and_matching(timeline, store)


def _lagging_put_inside_a_leading_prune(
    timeline: InMemoryTimeline, store: BankStore, leading: ManualClock, lagging: ManualClock
) -> list[Any]:
    """A teardown of ``NEW`` on the ``leading`` clock records; inside its prune's listing a
    teardown of ``OLD`` on the ``lagging`` clock reads (past that record) and puts; once the
    prune is done it records (right after its read: its look is skipped). Its report."""
    lagging_put, pruned = threading.Event(), threading.Event()
    lagger = AfterPut(store)

    def wait_for_the_prune() -> None:
        lagging_put.set()
        assert pruned.wait(HUNG_SECONDS)

    lagger.after_put = wait_for_the_prune
    reports: list[Any] = []
    lag = threading.Thread(target=lambda: reports.append(teardown(timeline, lagger, OLD, clock=lagging)))  # type: ignore[arg-type]
    leader = ObjectsHook(store)

    def the_lagging_teardown_reads_and_puts() -> None:
        lag.start()
        assert lagging_put.wait(HUNG_SECONDS)

    leader.before_objects = the_lagging_teardown_reads_and_puts
    assert teardown(timeline, leader, NEW, clock=leading).recorded  # type: ignore[arg-type]
    pruned.set()
    lag.join(HUNG_SECONDS)
    return reports


def test_A17_a_writer_whose_clock_lags_two_hours_loses_no_recorded_bank_to_a_leading_prune(
    store: BankStore, tmp_path: Path
) -> None:
    """Issue 26: teardowns whose clocks are 2 h apart, 3 loose objects beside; the leading one's
    prune sweeps nothing the store stored a moment ago, so the lagging one's just-put bank, recorded
    without a look (its put created it), survives.
    Proves ``scratchbank.domain.objects.over_bound``."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    leading, lagging = ManualClock(), ManualClock()
    leading.advance(2 * 3600)
    loose = []
    for i in range(3):  # loose, and young by every clock
        path, digest = archive_of({f"f{i}": b"x" * (i + 1)}, tmp_path)
        stamp = BankStamp(RUN, "@9", path.stat().st_size, digest, "", leading.now())
        loose.append(store.put(RUN, path, sha256=digest, stamp=stamp))
    reports = _lagging_put_inside_a_leading_prune(timeline, store, leading, lagging)
    assert reports and reports[0].recorded
    assert recorded_bank(timeline).object == object_name(archive_of(OLD, tmp_path)[1])
    assert_recorded_bank_fetchable_and_matching(timeline, store)
    # nothing swept as aged; the leading bank went as superseded by the lagging record
    assert {o.name for o in store.objects(RUN)} == {*loose, recorded_bank(timeline).object}


def test_A17_our_stores_say_a_put_created_its_object_and_a_second_did_not(
    store: BankStore, tmp_path: Path
) -> None:
    """Memory, files and S3 answer a put with ``Placed``: created once, then found there.
    Proves ``scratchbank.application.ports.Placed``."""
    path, digest = archive_of(OLD, tmp_path)
    first, again = (store.put(RUN, path, sha256=digest) for _ in range(2))
    assert isinstance(first, Placed) and isinstance(again, Placed)
    assert (first.created, again.created) == (True, False) and first == again == object_name(digest)


# ---- from tests/contracts/test_bank_store_contract.py: The BankStore contract against every adapter, and each adapter's own edges.


def test_A17_filesystem_layout_an_object_its_stamp_and_no_half_bank(tmp_path: Path) -> None:
    """runs/<id>/banks/<sha256>.tgz beside its stamp; a failed put leaves nothing behind.
    Proves ``scratchbank.adapters.fs_bank.FilesystemBankStore``."""
    store = FilesystemBankStore(tmp_path)
    src, digest = _src(tmp_path, b"data")
    assert store.put("run-1", src, sha256=digest, stamp=STAMP) == f"banks/{digest}.tgz"
    banks = tmp_path / "runs/run-1/banks"
    assert (banks / f"{digest}.tgz").read_bytes() == b"data"
    assert sorted(os.listdir(banks)) == [f"{digest}.tgz", f"{digest}.tgz.stamp"]
    with pytest.raises(BankWriteFailed):
        store.put("run-1", tmp_path / "vanished.tgz", sha256="b" * 64)
    assert sorted(os.listdir(banks)) == [f"{digest}.tgz", f"{digest}.tgz.stamp"]


def test_A17_files_are_create_only_an_existing_name_is_never_replaced(tmp_path: Path) -> None:
    """A put onto a name that exists keeps what is there (create-only, idempotent).
    Proves ``scratchbank.adapters.fs_bank.FilesystemBankStore``."""
    store = FilesystemBankStore(tmp_path)
    src, digest = _src(tmp_path, b"data")
    there = tmp_path / "runs/run-1/banks" / f"{digest}.tgz"
    there.parent.mkdir(parents=True)
    there.write_bytes(b"what was there first")
    assert store.put("run-1", src, sha256=digest) == f"banks/{digest}.tgz"
    assert there.read_bytes() == b"what was there first"


def test_A17_files_link_into_place_and_a_racing_link_never_replaces(tmp_path: Path) -> None:
    """Two puts of one name past their existence check: the second's link loses, the first stays.
    Proves ``scratchbank.adapters.fs_bank.FilesystemBankStore``."""
    store = FilesystemBankStore(tmp_path)
    src, digest = _src(tmp_path, b"data")
    there = tmp_path / "runs/run-1/banks" / f"{digest}.tgz"
    real_link = os.link

    def racing_link(tmp: str, final: Path) -> None:
        if Path(final) == there and not there.exists():
            there.write_bytes(b"the racing put's")  # another put linked between check and link
        real_link(tmp, final)

    with mock.patch("scratchbank.adapters.fs_bank.os.link", racing_link):
        store.put("run-1", src, sha256=digest)
    assert there.read_bytes() == b"the racing put's"
    assert [p.name for p in there.parent.iterdir() if p.name.endswith(".part")] == []


def test_A17_a_dead_puts_temp_file_is_removed_by_delete_and_by_sweep(tmp_path: Path) -> None:
    """A put whose process died leaves a temp file; delete and sweep take it (and legacy ones).
    Proves ``scratchbank.adapters.fs_bank.FilesystemBankStore``."""
    store = FilesystemBankStore(tmp_path)
    src, digest = _src(tmp_path, b"data")
    name = store.put("run-1", src, sha256=digest)
    run = tmp_path / "runs/run-1"
    dead = [run / "banks/.put-dead.part", run / ".bank-dead.part"]
    for temp in dead:
        temp.write_bytes(b"half")
    store.delete("run-1", name)
    assert [t.exists() for t in dead] == [False, False]
    store.put("run-1", src, sha256=digest)
    (run / "banks/.put-dead2.part").write_bytes(b"half")
    store.sweep("run-1")
    assert not run.exists()


def test_A17_a_legacy_bank_reads_from_its_fixed_key_on_files(tmp_path: Path) -> None:
    """A bank put before objects had names is fetched, stat'ed and listed at its old key.
    Proves ``scratchbank.adapters.fs_bank.FilesystemBankStore``."""
    store = FilesystemBankStore(tmp_path)
    legacy = tmp_path / "runs/run-1/scratch-bank.tgz"
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b"old")
    out = io.BytesIO()
    assert store.fetch("run-1", out, max_bytes=10).bytes == 3 and out.getvalue() == b"old"
    assert store.stat("run-1") == StoredBank(3, hashlib.sha256(b"old").hexdigest())
    assert list(store.objects("run-1")) == [StoredObject(None, 3)]
    store.delete("run-1")
    assert not legacy.exists()


@pytest.mark.s3
def test_A17_s3_layout_under_the_prefix_with_its_stamp_as_metadata(s3_endpoint: str, tmp_path: Path) -> None:
    """<prefix>/sessions/<run>/banks/<sha256>.tgz, the stamp in the object's metadata;
    <prefix>/.scratchbank-if-none-match, the store's probe (empty).
    Proves ``scratchbank.adapters.s3_bank.S3BankStore``."""
    bucket = new_bucket(s3_endpoint)
    client = s3_client(s3_endpoint)
    store = S3BankStore(bucket, "/team/x/", client=client)
    src, digest = _src(tmp_path, b"data")
    store.put("run-1", src, sha256=digest, stamp=STAMP)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    # beside sessions/, the empty object that asked whether the store honours If-None-Match
    assert keys == ["team/x/.scratchbank-if-none-match", f"team/x/sessions/run-1/banks/{digest}.tgz"]
    head = client.head_object(Bucket=bucket, Key=keys[1])
    assert head["Metadata"]["sha256"] == digest and head["Metadata"]["execution"] == "%404"
    listed = store.objects("run-1")  # with the store's times (issue 26)
    assert [attrs.evolve(o, stored_at=None) for o in listed] == [
        StoredObject(f"banks/{digest}.tgz", 4, STAMP)
    ]


@pytest.mark.s3
def test_A17_s3_puts_are_create_only_on_the_real_server(s3_endpoint: str, tmp_path: Path) -> None:
    """If-None-Match: an object already under the name is never replaced (412 from the server).
    Proves ``scratchbank.adapters.s3_bank.S3BankStore``."""
    bucket = new_bucket(s3_endpoint)
    client = s3_client(s3_endpoint)
    store = S3BankStore(bucket, client=client)
    src, digest = _src(tmp_path, b"data")
    key = store.key("run-1", f"banks/{digest}.tgz")
    client.put_object(Bucket=bucket, Key=key, Body=b"other", Metadata={"sha256": "f" * 64})
    with pytest.raises(BankWriteFailed, match="another digest"):
        store.put("run-1", src, sha256=digest)
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == b"other"
    client.put_object(Bucket=bucket, Key=key, Body=b"data", Metadata={"sha256": digest})
    assert store.put("run-1", src, sha256=digest) == f"banks/{digest}.tgz"  # idempotent


@pytest.mark.s3
def test_A17_a_legacy_bank_reads_from_its_fixed_key_on_s3(s3_endpoint: str) -> None:
    """sessions/<run>/scratch.tgz is still fetched for a record that names no object.
    Proves ``scratchbank.adapters.s3_bank.S3BankStore``."""
    bucket = new_bucket(s3_endpoint)
    client = s3_client(s3_endpoint)
    store = S3BankStore(bucket, "p", client=client)
    client.put_object(Bucket=bucket, Key="p/sessions/run-1/scratch.tgz", Body=b"old")
    out = io.BytesIO()
    assert store.fetch("run-1", out, max_bytes=10).bytes == 3 and out.getvalue() == b"old"
    assert list(store.objects("run-1")) == [StoredObject(None, 3)]


def _counted(store: S3BankStore) -> list[str]:
    """Every request the store's client sends (retries too), by operation, in order."""
    sent: list[str] = []

    def count(event_name: str, **_: Any) -> None:
        sent.append(event_name.rsplit(".", 1)[-1])

    store.client.meta.events.register("before-send.s3", count)
    return sent


@pytest.mark.s3
def test_A17_a_teardown_on_s3_makes_no_round_trip_its_records_already_answer(s3_endpoint: str) -> None:
    """Issue 26: a run's first teardown puts (the store's probe, once) and lists (no HEAD of an object its record names, no
    stat of an object its put created), a resume lists and fetches; the next teardown adds the copy
    and delete of the bank it replaced.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    timeline, store = InMemoryTimeline(), s3_store(s3_endpoint)
    timeline.append(RUN, [started()])
    sent = _counted(store)
    assert teardown(timeline, store, OLD).recorded
    # the store's first put asks once whether it honours If-None-Match (two probe puts
    # on a new bucket, one after: S3BankStore._honours)
    assert sent == ["PutObject", "PutObject", "PutObject", "ListObjectsV2"]
    sent.clear()
    assert resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({})).proceeds
    assert sent == ["ListObjectsV2", "GetObject"]  # N3's listing, no HEAD of the recorded bank; its fetch
    sent.clear()
    assert teardown(timeline, store, NEW).recorded
    assert sent == ["PutObject", "ListObjectsV2", "GetObject", "DeleteObject"]
    assert_recorded_bank_fetchable_and_matching(timeline, store)
    assert [o.name for o in store.objects(RUN)] == [recorded_bank(timeline).object]


@pytest.mark.s3
def test_A17_s3_ages_come_from_the_listing_response_itself(s3_endpoint: str, tmp_path: Path) -> None:
    """S3's times are the store's, read off the one LIST it already makes: each object's
    ``LastModified``, the listing's ``now`` the response's ``Date`` (moved 2 h on here, as a
    store whose clock says later: the object is then 2 h old, whatever the process's clock says).
    Proves ``scratchbank.adapters.s3_bank.S3BankStore.objects``."""
    store = s3_store(s3_endpoint)
    path, digest = _src(tmp_path, b"aged" * 40)
    name = store.put(RUN, path, sha256=digest, stamp=STAMP)
    sent = _counted(store)

    def two_hours_later(parsed: dict[str, Any], **_: object) -> None:
        headers = parsed["ResponseMetadata"]["HTTPHeaders"]
        headers["date"] = format_datetime(
            parsedate_to_datetime(headers["date"]) + timedelta(hours=2), usegmt=True
        )

    store.client.meta.events.register("after-call.s3.ListObjectsV2", two_hours_later)
    listed = store.objects(RUN, named={name})
    assert sent == ["ListObjectsV2"]  # no round trip for the times
    [found] = listed
    now = listed_now(listed)
    assert now is not None and found.stored_at is not None
    assert timedelta(hours=2) - timedelta(seconds=1) <= now - found.stored_at
    assert over_bound(listed, now, keep=0) == (found,)


def _dated(store: S3BankStore, date: Callable[[str], str]) -> None:
    """Every listing's ``Date`` header rewritten by ``date`` (a proxy or a server that garbles it)."""

    def rewrite(parsed: dict[str, Any], **_: object) -> None:
        headers = parsed["ResponseMetadata"]["HTTPHeaders"]
        headers["date"] = date(headers["date"])

    store.client.meta.events.register("after-call.s3.ListObjectsV2", rewrite)


@pytest.mark.s3
def test_A17_a_listing_date_past_any_calendar_leaves_the_teardown_recorded(s3_endpoint: str) -> None:
    """A LIST response whose ``Date`` has a year no datetime holds (found by attack: an
    OverflowError out of the prune's listing crashed the teardown after its record): the
    listing has no ``now``, nothing is aged. Proves ``scratchbank.adapters.s3_bank.S3BankStore.objects``."""
    timeline, store = InMemoryTimeline(), s3_store(s3_endpoint)
    timeline.append(RUN, [started()])
    _dated(store, lambda _: "Wed, 02 Dec 99999999999999999999 15:00:00 GMT")
    assert teardown(timeline, store, OLD).recorded
    assert listed_now(store.objects(RUN)) is None
    assert_recorded_bank_fetchable_and_matching(timeline, store)


@pytest.mark.s3
def test_A17_a_listing_with_a_garbled_last_modified_is_a_named_read_failure(s3_endpoint: str) -> None:
    """A LIST page whose ``LastModified`` no parser reads (found by attack: botocore's
    ValueError came out of the prune raw and crashed the teardown after its record) is
    BankReadFailed: the teardown records, its prune notes it, nothing is deleted.
    Proves ``scratchbank.adapters.s3_bank.S3BankStore.objects``."""
    timeline, store = InMemoryTimeline(), s3_store(s3_endpoint)
    timeline.append(RUN, [started()])

    def garble(response_dict: dict[str, Any], **_: object) -> None:
        body = response_dict["body"]
        response_dict["body"] = re.sub(rb"<LastModified>[^<]*<", b"<LastModified>not a time<", body)

    store.client.meta.events.register("before-parse.s3.ListObjectsV2", garble)
    report = teardown(timeline, store, OLD)
    assert report.recorded and any("could not list" in n for n in report.notes), report.notes
    with pytest.raises(BankReadFailed):
        store.objects(RUN)
    store.client.meta.events.unregister("before-parse.s3.ListObjectsV2", garble)
    assert_recorded_bank_fetchable_and_matching(timeline, store)


def test_A17_a_bank_file_whose_mtime_no_calendar_holds_is_of_unknown_age() -> None:
    """A files store on a filesystem that keeps 64-bit times (tmpfs, btrfs, XFS): an object
    whose mtime is past year 9999 (found by attack: ``fromtimestamp``'s ValueError came out
    of the prune's listing raw and crashed the next teardown) is listed with no age.
    Proves ``scratchbank.adapters.fs_bank.FilesystemBankStore.objects``."""
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("no tmpfs at /dev/shm")
    root = Path(tempfile.mkdtemp(prefix="scratchbank-mtime-", dir="/dev/shm"))
    try:
        timeline, store = InMemoryTimeline(), FilesystemBankStore(root)
        timeline.append(RUN, [started()])
        assert teardown(timeline, store, OLD).recorded
        [old] = store.objects(RUN)
        assert old.name is not None
        far = 10**13 * 10**9  # year ~318,000: tmpfs keeps it (ext4 clamps to 2446)
        os.utime(store.path(RUN, old.name), ns=(far, far))
        assert [o.stored_at for o in store.objects(RUN)] == [None]
        assert teardown(timeline, store, NEW).recorded
        assert_recorded_bank_fetchable_and_matching(timeline, store)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.s3
def test_A17_a_listing_date_in_a_zone_it_does_not_name_ages_nothing(s3_endpoint: str, tmp_path: Path) -> None:
    """A ``Date`` whose zone is not GMT or a numeric offset (``CET``, none at all) is not read
    as UTC (found by attack: a server's local time an hour ahead of UTC made a just-put object
    an hour old, chosen by the bound): such a listing has no ``now``.
    Proves ``scratchbank.adapters.s3_bank.S3BankStore.objects``."""
    store = s3_store(s3_endpoint)
    path, digest = _src(tmp_path, b"young" * 40)
    store.put(RUN, path, sha256=digest, stamp=STAMP)
    zones = ["CET", ""]

    def local(gmt: str) -> str:  # the server's time an hour ahead of UTC, its zone not said
        ahead = parsedate_to_datetime(gmt) + timedelta(hours=1, minutes=1)
        return f"{ahead.strftime('%a, %d %b %Y %H:%M:%S')} {zones[0]}".strip()

    _dated(store, local)
    while zones:
        listed = store.objects(RUN)
        assert listed_now(listed) is None, zones[0]
        zones.pop(0)
        assert over_bound(listed, listed_now(listed), keep=0) == ()


@pytest.mark.s3
def test_A17_a_store_that_ignores_if_none_match_never_says_its_put_created(
    s3_endpoint: str, tmp_path: Path
) -> None:
    """An S3-compatible store that ignores If-None-Match answers 200 to every put: no put
    of it says it created its object (found by attack: the second put of the same object
    said created, and the teardown skipped A17's look after its record). One probe a
    store: the honouring moto still says so.
    Proves ``scratchbank.adapters.s3_bank.S3BankStore.put``."""

    class IgnoresIfNoneMatch:
        def __init__(self, client: Any) -> None:
            self.client = client

        def put_object(self, **kw: Any) -> Any:
            kw.pop("IfNoneMatch", None)
            return self.client.put_object(**kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.client, name)

    path, digest = _src(tmp_path, b"twice" * 40)
    odd = S3BankStore(new_bucket(s3_endpoint), client=IgnoresIfNoneMatch(s3_client(s3_endpoint)))
    answers = [odd.put(RUN, path, sha256=digest) for _ in range(2)]
    assert [getattr(a, "created", None) for a in answers] == [False, False]
    honest = S3BankStore(new_bucket(s3_endpoint), client=s3_client(s3_endpoint))
    answers = [honest.put(RUN, path, sha256=digest) for _ in range(2)]
    assert [getattr(a, "created", None) for a in answers] == [True, False]

    class RefusesTheProbe(IgnoresIfNoneMatch):
        probes = 0

        def put_object(self, **kw: Any) -> Any:
            if "sessions/" not in kw["Key"]:
                self.probes += 1
                raise ClientError({"Error": {"Code": "AccessDenied"}}, "PutObject")
            return self.client.put_object(**kw)

    client = RefusesTheProbe(s3_client(s3_endpoint))
    policed = S3BankStore(new_bucket(s3_endpoint), client=client)
    other, other_digest = _src(tmp_path, b"other" * 40, "b.tgz")
    answers = [policed.put(RUN, p, sha256=d) for p, d in ((path, digest), (other, other_digest))]
    assert [getattr(a, "created", None) for a in answers] == [False, False] and client.probes == 1


# ---- from tests/contracts/test_sandbox_contract.py: The shipped contract suites and checkers, run against every adapter we ship: the Sandbox contract on the fake, local, Docker, Podman and the Kubernetes double (T2, T4, T14, T15, T19); ``check_bank_store`` on memory, filesystem and S3; ``check_timeline`` on memory and SQLite (PostgreSQL runs the class suite in test_timeline_stores).


def test_A17_the_checkers_catch_a_store_whose_put_replaces_the_runs_bank(tmp_path: Path) -> None:
    """A store keeping one bank per run (a put drops the others) fails the contract.
    Proves ``scratchbank.application.ports.BankStore.sweep``."""

    class OnePerRun(InMemoryBankStore):
        def put(self, run_id, archive, *, sha256, stamp=None, deadline=None):  # type: ignore[no-untyped-def]
            self.sweep(run_id)
            return super().put(run_id, archive, sha256=sha256, stamp=stamp, deadline=deadline)

    with pytest.raises(BankGone):
        check_bank_store(lambda _: OnePerRun(), tmp_path)


# ---- from tests/test_http_api.py: The HTTP API over a real loopback socket (uvicorn), called with httpx: C9's refusal body, the bearer token, the Host check, the body limit, unknown fields, the sandbox allow-list, and an OpenAPI document that lists every response (issue 12, findings 1, 2, 5).


def test_A15_accepting_the_loss_without_a_sandbox_is_refused_and_loses_nothing(
    api: httpx.Client, service: ScratchService, home: Path
) -> None:
    """Finding 1 over HTTP: {"accept_scratch_loss": true} alone is NO_RESTORE_TARGET, nothing written.
    Proves ``scratchbank.application.service.ScratchService.assess``."""
    service.timeline.append(operator_rigs.RUN, [node("measure", "agent")])
    before = tree_digest(home)
    got = api.post(f"/runs/{operator_rigs.RUN}/resume", json={"accept_scratch_loss": True}, headers=AUTH)
    assert got.status_code == 400 and got.json()["error_code"] == "no_restore_target"
    assert '"sandbox"' in got.json()["remedy"]
    assert tree_digest(home) == before


# ---- from tests/rules/test_A_engines.py: The operator's MCP server as a real process (`scratchbank mcp`), driven by the SDK's own client over stdio and over streamable HTTP: an assistant-style caller that retries a refused resume with `force` only, then with a bare consent (both refused, nothing changed), then with the consent naming the refusal (A19: it goes on); bad arguments; the timeline resource; the runs needing an operator; and over HTTP the API's token, Host and Origin checks.


def test_A19_over_stdio_only_the_consent_naming_the_refusal_forsakes_the_scratch(
    rig: tuple[Path, Path],
) -> None:
    """The SDK's stdio client against `scratchbank mcp`: the assistant's story and bad arguments.
    Proves ``scratchbank.adapters.mcp_server.judge_consent``."""
    home, target = rig
    params = StdioServerParameters(command=str(EXE), args=["mcp"], env=_env(home, target))

    async def main() -> None:
        with anyio.fail_after(120):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                await bad_arguments(session, target)
                await assistant_story(session, home, target)

    anyio.run(main)


def test_A19_over_streamable_http_behind_the_apis_guards(rig: tuple[Path, Path]) -> None:
    """`scratchbank mcp --http`: no token 401, a foreign Host 421, a foreign Origin refused; with
    the token the SDK's HTTP client runs the assistant's story.
    Proves ``scratchbank.adapters.mcp_server.BearerGuard``."""
    home, target = rig
    proc, base = _start_http(home, target)
    try:
        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        assert httpx.post(f"{base}/mcp", json=hello, timeout=30).status_code == 401
        foreign = {"authorization": f"Bearer {TOKEN}", "host": "evil.example"}
        assert httpx.post(f"{base}/mcp", json=hello, headers=foreign, timeout=30).status_code == 421
        origin = {"authorization": f"Bearer {TOKEN}", "origin": "http://evil.example"}
        assert httpx.post(f"{base}/mcp", json=hello, headers=origin, timeout=30).status_code in (403, 421)

        async def main() -> None:
            with anyio.fail_after(120):
                async with http_session(f"{base}/mcp", "not-the-token-at-all-0000"):
                    pass

        with pytest.raises(BaseException):  # noqa: B017 - the SDK wraps the 401 its own way
            anyio.run(main)

        async def story() -> None:
            with anyio.fail_after(120):
                async with http_session(f"{base}/mcp", TOKEN) as session:
                    await bad_arguments(session, target)
                    await assistant_story(session, home, target)

        anyio.run(story)
    finally:
        proc.terminate()
        proc.wait(30)
        assert proc.stderr is not None
        proc.stderr.close()


def test_A19_the_consent_name_is_the_refusals_own() -> None:
    """The name follows the refusal's rule and evidence; bare true and other names count for nothing.
    Proves ``scratchbank.domain.resume_gate.decide_resume``."""
    r2 = decide_resume(fold([started(), node("a", "tool"), banked(), node("b", "tool")]), ResumeRequest())
    r1 = decide_resume(fold([started(), node("a", "tool"), unbanked()]), ResumeRequest())
    assert consent_name(r2) and consent_name(r1) and consent_name(r2) != consent_name(r1)
    assert judge_consent(r2, consent_name(r2), force=False).consents.accept_scratch_loss
    assert not judge_consent(r2, True, force=True).consents.accept_scratch_loss
    assert judge_consent(r2, True, force=True).consents.force  # force stays separate
    assert not judge_consent(r2, consent_name(r1), force=False).consents.accept_scratch_loss


def test_A19_over_stdio_the_human_asked_by_elicitation_gives_the_named_consent(
    rig: tuple[Path, Path],
) -> None:
    """A client that declared elicitation: a resume refused for the scratch asks its human; a
    decline (and a cancel) forsakes nothing (the home's checksum holds); an acceptance, which
    is the refusal's own name, lets the run go on.
    Proves ``scratchbank.adapters.mcp_server.ask_the_human``."""
    home, target = rig
    params = StdioServerParameters(command=str(EXE), args=["mcp"], env=_env(home, target))
    human = Human()

    async def main() -> None:
        with anyio.fail_after(120):
            async with (
                stdio_client(params) as (read, write),
                ClientSession(read, write, elicitation_callback=human) as session,
            ):
                await session.initialize()
                await elicitation_story(session, human, home, target)

    anyio.run(main)


def test_A19_over_streamable_http_the_human_asked_by_elicitation_gives_the_named_consent(
    rig: tuple[Path, Path],
) -> None:
    """The same over `scratchbank mcp --http` (the SDK's HTTP client, with the token): the server
    has a channel to ask the human during the call, so a decline and a cancel forsake nothing
    and the acceptance lets the run go on. Proves ``scratchbank.adapters.mcp_server.ask_the_human``."""
    home, target = rig
    proc, base = _start_http(home, target)
    human = Human()
    try:

        async def main() -> None:
            with anyio.fail_after(120):
                async with http_session(f"{base}/mcp", TOKEN, human) as session:
                    await elicitation_story(session, human, home, target)

        anyio.run(main)
    finally:
        proc.terminate()
        proc.wait(30)
        assert proc.stderr is not None
        proc.stderr.close()


def test_A19_a_human_who_never_answers_forsakes_nothing_past_the_deadline(rig: tuple[Path, Path]) -> None:
    """Elicitation is a call to another process with a deadline (SCRATCHBANK_MCP_ASK_SECONDS):
    a human who never answers gets the resume refused, and the home's checksum holds.
    Proves ``scratchbank.adapters.mcp_server.ask_seconds``."""
    home, target = rig
    env = _env(home, target) | {"SCRATCHBANK_MCP_ASK_SECONDS": "1"}
    params = StdioServerParameters(command=str(EXE), args=["mcp"], env=env)
    asked: list[str] = []

    async def silent(context: ClientRequestContext, request: Any) -> types.ElicitResult:
        asked.append(request.message)
        await anyio.sleep_forever()
        raise AssertionError("never answered")

    async def main() -> None:
        with anyio.fail_after(120):
            async with (
                stdio_client(params) as (read, write),
                ClientSession(read, write, elicitation_callback=silent) as session,
            ):
                await session.initialize()
                before = tree_digest(home)
                resume = {"run": operator_rigs.RUN, "sandbox": f"local:{target}"}
                code, refused = _payload(await session.call_tool("resume", resume))
                assert code == "SCRATCH_NOT_PORTABLE" and "did not answer" in refused["consent"], refused
                assert tree_digest(home) == before and not (target / "scratch").exists()

    anyio.run(main)
    assert len(asked) == 1


def test_A19_a_bad_ask_deadline_is_a_named_config_error() -> None:
    """SCRATCHBANK_MCP_ASK_SECONDS that is not a number of seconds in (0, 86400] is CONFIG_INVALID.
    Proves ``scratchbank.adapters.mcp_server.ask_seconds``."""
    assert ask_seconds({}) == 300 and ask_seconds({"SCRATCHBANK_MCP_ASK_SECONDS": "2.5"}) == 2.5
    for bad in ("soon", "0", "-1", "nan", "1e9"):
        with pytest.raises(errors.ConfigInvalid, match="SCRATCHBANK_MCP_ASK_SECONDS"):
            ask_seconds({"SCRATCHBANK_MCP_ASK_SECONDS": bad})


# ---- from tests/rules/test_[AC]*.py: Claims under real races (C7, R10, A16): 2 to 8 processes on one parked run, on SQLite and on PostgreSQL, resumes against resumes and against a teardown, under the run's lock.


def test_A16_C7_staggered_resumes_record_exactly_one_run_resumed_in_every_round(
    racers: tuple[Any, Any, Any], store_url: str, tmp_path: Path
) -> None:
    """Four processes resume one parked run, the later three while the first restores (its
    restore held open until they ended): every round records one ``run_resumed`` and one
    restore; the others are refused RUN_LOCKED (retryable) and write nothing."""
    backend = store_url.split(":", 1)[0]
    counts = COUNTS.setdefault(f"{backend} staggered 4r", {})
    for _ in range(STAGGERED_ROUNDS):
        got, after = race(racers, store_url, tmp_path / "banks", 4, 0, window=True)
        outcomes = [g["result"] for g in got]
        kinds = [type(r).__name__ for r in after]
        for outcome in outcomes:
            counts[outcome] = counts.get(outcome, 0) + 1
        counts["run_resumed"] = counts.get("run_resumed", 0) + kinds.count("RunResumed")
        counts["rounds"] = counts.get("rounds", 0) + 1
        assert kinds.count("RunResumed") == 1, (outcomes, kinds)
        assert kinds == ["RunResumed", "ScratchRestored"], (outcomes, kinds)
        assert outcomes.count("restored") == 1, (outcomes, [g.get("why") for g in got])
        assert outcomes.count("locked") + outcomes.count("superseded") == 3, outcomes
    print(f"\nraces {COUNTS}")


# ---- from tests/contracts/test_run_lock_contract.py: The run's lock (A16, ADR 0007): the RunLock contract on every adapter (memory, real SQLite files, real PostgreSQL), across real processes, and the runner's handed-in lease.


def test_A16_sqlite_racing_processes_get_exactly_one_grant(tmp_path: Path) -> None:
    """Four processes acquire one run's lock in one SQLite file: exactly one grant.
    Proves ``scratchbank.adapters.run_lock.SqliteRunLock``."""
    ctx = multiprocessing.get_context("spawn")
    path = str(tmp_path / "timeline.locks")
    SqliteRunLock(path)
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            got = pool.starmap(_acquire_in_process, [(path, f"x-{i}", barrier, 60.0) for i in range(4)])
    assert got.count(True) == 1


def test_A16_sqlite_a_dead_holders_lease_lapses_and_is_taken_over(tmp_path: Path) -> None:
    """A process that dies holding the lock blocks nobody past its lease (expiry survives death).
    Proves ``scratchbank.adapters.run_lock.SqliteRunLock``."""
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
    contention), refreshes through the lease, and leaves releasing it to the runner.
    Proves ``scratchbank.adapters.inprocess.InProcessLease``."""
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
    does not collide in the catalog). Proves ``scratchbank.adapters.run_lock.PostgresRunLock``."""
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


def test_A17_a_files_listing_makes_its_clock_file_outside_the_runs_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files store's listing reads the filesystem's time from a file it makes and removes
    at once: at the store's root, never in the run's folder, which a ``sweep`` (a finished
    run's) may be removing at that moment: a file made there mid-``rmtree`` failed the sweep.
    Proves ``scratchbank.adapters.fs_bank.FilesystemBankStore.objects``."""
    timeline, store = InMemoryTimeline(), FilesystemBankStore(tmp_path / "banks")
    timeline.append(RUN, [started()])
    assert teardown(timeline, store, OLD).recorded
    made: list[Path] = []
    real = fs_bank.tempfile.mkstemp

    def spy(*args: Any, **kwargs: Any) -> tuple[int, str]:
        fd, name = real(*args, **kwargs)
        made.append(Path(name))
        return fd, name

    monkeypatch.setattr(fs_bank.tempfile, "mkstemp", spy)
    listing = store.objects(RUN)
    assert listing.now is not None and made
    assert not [p for p in made if p.is_relative_to(store.run_dir(RUN))], made
