"""The host-side check: every bank is hostile input (X2, SECURITY.md)."""

from __future__ import annotations

import gzip
import io

import pytest
from rigs.tar_reader import check

from scratchbank.application.bank_format.reader import Limits, TarReader
from scratchbank.application.bank_format.spill_log import Manifest
from scratchbank.application.bank_format.writer import CanonicalWriter
from scratchbank.domain.errors import HostileArchive


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
