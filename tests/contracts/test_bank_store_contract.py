"""The BankStore contract against every adapter, and each adapter's own edges."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest
from rigs.s3_buckets import new_bucket, s3_client

from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.memory import InMemoryBankStore
from scratchbank.adapters.s3_bank import S3BankStore
from scratchbank.application.ports import BankStore
from scratchbank.domain.errors import BankReadFailed
from scratchbank.testing.contracts import BankStoreContract


class TestInMemoryBankStore(BankStoreContract):
    def make(self, tmp: Path) -> BankStore:
        return InMemoryBankStore()


class TestFilesystemBankStore(BankStoreContract):
    def make(self, tmp: Path) -> BankStore:
        return FilesystemBankStore(tmp / "banks")


@pytest.mark.s3
class TestS3BankStore(BankStoreContract):
    @pytest.fixture(autouse=True)
    def _server(self, s3_endpoint: str) -> None:
        self.endpoint = s3_endpoint

    def make(self, tmp: Path) -> BankStore:
        return S3BankStore(new_bucket(self.endpoint), "team/x", client=s3_client(self.endpoint))


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
