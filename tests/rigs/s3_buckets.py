"""An S3 client and a fresh bucket on the test S3 server, a bank source file and a bank stamp.

First written for tests/contracts/test_bank_store_contract.py: The BankStore contract against every
adapter, and each adapter's own edges."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime
from pathlib import Path

import boto3

from scratchbank.domain.objects import BankStamp


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


def _src(tmp: Path, data: bytes, name: str = "a.tgz") -> tuple[Path, str]:
    src = tmp / name
    src.write_bytes(data)
    return src, hashlib.sha256(data).hexdigest()


STAMP = BankStamp(
    "run-1", "@4", 4, hashlib.sha256(b"data").hexdigest(), "", datetime(2026, 12, 1, tzinfo=UTC)
)
