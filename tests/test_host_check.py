"""The host-side check: every bank is hostile input (X2, SECURITY.md)."""

from __future__ import annotations

import gzip
import io

import pytest
from hostile import corpus, host_only_corpus

from scratchbank.application.bank_format.gunzip import GzipReader
from scratchbank.application.bank_format.reader import Limits, TarReader
from scratchbank.application.bank_format.spill_log import Manifest
from scratchbank.application.bank_format.writer import CanonicalWriter
from scratchbank.domain.errors import HostileArchive


def check(data: bytes, limits: Limits = Limits()) -> TarReader:
    reader = TarReader(limits)
    gunzip = GzipReader(reader.feed, limits.uncompressed_bytes)
    for i in range(0, len(data), 999):
        gunzip.feed(data[i : i + 999])
    gunzip.close()
    reader.close()
    return reader


@pytest.mark.parametrize(("name", "data", "says"), corpus(), ids=[c[0] for c in corpus()])
def test_X2_hostile_bank_is_refused_on_the_host_by_name(name: str, data: bytes, says: str) -> None:
    with pytest.raises(HostileArchive, match=says.replace("(", r"\(")):
        check(data, Limits(uncompressed_bytes=1 << 30))


@pytest.mark.parametrize(("name", "data", "says"), host_only_corpus(), ids=[c[0] for c in host_only_corpus()])
def test_X6_links_out_are_refused_only_for_a_host_directory(name: str, data: bytes, says: str) -> None:
    check(data)  # inert inside a sandbox
    with pytest.raises(HostileArchive, match=says):
        check(data, Limits(host_directory=True))


def test_a_bomb_is_refused_before_it_is_expanded() -> None:
    zeros = gzip.compress(b"\x00" * (50 << 20))  # ~50 KB that expands 1000:1
    with pytest.raises(HostileArchive):
        check(zeros, Limits(uncompressed_bytes=1 << 20))


def test_canonical_archive_drops_owners_setid_and_fifos_and_keeps_the_manifest() -> None:
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, mode in (("s", tarfile.REGTYPE, 0o4755), ("p", tarfile.FIFOTYPE, 0o644)):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.uid, info.uname = kind, mode, 1234, "mallory"
            tar.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    out = io.BytesIO()
    writer = CanonicalWriter(out)
    reader = TarReader(on_member=writer.member, on_data=writer.data)
    reader.feed(raw.getvalue())
    reader.close()
    writer.finish()
    members = list(tarfile.open(fileobj=io.BytesIO(out.getvalue())))
    assert [(m.name, m.mode, m.uid, m.uname) for m in members] == [("s", 0o755, 0, "")]
    assert Manifest.of(reader.members).entries == 1


def test_X2_the_host_inflates_a_bank_with_isal_and_refuses_as_zlib_did() -> None:
    """Issue 24 item 2: the bank's gunzip is ISA-L's; a corrupt, truncated or trailing stream is still refused by name."""
    from isal import isal_zlib

    reader = GzipReader(lambda chunk: None, 1 << 20)
    assert type(reader._d) is type(isal_zlib.decompressobj(wbits=31))
    good = gzip.compress(b"x" * 5000)
    bad = bytearray(good)
    bad[-6] ^= 1  # the CRC
    for data, says in ((bytes(bad), "corrupt gzip stream"), (good + b"tail", "trailing data")):
        with pytest.raises(HostileArchive, match=says):
            GzipReader(lambda chunk: None, 1 << 20).feed(data)
    truncated = GzipReader(lambda chunk: None, 1 << 20)
    truncated.feed(good[:-3])
    with pytest.raises(HostileArchive, match="truncated"):
        truncated.close()
