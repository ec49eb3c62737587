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
