"""The BankStore contract against every adapter, and each adapter's own edges."""

from __future__ import annotations

import hashlib
import io
import os
import uuid
from pathlib import Path

import boto3
import pytest

from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.memory import InMemoryBankStore
from scratchbank.adapters.s3_bank import S3BankStore
from scratchbank.application.ports import BankStore
from scratchbank.domain.errors import BankGone, BankReadFailed, BankWriteFailed
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


def test_T3_filesystem_layout_and_no_half_bank_under_the_real_name(tmp_path: Path) -> None:
    store = FilesystemBankStore(tmp_path)
    src = tmp_path / "a.tgz"
    src.write_bytes(b"old")
    store.put("run-1", src, sha256="")
    assert (tmp_path / "runs/run-1/scratch-bank.tgz").read_bytes() == b"old"
    missing = tmp_path / "vanished.tgz"
    with pytest.raises(BankWriteFailed):
        store.put("run-1", missing, sha256="")
    assert (tmp_path / "runs/run-1/scratch-bank.tgz").read_bytes() == b"old"
    assert os.listdir(tmp_path / "runs/run-1") == ["scratch-bank.tgz"]


@pytest.mark.s3
def test_T3_s3_layout_under_the_prefix(s3_endpoint: str, tmp_path: Path) -> None:
    bucket = new_bucket(s3_endpoint)
    client = s3_client(s3_endpoint)
    store = S3BankStore(bucket, "/team/x/", client=client)
    src = tmp_path / "a.tgz"
    src.write_bytes(b"data")
    store.put("run-1", src, sha256=hashlib.sha256(b"data").hexdigest())
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["team/x/sessions/run-1/scratch.tgz"]
    head = client.head_object(Bucket=bucket, Key=keys[0])
    assert head["Metadata"]["sha256"] == hashlib.sha256(b"data").hexdigest()


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
def test_T10_large_archive_goes_multipart_and_streams_back(s3_endpoint: str, tmp_path: Path) -> None:
    store = S3BankStore(new_bucket(s3_endpoint), client=s3_client(s3_endpoint))
    src = tmp_path / "big.tgz"
    block = os.urandom(1 << 20)
    with open(src, "wb") as f:
        for _ in range(20):
            f.write(block)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    store.put("run-big", src, sha256=digest)
    out = tmp_path / "back.tgz"
    with open(out, "wb") as f:
        got = store.fetch("run-big", f, max_bytes=1 << 30)
    assert got.sha256 == digest and got.bytes == 20 << 20
