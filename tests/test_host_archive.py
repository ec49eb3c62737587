"""The bank as it arrives on the host (T2, T20, X2, ADR 0003): compressed, hashed, written and
checked in lanes beside the stream, in the gzip format any tar opens, whichever codec wrote it."""

from __future__ import annotations

from pathlib import Path

from rigs.host_archive import raw_tar

from scratchbank.application.bank_format.gzip_codec import GzipCodec, _isal, choose_codec
from scratchbank.application.bank_format.host_archive import BATCH, HostArchive


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


def test_an_archive_under_one_batch_is_worked_in_the_callers_thread(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A small bank (the usual scratch) starts no lane thread: the one batch is compressed,
    hashed, written and checked at ``finish``, with the same facts a laned archive has; a
    larger one still starts both lanes."""
    import gzip
    import hashlib
    import threading

    from scratchbank.application.bank_format import host_archive

    started: list[str] = []

    class Counted(threading.Thread):
        def start(self) -> None:
            started.append(self.name)
            super().start()

    monkeypatch.setattr(host_archive.threading, "Thread", Counted)
    small = raw_tar(files=3)
    assert len(small) < BATCH
    facts = HostArchive(tmp_path / "s.tgz", gzipped_input=False, gzip_level=1, cap=1 << 30)
    facts.write(small)
    done = facts.finish()
    stored = (tmp_path / "s.tgz").read_bytes()
    assert started == []
    assert gzip.decompress(stored) == small
    assert (done.bytes, done.sha256) == (len(stored), hashlib.sha256(stored).hexdigest())
    assert done.manifest is not None and done.manifest.entries == 3 and done.refused == ""

    big = HostArchive(tmp_path / "b.tgz", gzipped_input=False, gzip_level=1, cap=1 << 30)
    big.write(raw_tar()[: 2 * BATCH])
    big.close()
    assert sorted(started) == ["bank-check", "bank-store"]


def test_a_failed_inline_batch_is_named_as_a_failed_lane_is(tmp_path: Path) -> None:
    """The caller's-thread path keeps the lanes' contract: the host's failure to keep the
    bank (here its compressor fails) is HostArchiveFailed, never a raw error."""
    import pytest

    from scratchbank.domain.errors import HostArchiveFailed

    class Failing:
        def open(self) -> Failing:
            return self

        def compress(self, data: bytes) -> bytes:
            raise OSError("no space left on device")

        def flush(self) -> bytes:
            return b""

    sink = HostArchive(tmp_path / "x.tgz", gzipped_input=False, gzip_level=1, cap=1 << 30, codec=Failing())  # type: ignore[arg-type]
    sink.write(raw_tar(files=2))
    with pytest.raises(HostArchiveFailed, match="no space left on device"):
        sink.finish()
