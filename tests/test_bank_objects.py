"""Banks as content-named, create-only objects the record names (A17), and reconciliation (N3).

Issue 18's "banks destroyed by a write nobody recorded": each interleaving below ran
over the real use cases (teardown, resume) and the real stores (memory, files, S3 on the
shared moto server); after each, every recorded bank is fetchable and matches its record.
"""

from __future__ import annotations

import hashlib
import io
import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import boto3
import pytest

from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.present import status_data, status_text
from scratchbank.adapters.s3_bank import S3BankStore
from scratchbank.application.ports import BankStore
from scratchbank.application.resume import resume
from scratchbank.application.service import ScratchService
from scratchbank.application.teardown import Budgets, bank_at_teardown
from scratchbank.domain import Consents, ResumeRequest, fold
from scratchbank.domain.errors import BankUnrecorded, TimelineUnreadable, TimelineWriteFailed
from scratchbank.domain.objects import BankStamp, object_name
from scratchbank.domain.records import Record, ScratchBanked
from scratchbank.domain.wire import decode, encode
from scratchbank.testing.builders import node, started
from scratchbank.testing.clocks import ManualClock

RUN = "run-1"
OLD = {"notes.txt": b"the older execution's scratch"}
NEW = {"notes.txt": b"the newer execution's scratch", "more.txt": b"work done since"}
ACCEPT = ResumeRequest(consents=Consents(accept_scratch_loss=True))


def s3_store(endpoint: str) -> S3BankStore:
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
    )
    bucket = "objects-" + uuid.uuid4().hex[:12]
    client.create_bucket(Bucket=bucket)
    return S3BankStore(bucket, "team", client=client)


@pytest.fixture(params=["memory", "files", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BankStore:
    if request.param == "memory":
        return InMemoryBankStore()
    if request.param == "files":
        return FilesystemBankStore(tmp_path / "banks")
    return s3_store(request.getfixturevalue("s3_endpoint"))


def teardown(timeline: InMemoryTimeline, store: BankStore, files: dict[str, bytes], **budgets: float):  # type: ignore[no-untyped-def]
    return bank_at_teardown(
        RUN,
        timeline=timeline,
        store=store,
        sandbox=FakeSandbox(dict(files)),
        run_finished=False,
        budgets=Budgets(**budgets),  # type: ignore[arg-type]
        clock=ManualClock(),  # type: ignore[arg-type]
    )


def recorded_bank(timeline: InMemoryTimeline) -> ScratchBanked:
    bank = fold(timeline.read(RUN)).bank
    assert bank is not None
    return bank.record


def assert_recorded_bank_fetchable_and_matching(timeline: InMemoryTimeline, store: BankStore) -> None:
    """The explorer's first invariant: the recorded bank is in the store, as recorded."""
    record = recorded_bank(timeline)
    out = io.BytesIO()
    got = store.fetch(RUN, out, max_bytes=1 << 30, name=record.object)
    assert (got.bytes, got.sha256) == (record.bytes, record.sha256)


def archive_of(files: dict[str, bytes], tmp: Path) -> tuple[Path, str]:
    """The archive a teardown of ``files`` would put, taken by a teardown of its own."""
    scratch_timeline, scratch_store = InMemoryTimeline(), InMemoryBankStore()
    scratch_timeline.append(RUN, [started()])
    teardown(scratch_timeline, scratch_store, files)
    data = scratch_store.only(RUN)
    assert data is not None
    path = tmp / f"{uuid.uuid4().hex}.tgz"
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


class PutHook:
    """A store whose next put first runs ``before`` (another actor's whole step)."""

    def __init__(self, inner: BankStore) -> None:
        self.inner = inner
        self.keeps_banks = inner.keeps_banks
        self.before_put: Callable[[], None] | None = None
        self.before_fetch: Callable[[], None] | None = None

    def put(self, run_id: str, archive: Path, **kw: object) -> str:
        hook, self.before_put = self.before_put, None
        if hook is not None:
            hook()
        return self.inner.put(run_id, archive, **kw)  # type: ignore[arg-type]

    def fetch(self, run_id: str, dest: io.BytesIO, **kw: object):  # type: ignore[no-untyped-def]
        hook, self.before_fetch = self.before_fetch, None
        if hook is not None:
            hook()
        return self.inner.fetch(run_id, dest, **kw)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


# ---- the four ways a write nobody recorded destroyed a bank ------------------------------


def test_A17_a_losing_teardowns_put_no_longer_overwrites_the_recorded_bank(store: BankStore) -> None:
    """An older execution's teardown passes its pre-upload check; a newer execution then
    resumes, banks and records; the loser's put lands: the recorded bank is intact."""
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
    object nobody names; the recorded bank is fetchable and matches."""
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
    restores exactly the bank its record names."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    assert teardown(timeline, store, NEW).recorded
    hooked = PutHook(store)
    stray, digest = archive_of(OLD, tmp_path)
    hooked.before_fetch = lambda: store.put(RUN, stray, sha256=digest)  # type: ignore[assignment, func-returns-value]
    box = FakeSandbox({})
    out = resume(RUN, ResumeRequest(), timeline=timeline, store=hooked, sandbox=box)  # type: ignore[arg-type]
    assert out.proceeds and box.files == NEW


class FullDisk(InMemoryTimeline):
    """A timeline whose disk fills up: every append fails once ``full`` is set."""

    full = False

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        if self.full:
            raise TimelineWriteFailed("no space left on device")
        return super().append(run_id, records, expected=expected)


def test_A17_N3_a_put_whose_record_fails_keeps_both_banks(store: BankStore) -> None:
    """The newer teardown stores its bank, then its record fails (full disk): the recorded
    bank and the new one are both kept; status lists the new one as unrecorded."""
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


# ---- N3: reconcile when provably right, refuse by name otherwise -------------------------


def _park_with_a_failed_record(timeline: FullDisk, store: BankStore) -> ScratchBanked:
    timeline.append(RUN, [started(), node("clone", "tool")])
    timeline.full = True
    report = teardown(timeline, store, NEW, record_seconds=0.0)
    timeline.full = False
    assert not report.recorded and isinstance(report.record, ScratchBanked)
    return report.record


def test_N3_the_latest_executions_unrecorded_bank_is_recorded_and_restored(store: BankStore) -> None:
    """Stamped by the latest execution, nothing after it: the resume records it and restores it."""
    timeline = FullDisk()
    lost = _park_with_a_failed_record(timeline, store)
    box = FakeSandbox({})
    out = resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=box)
    assert out.proceeds and box.files == NEW
    reconciled = [r for r in timeline.read(RUN) if isinstance(r, ScratchBanked)]
    assert [r.object for r in reconciled] == [lost.object] and "reconciled (N3)" in reconciled[0].reason


def test_N3_an_unrecorded_bank_that_cannot_be_proved_refuses_the_resume_by_name(
    store: BankStore, tmp_path: Path
) -> None:
    """Two unrecorded banks stamped by the latest execution: refused by name, nothing written
    or deleted; accepting the scratch's loss goes on without them."""
    timeline = FullDisk()
    first = _park_with_a_failed_record(timeline, store)
    other, digest = archive_of(OLD, tmp_path)
    store.put(RUN, other, sha256=digest, stamp=BankStamp(RUN, "@0", other.stat().st_size, digest))
    before = (tuple(timeline.read(RUN)), tuple(store.objects(RUN)))
    out = resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({}))
    assert out.decision.refused and out.decision.code == BankUnrecorded.code and out.decision.rule == "N3"
    assert first.object in out.decision.explanation and object_name(digest) in out.decision.explanation
    assert (tuple(timeline.read(RUN)), tuple(store.objects(RUN))) == before
    out = resume(RUN, ACCEPT, timeline=timeline, store=store, sandbox=FakeSandbox({}))
    assert out.proceeds


def test_N3_an_earlier_executions_unrecorded_bank_is_never_reconciled(
    store: BankStore, tmp_path: Path
) -> None:
    """A bank stamped by an execution that is not the latest stays unreferenced: shown, not restored."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    assert teardown(timeline, store, NEW).recorded
    assert resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({})).proceeds
    stray, digest = archive_of(OLD, tmp_path)
    store.put(RUN, stray, sha256=digest, stamp=BankStamp(RUN, "@0", stray.stat().st_size, digest))
    status = ScratchService(timeline, store, clock=ManualClock()).status(RUN)  # type: ignore[arg-type]
    assert status.unreferenced is not None and status.unreferenced.record is None
    assert [o.name for o in status.unreferenced.others] == [object_name(digest)]
    data = status_data(status)["unreferenced"]
    assert data["objects"][0]["object"] == object_name(digest) and data["objects"][0]["execution"] == "@0"
    assert any(object_name(digest) in line for line in status_text(status))


# ---- T4/T5 under A17: record first, then delete what no record needs ---------------------


def test_A17_T4_an_empty_teardown_whose_record_fails_keeps_the_previous_bank(store: BankStore) -> None:
    """Before A17 the empty scratch deleted the bank, then its record failed: the bank a
    record names was gone. Now nothing is deleted until the record lands."""
    timeline = FullDisk()
    timeline.append(RUN, [started()])
    assert teardown(timeline, store, OLD).recorded
    timeline.full = True
    assert not teardown(timeline, store, {}, record_seconds=0.0).recorded
    timeline.full = False
    assert_recorded_bank_fetchable_and_matching(timeline, store)


def test_A17_T4_T5_once_recorded_the_bank_no_record_needs_is_deleted(store: BankStore) -> None:
    """Empty (T4) and finished (T5): the previous bank is deleted after the record lands."""
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
    """Two banks in a row: after the second record the first object is deleted; the second is kept."""
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
    put on its way to its record is never pruned."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    clock = ManualClock()
    strays = []
    for i, hours_old in enumerate((3, 0, 0, 0, 0)):
        path, digest = archive_of({f"f{i}": b"x" * (i + 1)}, tmp_path)
        at = clock.now() - timedelta(hours=hours_old, minutes=i)
        store.put(RUN, path, sha256=digest, stamp=BankStamp(RUN, "@9", path.stat().st_size, digest, "", at))
        strays.append(object_name(digest))
    report = bank_at_teardown(
        RUN, timeline=timeline, store=store, sandbox=FakeSandbox(dict(NEW)), run_finished=False, clock=clock
    )
    assert report.recorded
    left = {o.name for o in store.objects(RUN)}
    # 2 past the count, but only one is older than the age: it alone is swept
    assert left == {recorded_bank(timeline).object, *strays[1:]}


# ---- legacy records (v1: no object) and the wire ----------------------------------------


def test_A17_a_legacy_record_reads_and_restores_from_the_old_key(tmp_path: Path) -> None:
    """A v1 `sandbox_scratch_banked` (no object) reads as naming the old key and restores from it."""
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
    nothing and parks as refused on the host (X4), never "read again" forever (X5)."""
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


class ObjectsHook(PutHook):
    """A store whose next listing first runs ``before_objects`` (another actor's whole step)."""

    def __init__(self, inner: BankStore) -> None:
        super().__init__(inner)
        self.before_objects: Callable[[], None] | None = None

    def objects(self, run_id: str):  # type: ignore[no-untyped-def]
        hook, self.before_objects = self.before_objects, None
        if hook is not None:
            hook()
        return self.inner.objects(run_id)


def test_A17_a_prune_never_deletes_an_object_a_record_landing_during_it_names(store: BankStore) -> None:
    """The explorer's prune race: a record naming an object lands between a prune's read and its delete."""
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


class AfterPut(PutHook):
    """A store whose next put runs ``after_put`` once it returned."""

    def __init__(self, inner: BankStore) -> None:
        super().__init__(inner)
        self.after_put: Callable[[], None] | None = None

    def put(self, run_id: str, archive: Path, **kw: object) -> str:
        name = super().put(run_id, archive, **kw)
        hook, self.after_put = self.after_put, None
        if hook is not None:
            hook()
        return name


def test_A17_a_record_landing_after_a_prunes_delete_puts_its_object_back(store: BankStore) -> None:
    """The prune race's other order: old:S.put > new:prune (read, delete, re-read) > old:T.append."""
    timeline = InMemoryTimeline()
    timeline.append(RUN, [started()])
    assert teardown(timeline, store, OLD).recorded
    assert resume(RUN, ResumeRequest(), timeline=timeline, store=store, sandbox=FakeSandbox({})).proceeds
    old_put, new_pruned = threading.Event(), threading.Event()
    older = AfterPut(store)

    def wait_for_the_prune() -> None:
        old_put.set()
        assert new_pruned.wait(60)

    older.after_put = wait_for_the_prune
    reports: list[object] = []
    old = threading.Thread(target=lambda: reports.append(teardown(timeline, older, OLD)))  # type: ignore[arg-type]
    newer = ObjectsHook(store)

    def the_older_teardown_reads_and_puts() -> None:
        old.start()
        assert old_put.wait(60)

    newer.before_objects = the_older_teardown_reads_and_puts
    assert teardown(timeline, newer, NEW).recorded  # type: ignore[arg-type]
    new_pruned.set()
    old.join(60)
    assert reports and reports[0].recorded  # type: ignore[attr-defined]
    assert_recorded_bank_fetchable_and_matching(timeline, store)
