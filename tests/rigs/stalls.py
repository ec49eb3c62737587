"""What stalls: a TCP proxy that stops forwarding, an endless stream, a sandbox whose archive never
ends, a PostgreSQL database of its own; the times each stall took.

First written for tests/test_deadlines.py: Every call has a deadline (T8, T14, X5): a stalled
transport fails in time, by name."""

from __future__ import annotations

import io
import socket
import threading
import uuid
from collections.abc import Iterator

import attrs
import boto3
import pytest

from scratchbank.adapters.exec_output import ExecResult
from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.s3_bank import S3BankStore
from scratchbank.adapters.scripted import ARCHIVE, BANK, Exec

STALL_SECONDS = 2.0


TIMES: dict[str, dict[str, float]] = {}


class StallingProxy:
    """A loopback TCP proxy that forwards ``budget`` bytes each way per connection (all of
    them when None) until ``stall()``, then swallows what it receives: the sockets stay
    open, a network that stops forwarding, not a reset."""

    def __init__(self, host: str, port: int, *, budget: int | None = None) -> None:
        self.upstream = (host, port)
        self.budget = budget
        self.stalled = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self) -> None:
        self.stalled.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            self.open += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        left = self.budget
        try:
            while data := src.recv(1 << 16):
                if self.stalled.is_set() or (left is not None and left <= 0):
                    continue  # swallowed: the stall
                dst.sendall(data if left is None else data[:left])
                left = None if left is None else left - len(data)
        except OSError:
            return

    def close(self) -> None:
        self.server.close()
        for s in self.open:
            s.close()


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> tuple[str, str]:
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id="k",
        aws_secret_access_key="s",
        region_name="us-east-1",
    )
    bucket = "stall-" + uuid.uuid4().hex[:10]
    client.create_bucket(Bucket=bucket)
    return s3_endpoint, bucket


@pytest.fixture
def through_proxy(s3_bucket: tuple[str, str]) -> Iterator[tuple[S3BankStore, S3BankStore]]:
    """(a store straight to S3, the same store through a proxy that stalls mid-transfer)."""
    endpoint, bucket = s3_bucket
    host, port = endpoint.removeprefix("http://").split(":")
    proxy = StallingProxy(host, int(port), budget=256 << 10)
    keys = {"aws_access_key_id": "k", "aws_secret_access_key": "s", "region_name": "us-east-1"}
    direct = S3BankStore(bucket, client=boto3.client("s3", endpoint_url=endpoint, **keys))
    stalled = S3BankStore(bucket, endpoint_url=proxy.url)
    stalled.client = boto3.client("s3", endpoint_url=proxy.url, config=stalled.client.meta.config, **keys)
    try:
        yield direct, stalled
    finally:
        proxy.close()


class _Endless(io.RawIOBase):
    """A stdin source that never ends (a restore's stream the script stops reading)."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        buffer[:] = b"x" * len(buffer)
        return len(buffer)


class StuckArchive(LocalSandbox):
    """A real local sandbox whose tar never ends (a hung filesystem): its transport's
    deadline must cut it."""

    def execute(self, exec_: Exec) -> ExecResult:
        source = exec_.source
        if source in (ARCHIVE, BANK):  # the bank's one exec quiesces, then its tar hangs
            tar = 'archive_scratch "$1" "$2" "$verify"'
            source = "sleep 1000" if source == ARCHIVE else source.replace(tar, "exec sleep 1000")
        return super().execute(attrs.evolve(exec_, source=source))


TIMELINE_SECONDS = 2.0


@pytest.fixture
def pg_database(postgres_url: str) -> str:
    import psycopg

    name = "stall_" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres_url.rsplit("/", 1)[0] + "/" + name
