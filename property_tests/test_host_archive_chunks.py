"""T2 / RULES.md's "bank: one gzip'd tar of a run's scratch": however the transport cuts the
stream, the host stores one gzip whose content is exactly the tar sent, hashed as stored,
and its manifest counts the members sent. The model is the rule itself (gunzip of what is
stored == what tar sent), never the code under test."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from scratchbank.application.bank_format.gzip_codec import GzipCodec, _isal
from scratchbank.application.bank_format.host_archive import HostArchive

CODECS = [GzipCodec("zlib", 1)] + ([GzipCodec("isal", 1)] if _isal() is not None else [])

contents = st.lists(st.binary(max_size=3000) | st.just(b"ab" * 700_000), min_size=1, max_size=6)
cuts = st.lists(st.integers(min_value=97, max_value=1_500_000), min_size=1, max_size=20)


def tar_of(files: list[bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i, data in enumerate(files):
            info = tarfile.TarInfo(f"f{i}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def pieces(data: bytes, sizes: list[int]) -> list[bytes]:
    out, pos, i = [], 0, 0
    while pos < len(data):
        step = sizes[i % len(sizes)]
        out.append(data[pos : pos + step])
        pos, i = pos + step, i + 1
    return out


@settings(max_examples=min(80, settings.default.max_examples))  # each streams up to ~8 MiB, two threads
@given(files=contents, sizes=cuts, codec=st.sampled_from(CODECS))
def test_T2_any_cut_of_the_stream_stores_one_gzip_of_exactly_the_tar_sent(
    files: list[bytes], sizes: list[int], codec: GzipCodec
) -> None:
    sent = tar_of(files)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "b.tgz"
        sink = HostArchive(path, gzipped_input=False, gzip_level=1, cap=1 << 30, codec=codec)
        for piece in pieces(sent, sizes):
            sink.write(piece)
        facts = sink.finish()
        stored = path.read_bytes()
    assert gzip.decompress(stored) == sent
    assert facts.sha256 == hashlib.sha256(stored).hexdigest() and facts.bytes == len(stored)
    assert facts.manifest is not None and facts.manifest.entries == len(files)
