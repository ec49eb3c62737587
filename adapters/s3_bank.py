"""Banks in any S3-compatible store: ``<prefix>/sessions/<run>/scratch.tgz`` (T3).

Uploads stream from the host file (multipart past 8 MiB) with the archive's SHA-256
kept as object metadata; reads stream to the caller's file, recompute the digest and
compare. Only S3's ``NoSuchKey`` means the bank is gone: a bare 404, a missing
bucket, a 5xx or a network error means "read again" (X4 vs X5).

Deadlines: a fetch arms a watchdog that shuts the body's socket down at its deadline
(a server or proxy that stops sending mid-object fails the read at once, as
BankReadFailed); a put runs as a transfer the caller waits on until its deadline, then
cancels (BankWriteFailed). botocore's own ``read_timeout`` bounds each request the
watchdog cannot reach (headers that never come).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from s3transfer.manager import TransferManager  # type: ignore[import-untyped]

from scratchbank.application.ports import StoredBank
from scratchbank.application.retry import Deadline, deadline_of
from scratchbank.application.streams import TooLarge, copy_hashed
from scratchbank.domain.errors import BankGone, BankReadFailed, BankWriteFailed, HostileArchive
from scratchbank.domain.runs import check_run_id

from .watchdog import Watchdog

MULTIPART = TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=4)
DIGEST_KEY = "sha256"
#: A call given no deadline ends by this many seconds.
CALL_SECONDS = 600.0
#: botocore's per-request read timeout (headers that never come, a body that stalls).
READ_TIMEOUT = 20.0


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class S3BankStore:
    """Banks in an S3 bucket (a BankStore): ``<prefix>/sessions/<run>/scratch.tgz``.

    Works against any S3 endpoint (AWS, MinIO, moto's server; ``endpoint_url`` or
    AWS_ENDPOINT_URL) with boto3's usual credentials. The archive's SHA-256 rides as
    object metadata; ``fetch`` recomputes and compares it, ``stat`` reads it with the
    size from a one-byte ranged GET (so NoSuchKey and NoSuchBucket stay apart). Only
    NoSuchKey means the bank is gone; anything else is BankReadFailed (read again).
    """

    keeps_banks = True

    def __init__(
        self, bucket: str, prefix: str = "", *, client: Any = None, endpoint_url: str | None = None
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        config = Config(
            retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=READ_TIMEOUT
        )
        self.client = client or boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)

    def key(self, run_id: str) -> str:
        key = f"sessions/{check_run_id(run_id)}/scratch.tgz"
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, run_id: str, archive: Path, *, sha256: str, deadline: Deadline | None = None) -> None:
        where = f"s3://{self.bucket}/{self.key(run_id)}"
        deadline = deadline_of(deadline, CALL_SECONDS)
        extra = {"Metadata": {DIGEST_KEY: sha256}}
        manager = TransferManager(self.client, MULTIPART)
        finished = False
        try:
            future = manager.upload(str(archive), self.bucket, self.key(run_id), extra_args=extra)
            _wait(future, deadline, where)
            finished = True
        except (BotoCoreError, ClientError, OSError) as error:
            raise BankWriteFailed(f"{where}: {error}") from error
        except BankWriteFailed:
            raise
        except Exception as error:  # s3transfer's failures and friends
            raise BankWriteFailed(f"{where}: {error}") from error
        finally:
            _close(manager, finished=finished)

    def fetch(
        self, run_id: str, dest: BinaryIO, *, max_bytes: int, deadline: Deadline | None = None
    ) -> StoredBank:
        where = f"s3://{self.bucket}/{self.key(run_id)}"
        deadline = deadline_of(deadline, CALL_SECONDS)
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self.key(run_id))
        except ClientError as error:
            if _code(error) == "NoSuchKey":
                raise BankGone(f"no bank at {where}") from None
            raise BankReadFailed(f"{where}: {error}") from error
        except BotoCoreError as error:
            raise BankReadFailed(f"{where}: {error}") from error
        body = got["Body"]
        with Watchdog(deadline, lambda: _shut(body)) as dog:
            try:
                size, digest = copy_hashed(body.read, dest.write, limit=max_bytes)
            except TooLarge:
                raise HostileArchive(f"{where} is over {max_bytes} bytes") from None
            except (BotoCoreError, ClientError, OSError, ValueError) as error:
                cut = " (cut at its deadline)" if dog.fired else ""
                raise BankReadFailed(f"{where}: stream broke{cut}: {error}") from error
            finally:
                body.close()
        if dog.fired:
            raise BankReadFailed(f"{where}: the read did not end within its deadline: cut")
        kept = got.get("Metadata", {}).get(DIGEST_KEY)
        if kept is not None and kept != digest:
            raise BankReadFailed(f"{where}: checksum mismatch (stored {kept}, read {digest})")
        return StoredBank(size, digest)

    def delete(self, run_id: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key(run_id))
        except (BotoCoreError, ClientError) as error:
            raise BankWriteFailed(f"deleting {self.key(run_id)}: {error}") from error

    def sweep(self, run_id: str) -> None:
        folder = self.key(run_id).rsplit("/", 1)[0] + "/"
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=folder)
            for page in pages:
                for obj in page.get("Contents", []):
                    self.client.delete_object(Bucket=self.bucket, Key=obj["Key"])
        except (BotoCoreError, ClientError) as error:
            raise BankWriteFailed(f"sweeping {folder}: {error}") from error

    def stat(self, run_id: str) -> StoredBank | None:
        """Size and SHA-256 of the run's object; None on NoSuchKey (nothing else)."""
        where = f"s3://{self.bucket}/{self.key(run_id)}"
        try:
            got = self.client.get_object(Bucket=self.bucket, Key=self.key(run_id), Range="bytes=0-0")
            got["Body"].close()
        except ClientError as error:
            if _code(error) == "NoSuchKey":
                return None
            raise BankReadFailed(f"{where}: {error}") from error
        except BotoCoreError as error:
            raise BankReadFailed(f"{where}: {error}") from error
        size = int(str(got.get("ContentRange", "/0")).rsplit("/", 1)[-1])
        kept = got.get("Metadata", {}).get(DIGEST_KEY)
        if kept is None:
            with open("/dev/null", "wb") as sink:
                return self.fetch(run_id, sink, max_bytes=size)
        return StoredBank(size, str(kept))


def _wait(future: Any, deadline: Deadline, where: str) -> None:
    """Wait for a transfer until its deadline; past it, cancel it and say so."""
    while not future.done():
        if deadline.passed():
            future.cancel()
            raise BankWriteFailed(f"{where}: the upload did not end within its deadline: cancelled")
        time.sleep(min(0.05, max(0.001, deadline.left())))
    future.result()


def _close(manager: TransferManager, *, finished: bool) -> None:
    """Shut a transfer manager down; one with a request still in flight is left to end
    in the background (its own read timeout), never waited on past the deadline."""
    if finished:
        manager.shutdown()
        return
    threading.Thread(target=manager.shutdown, kwargs={"cancel": True}, daemon=True).start()


def _shut(body: Any) -> None:
    """Shut the socket under a streaming body down, so a blocked read returns at once
    (closing it from another thread would not wake the read)."""
    sock = _socket_of(body)
    if sock is not None:
        sock.shutdown(socket.SHUT_RDWR)
    else:
        body.close()


def _socket_of(body: Any) -> socket.socket | None:
    """The socket a botocore StreamingBody reads from (urllib3 2: the response's file)."""
    raw = getattr(body, "_raw_stream", None)
    reader = getattr(getattr(getattr(raw, "_fp", None), "fp", None), "raw", None)
    sock = getattr(reader, "_sock", None)
    if isinstance(sock, socket.socket):
        return sock
    conn = getattr(getattr(raw, "_connection", None), "sock", None)
    return conn if isinstance(conn, socket.socket) else None
