"""`BankStore.stat`: what the store holds for a run (size and SHA-256), or None; the same on
every adapter (files, S3 on a real server, memory). `status` compares it with the record."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest

from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.memory import InMemoryBankStore
from scratchbank.adapters.s3_bank import S3BankStore
from scratchbank.application.ports import BankStore, StoredBank
from scratchbank.domain.errors import BankReadFailed, InvalidRunId


def s3_store(endpoint: str, *, bucket: str | None = None) -> S3BankStore:
    client = boto3.session.Session(
        aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
    ).client("s3", endpoint_url=endpoint)
    name = bucket or f"stat-{uuid.uuid4().hex[:12]}"
    if bucket is None:
        client.create_bucket(Bucket=name)
    return S3BankStore(name, "pre", client=client)


@pytest.fixture(params=["files", "s3", "memory"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], BankStore]:
    if request.param == "files":
        return lambda: FilesystemBankStore(tmp_path / "banks")
    if request.param == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        return lambda: s3_store(endpoint)
    return InMemoryBankStore


def test_stat_says_what_the_store_holds_or_none(make: Callable[[], BankStore], tmp_path: Path) -> None:
    """stat: None, then the size and digest put under its name, then None after delete; bad ids refused."""
    store = make()
    archive = tmp_path / "a.tgz"
    archive.write_bytes(b"x" * 3000)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    name = f"banks/{digest}.tgz"
    assert store.stat("run-1", name) is None
    assert store.put("run-1", archive, sha256=digest) == name
    assert store.stat("run-1", name) == StoredBank(3000, digest)
    assert store.stat("run-1") is None  # the legacy key holds nothing: nothing is put there
    store.delete("run-1", name)
    assert store.stat("run-1", name) is None
    with pytest.raises(InvalidRunId):
        store.stat("../etc")


def test_stat_on_a_missing_bucket_is_read_failed_not_gone(s3_endpoint: str) -> None:
    """Only NoSuchKey means "no bank": a missing bucket is a store to read again (X5)."""
    with pytest.raises(BankReadFailed):
        s3_store(s3_endpoint, bucket=f"absent-{uuid.uuid4().hex[:8]}").stat("run-1")
