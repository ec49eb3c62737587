"""The BankStore contract against every adapter, and each adapter's own edges."""

from __future__ import annotations

import hashlib
import io
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from unittest import mock

import boto3
import pytest

from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.memory import InMemoryBankStore
from scratchbank.adapters.s3_bank import S3BankStore
from scratchbank.application.ports import BankStore, StoredBank
from scratchbank.domain.errors import BankGone, BankReadFailed, BankWriteFailed
from scratchbank.domain.objects import BankStamp, StoredObject
from scratchbank.testing.contracts import BankStoreContract


class TestInMemoryBankStore(BankStoreContract):
    def make(self, tmp: Path) -> BankStore:
        return InMemoryBankStore()


class TestFilesystemBankStore(BankStoreContract):
    def make(self, tmp: Path) -> BankStore:
        return FilesystemBankStore(tmp / "banks")


def s3_client(endpoint: str):  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


def new_bucket(endpoint: str) -> str:
    name = "sb-" + uuid.uuid4().hex[:12]
    s3_client(endpoint).create_bucket(Bucket=name)
    return name


@pytest.mark.s3
class TestS3BankStore(BankStoreContract):
    @pytest.fixture(autouse=True)
    def _server(self, s3_endpoint: str) -> None:
        self.endpoint = s3_endpoint

    def make(self, tmp: Path) -> BankStore:
        return S3BankStore(new_bucket(self.endpoint), "team/x", client=s3_client(self.endpoint))


def _src(tmp: Path, data: bytes, name: str = "a.tgz") -> tuple[Path, str]:
    src = tmp / name
    src.write_bytes(data)
    return src, hashlib.sha256(data).hexdigest()


STAMP = BankStamp(
    "run-1", "@4", 4, hashlib.sha256(b"data").hexdigest(), "", datetime(2026, 12, 1, tzinfo=UTC)
)


def test_A17_filesystem_layout_an_object_its_stamp_and_no_half_bank(tmp_path: Path) -> None:
    """runs/<id>/banks/<sha256>.tgz beside its stamp; a failed put leaves nothing behind."""
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
    """A put onto a name that exists keeps what is there (create-only, idempotent)."""
    store = FilesystemBankStore(tmp_path)
    src, digest = _src(tmp_path, b"data")
    there = tmp_path / "runs/run-1/banks" / f"{digest}.tgz"
    there.parent.mkdir(parents=True)
    there.write_bytes(b"what was there first")
    assert store.put("run-1", src, sha256=digest) == f"banks/{digest}.tgz"
    assert there.read_bytes() == b"what was there first"


def test_A17_files_link_into_place_and_a_racing_link_never_replaces(tmp_path: Path) -> None:
    """Two puts of one name past their existence check: the second's link loses, the first stays."""
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
    """A put whose process died leaves a temp file; delete and sweep take it (and legacy ones)."""
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
    """A bank put before objects had names is fetched, stat'ed and listed at its old key."""
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
    """<prefix>/sessions/<run>/banks/<sha256>.tgz, the stamp in the object's metadata."""
    bucket = new_bucket(s3_endpoint)
    client = s3_client(s3_endpoint)
    store = S3BankStore(bucket, "/team/x/", client=client)
    src, digest = _src(tmp_path, b"data")
    store.put("run-1", src, sha256=digest, stamp=STAMP)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == [f"team/x/sessions/run-1/banks/{digest}.tgz"]
    head = client.head_object(Bucket=bucket, Key=keys[0])
    assert head["Metadata"]["sha256"] == digest and head["Metadata"]["execution"] == "%404"
    assert list(store.objects("run-1")) == [StoredObject(f"banks/{digest}.tgz", 4, STAMP)]


@pytest.mark.s3
def test_A17_s3_puts_are_create_only_on_the_real_server(s3_endpoint: str, tmp_path: Path) -> None:
    """If-None-Match: an object already under the name is never replaced (412 from the server)."""
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
    """sessions/<run>/scratch.tgz is still fetched for a record that names no object."""
    bucket = new_bucket(s3_endpoint)
    client = s3_client(s3_endpoint)
    store = S3BankStore(bucket, "p", client=client)
    client.put_object(Bucket=bucket, Key="p/sessions/run-1/scratch.tgz", Body=b"old")
    out = io.BytesIO()
    assert store.fetch("run-1", out, max_bytes=10).bytes == 3 and out.getvalue() == b"old"
    assert list(store.objects("run-1")) == [StoredObject(None, 3)]


@pytest.mark.s3
def test_X5_missing_bucket_is_read_again_not_gone(s3_endpoint: str) -> None:
    store = S3BankStore("no-such-bucket-" + uuid.uuid4().hex[:8], client=s3_client(s3_endpoint))
    with pytest.raises(BankReadFailed) as caught:
        store.fetch("run-1", io.BytesIO(), max_bytes=10)
    assert not isinstance(caught.value, BankGone)


@pytest.mark.s3
def test_X4_only_no_such_key_is_gone(s3_endpoint: str) -> None:
    store = S3BankStore(new_bucket(s3_endpoint), client=s3_client(s3_endpoint))
    with pytest.raises(BankGone):
        store.fetch("run-1", io.BytesIO(), max_bytes=10)


def test_X5_unreachable_s3_is_read_again() -> None:
    store = S3BankStore("b", client=s3_client("http://127.0.0.1:9"))
    with pytest.raises(BankReadFailed):
        store.fetch("run-1", io.BytesIO(), max_bytes=10)
    with pytest.raises(BankWriteFailed):
        store.delete("run-1")


@pytest.mark.s3
def test_s3_checksum_kept_with_the_object_is_verified_on_read(s3_endpoint: str, tmp_path: Path) -> None:
    bucket = new_bucket(s3_endpoint)
    client = s3_client(s3_endpoint)
    store = S3BankStore(bucket, client=client)
    client.put_object(
        Bucket=bucket,
        Key=store.key("run-1"),
        Body=b"tampered",
        Metadata={"sha256": hashlib.sha256(b"original").hexdigest()},
    )
    with pytest.raises(BankReadFailed, match="checksum mismatch"):
        store.fetch("run-1", io.BytesIO(), max_bytes=100)


@pytest.mark.s3
def test_T10_a_large_archive_streams_up_and_back(s3_endpoint: str, tmp_path: Path) -> None:
    store = S3BankStore(new_bucket(s3_endpoint), client=s3_client(s3_endpoint))
    src = tmp_path / "big.tgz"
    block = os.urandom(1 << 20)
    with open(src, "wb") as f:
        for _ in range(20):
            f.write(block)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    name = store.put("run-big", src, sha256=digest)
    out = tmp_path / "back.tgz"
    with open(out, "wb") as f:
        got = store.fetch("run-big", f, max_bytes=1 << 30, name=name)
    assert got.sha256 == digest and got.bytes == 20 << 20
