"""Bank stores (filesystem, S3) parametrized, with hooks around their put (a store that replaces, a
disk that fills), a teardown over them and the checks that the recorded bank is fetchable.

First written for tests/rules/test_[AN]*.py: Banks as content- named, create-only objects the record
names (A17), and reconciliation (N3)."""

from __future__ import annotations

import hashlib
import io
import os
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.s3_bank import S3BankStore
from scratchbank.application.ports import BankStore
from scratchbank.application.teardown import Budgets, bank_at_teardown
from scratchbank.domain import Consents, ResumeRequest, fold
from scratchbank.domain.errors import TimelineWriteFailed
from scratchbank.domain.records import Record, ScratchBanked
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


def teardown(  # type: ignore[no-untyped-def]
    timeline: InMemoryTimeline,
    store: BankStore,
    files: dict[str, bytes],
    clock: ManualClock | None = None,
    **budgets: float,
):
    return bank_at_teardown(
        RUN,
        timeline=timeline,
        store=store,
        sandbox=FakeSandbox(dict(files)),
        run_finished=False,
        budgets=Budgets(**budgets),  # type: ignore[arg-type]
        clock=clock or ManualClock(),  # type: ignore[arg-type]
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


def stored_hours_ago(store: BankStore, name: str, hours: float) -> None:
    """Make ``store`` say it stored ``RUN``'s object ``name`` ``hours`` earlier than it did,
    as its own clock would (A17's ages are the store's, issue 26): memory, its ``stored_at``;
    files, the object's mtime; S3 (whose server cannot be told), the ``LastModified`` its
    listings give for that key, shifted on the client's ``after-call``."""
    back = timedelta(hours=hours)
    if isinstance(store, InMemoryBankStore):
        store.stored_at[(RUN, name)] -= back
    elif isinstance(store, FilesystemBankStore):
        path = store.path(RUN, name)
        then = path.stat().st_mtime - back.total_seconds()
        os.utime(path, (then, then))
    elif isinstance(store, S3BankStore):
        shifted: dict[str, timedelta] | None = getattr(store, "_backdated", None)
        if shifted is None:
            shifted = {}
            setattr(store, "_backdated", shifted)  # noqa: B010 - a test's mark on the store

            def shift(parsed: dict[str, Any], **_: object) -> None:
                for obj in parsed.get("Contents", []):
                    obj["LastModified"] -= shifted.get(obj["Key"], timedelta())

            store.client.meta.events.register("after-call.s3.ListObjectsV2", shift)
        shifted[store.key(RUN, name)] = shifted.get(store.key(RUN, name), timedelta()) + back
    else:
        raise TypeError(f"no way to age an object of {store!r}")


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


class FullDisk(InMemoryTimeline):
    """A timeline whose disk fills up: every append fails once ``full`` is set."""

    full = False

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        if self.full:
            raise TimelineWriteFailed("no space left on device")
        return super().append(run_id, records, expected=expected)


def _park_with_a_failed_record(timeline: FullDisk, store: BankStore) -> ScratchBanked:
    timeline.append(RUN, [started(), node("clone", "tool")])
    timeline.full = True
    report = teardown(timeline, store, NEW, record_seconds=0.0)
    timeline.full = False
    assert not report.recorded and isinstance(report.record, ScratchBanked)
    return report.record


class ObjectsHook(PutHook):
    """A store whose next listing first runs ``before_objects`` (another actor's whole step)."""

    def __init__(self, inner: BankStore) -> None:
        super().__init__(inner)
        self.before_objects: Callable[[], None] | None = None

    def objects(self, run_id: str, **kw: object):  # type: ignore[no-untyped-def]
        hook, self.before_objects = self.before_objects, None
        if hook is not None:
            hook()
        return self.inner.objects(run_id, **kw)  # type: ignore[arg-type]


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
