"""The bank as it arrives on the host (T2, T20, X2, ADR 0003): compressed, hashed, written and
checked in lanes beside the stream, in the gzip format any tar opens, whichever codec wrote it."""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import subprocess
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hostile import corpus

from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.memory import FakeSandbox, InMemoryTimeline
from scratchbank.application.bank_format.gzip_codec import GzipCodec, _isal, choose_codec
from scratchbank.application.bank_format.host_archive import BATCH, ArchiveFacts, HostArchive
from scratchbank.application.bank_format.reader import Limits
from scratchbank.application.teardown import Budgets, bank_at_teardown
from scratchbank.domain.errors import ArchiveFailed, HostArchiveFailed
from scratchbank.testing.builders import started

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


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: f"{c.library}-{c.level}")
def test_T2_a_raw_stream_is_stored_as_one_gzip_any_gunzip_opens_with_its_digest(
    tmp_path: Path, codec: GzipCodec
) -> None:
    """What the host file holds is one gzip of exactly the tar sent, and the facts describe that file."""
    raw = raw_tar()
    assert len(raw) > 2 * BATCH
    facts = stream(
        HostArchive(tmp_path / "b.tgz", gzipped_input=False, gzip_level=1, cap=1 << 30, codec=codec), raw
    )
    stored = (tmp_path / "b.tgz").read_bytes()
    assert gzip.decompress(stored) == raw
    assert facts.bytes == len(stored)
    assert facts.sha256 == hashlib.sha256(stored).hexdigest()
    assert facts.manifest is not None and facts.manifest.entries == 40
    assert facts.refused == ""


def test_T2_a_sandbox_gzipped_stream_is_stored_byte_for_byte(tmp_path: Path) -> None:
    """compress_in_sandbox: the host stores what it was sent and checks it through gunzip."""
    sent = gzip.compress(raw_tar(), compresslevel=6)
    facts = stream(HostArchive(tmp_path / "b.tgz", gzipped_input=True, gzip_level=1, cap=1 << 30), sent)
    assert (tmp_path / "b.tgz").read_bytes() == sent
    assert facts.sha256 == hashlib.sha256(sent).hexdigest()
    assert facts.manifest is not None and facts.manifest.entries == 40


def test_T20_past_the_cap_the_host_counts_the_whole_archive_but_writes_no_more(tmp_path: Path) -> None:
    """The cap is judged on the whole compressed size; the file stops growing at the cap."""
    raw = raw_tar(files=30, size=200_000)
    whole = stream(HostArchive(tmp_path / "a.tgz", gzipped_input=False, gzip_level=1, cap=1 << 30), raw)
    cap = whole.bytes // 3
    capped = stream(HostArchive(tmp_path / "c.tgz", gzipped_input=False, gzip_level=1, cap=cap), raw)
    assert capped.bytes == whole.bytes
    assert capped.sha256 == whole.sha256
    assert (tmp_path / "c.tgz").stat().st_size <= cap


@pytest.mark.parametrize(("name", "data", "says"), corpus(), ids=[c[0] for c in corpus()])
def test_X2_a_hostile_raw_stream_is_refused_by_name_while_still_stored_and_hashed(
    tmp_path: Path, name: str, data: bytes, says: str
) -> None:
    """The refusal is a named reason on the facts (recorded, never banked), not an exception."""
    if "gzip" in says:
        pytest.skip("a gzip-level case: only a sandbox-compressed bank carries its own gzip")
    try:
        raw = gzip.decompress(data)
    except (OSError, EOFError, zlib.error):
        pytest.skip("a broken gzip stream: only a sandbox-compressed bank can carry one")
    limits = Limits(uncompressed_bytes=1 << 30)
    sink = HostArchive(tmp_path / "h.tgz", gzipped_input=False, gzip_level=1, cap=1 << 30, limits=limits)
    facts = stream(sink, raw)
    assert re.search(says.replace("(", r"\("), facts.refused), facts
    assert facts.manifest is None
    assert facts.sha256 == hashlib.sha256((tmp_path / "h.tgz").read_bytes()).hexdigest()


def test_T8_a_host_file_that_cannot_be_written_is_named_and_the_stream_still_drains() -> None:
    """/dev/full refuses every write (ENOSPC): write() keeps taking the stream, finish() names it."""
    sink = HostArchive(Path("/dev/full"), gzipped_input=False, gzip_level=1, cap=1 << 30)
    raw = raw_tar(files=60, size=100_000)
    for i in range(0, len(raw), 65_536):
        sink.write(raw[i : i + 65_536])  # never raises: a transport must drain its stream
    with pytest.raises(HostArchiveFailed) as caught:
        sink.finish()
    assert caught.value.code == "HOST_ARCHIVE_FAILED"
    assert isinstance(caught.value, ArchiveFailed)  # so banking tries again (T8)
    assert "No space left" in caught.value.message


def test_close_without_finish_stops_the_lanes(tmp_path: Path) -> None:
    """An archive cut short (the exec failed) leaves no thread behind."""
    import threading

    before = {t.name for t in threading.enumerate()}
    sink = HostArchive(tmp_path / "x.tgz", gzipped_input=False, gzip_level=1, cap=1 << 30)
    sink.write(raw_tar()[: 3 * BATCH])
    sink.close()
    assert {t.name for t in threading.enumerate()} - before == set()


def test_the_codec_is_isal_up_to_level_3_when_installed_and_zlib_beyond() -> None:
    """ADR 0003: ISA-L knows levels 0-3; a higher level asks for zlib's ratio."""
    assert choose_codec(6) == GzipCodec("zlib", 6)
    assert choose_codec(1, prefer_isal=False) == GzipCodec("zlib", 1)
    expected = "isal" if _isal() is not None else "zlib"
    assert choose_codec(1) == GzipCodec(expected, 1)


def test_X2_a_stream_the_check_cannot_even_parse_is_refused_not_trusted(tmp_path: Path) -> None:
    """A PAX mtime of "inf" (an overflow, not a format error) still ends in a refusal by name."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("f")
        info.pax_headers = {"mtime": "inf"}
        tar.addfile(info, io.BytesIO(b""))
    facts = stream(
        HostArchive(tmp_path / "i.tgz", gzipped_input=False, gzip_level=1, cap=1 << 30), out.getvalue()
    )
    assert facts.refused.startswith("bank refused on the host"), facts
    assert facts.manifest is None


def test_a_lane_that_failed_keeps_draining_and_keeps_its_first_error() -> None:
    """A producer never blocks on a failed lane (its queue is bounded): it drains, keeps the first error."""
    import threading

    from scratchbank.application.bank_format.host_archive import DEPTH, Lane

    seen: list[bytes] = []

    def work(batch: bytes) -> None:
        seen.append(batch)
        raise ValueError(f"failed on {batch!r}")

    lane = Lane("test-lane", work)
    producer = threading.Thread(target=lambda: [lane.put(b"%d" % i) for i in range(5 * DEPTH)], daemon=True)
    producer.start()
    producer.join(timeout=60)  # a liveness guard, not a speed figure: a stuck lane would block forever
    assert not producer.is_alive()
    lane.close()
    assert seen == [b"0"]
    assert str(lane.error) == "failed on b'0'"


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

    def now(self) -> datetime:
        return datetime(2026, 11, 30, tzinfo=UTC)


def test_T8_a_host_out_of_temporary_space_retries_then_records_why_and_keeps_the_earlier_bank(
    full_tmpdir: Path, tmp_path: Path
) -> None:
    """HOST_ARCHIVE_FAILED is tried again within the budget, recorded by name, and stores nothing."""
    import os

    store = FilesystemBankStore(tmp_path / "banks")
    earlier = tmp_path / "earlier.tgz"
    earlier.write_bytes(gzip.compress(raw_tar(files=2)))
    name = store.put("run-1", earlier, sha256=hashlib.sha256(earlier.read_bytes()).hexdigest())
    before = hashlib.sha256(store.path("run-1", name).read_bytes()).hexdigest()
    timeline = InMemoryTimeline()
    timeline.append("run-1", [started()])
    box = FakeSandbox({"noise.bin": os.urandom(512 << 10)})
    report = bank_at_teardown(
        "run-1", timeline=timeline, store=store, sandbox=box, run_finished=False, clock=NoSleep()
    )
    assert not report.record.banked
    assert "could not keep the archive" in report.record.reason
    assert len(report.tries) == Budgets().bank_tries
    assert hashlib.sha256(store.path("run-1", name).read_bytes()).hexdigest() == before
