"""Helpers and fixtures of the tests first written in tests/test_host_archive.py (The bank as it
arrives on the host (T2, T20, X2, ADR 0003): compressed, hashed, written and checked in lanes beside
the stream, in the gzip format any tar opens, whichever codec wrote it.), shared by the rule tests
filed by family in tests/rules/ and by the tests that stayed."""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from scratchbank.application.bank_format.gzip_codec import GzipCodec, _isal
from scratchbank.application.bank_format.host_archive import ArchiveFacts, HostArchive

CODECS = [GzipCodec("zlib", 1), GzipCodec("zlib", 6)]


if _isal() is not None:
    CODECS.append(GzipCodec("isal", 1))


def raw_tar(files: int = 40, size: int = 70_000) -> bytes:
    """A plain tar of ``files`` members of mixed text, past several 1 MiB batches."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(files):
            data = (b"line %d of file %d\n" % (i, i)) * (size // 20)
            info = tarfile.TarInfo(f"dir{i % 3}/f{i}.txt")
            info.size, info.mtime = len(data), 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def stream(sink: HostArchive, data: bytes, chunk: int = 65_519) -> ArchiveFacts:
    for i in range(0, len(data), chunk):
        assert sink.write(data[i : i + chunk]) == len(data[i : i + chunk])
    return sink.finish()


@pytest.fixture
def full_tmpdir(tmp_path: Path) -> Iterator[Path]:
    """TMPDIR on a 64 KiB tmpfs: the host's temporary space runs out for real."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=False)
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    saved = tempfile.tempdir
    tempfile.tempdir = str(mount)
    try:
        yield mount
    finally:
        tempfile.tempdir = saved
        subprocess.run(["umount", str(mount)], check=True)


class NoSleep:
    """A clock whose pauses pass at once (the budgets still count them)."""

    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def wait(self, event: threading.Event, seconds: float) -> bool:
        self.t += 0.0 if event.is_set() else seconds
        return event.is_set()

    def now(self) -> datetime:
        return datetime(2026, 11, 30, tzinfo=UTC)
