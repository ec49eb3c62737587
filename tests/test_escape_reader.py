"""The reader's grammar (issue 10, Build 1): every header field read with a range, PAX
records on an allow-list, a reader that only moves forward, and one boundary where any
parse failure becomes a named refusal (X2 on the host, T6 at bank time)."""

from __future__ import annotations

import io
import tarfile

import pytest
from hostile import end, gz, member, pax_header, pax_payload, set_field, ustar

from scratchbank.application.bank_format.gunzip import GzipReader
from scratchbank.application.bank_format.host_archive import HostArchive
from scratchbank.application.bank_format.reader import Limits, TarReader
from scratchbank.application.bank_format.tar_header import DROPPED_PAX_KEYS, USED_PAX_KEYS
from scratchbank.application.bank_format.writer import CanonicalWriter
from scratchbank.domain.errors import HostileArchive, UnreadableArchive


def read(raw: bytes, limits: Limits = Limits()) -> TarReader:
    """Feed a raw tar in odd-sized pieces (a boundary can fall anywhere), then close."""
    reader = TarReader(limits)
    for i in range(0, len(raw), 333):
        reader.feed(raw[i : i + 333])
    reader.close()
    return reader


def canonical(raw: bytes) -> list[tarfile.TarInfo]:
    out = io.BytesIO()
    writer = CanonicalWriter(out)
    reader = TarReader(on_member=writer.member, on_data=writer.data)
    reader.feed(raw)
    reader.close()
    writer.finish()
    return list(tarfile.open(fileobj=io.BytesIO(out.getvalue())))


def with_pax(pairs: list[tuple[str, str]], name: str = "f", data: bytes = b"hello") -> bytes:
    return pax_header(pax_payload(pairs)) + ustar(member(name, size=len(data)), data) + end()


# -- PAX sizes: the hole that let a bank move the reader backwards (issue 10 hole 1) -------
@pytest.mark.parametrize("size", ["-1024", "-1", "+5", "5 ", "0x5", "1e3", ""])
def test_X2_a_pax_size_off_the_grammar_is_refused(size: str) -> None:
    with pytest.raises(HostileArchive, match="bad PAX size"):
        read(with_pax([("size", size)]))


def test_X2_a_pax_size_that_contradicts_the_ustar_size_is_refused() -> None:
    with pytest.raises(HostileArchive, match="contradicts the header's size"):
        read(with_pax([("size", "4")]))


def test_X2_a_pax_size_equal_to_the_ustar_size_is_read() -> None:
    assert [m.size for m in read(with_pax([("size", "5")])).members] == [5]


# -- header fields: one grammar, each with a range ------------------------------------------
def _block(**kw: object) -> bytes:
    return member("f", size=0, **kw).tobuf(tarfile.USTAR_FORMAT)


FIELDS = [
    ("signed size", 124, b"-0000000001\x00", "bad number in the size field"),
    ("plus size", 124, b"+0000000001\x00", "bad number in the size field"),
    ("garbage after NUL", 124, b"00000000001\x00"[:10] + b"\x00x", "bad number in the size field"),
    ("negative base-256 size", 124, b"\xff" * 12, "negative or malformed base-256"),
    ("huge base-256 size", 124, b"\x80" + b"\x7f" * 11, "size field .* out of range"),
    ("mode with high bits", 100, b"0017777\x00", "mode field .* out of range"),
    (
        "base-256 mtime past the range",
        136,
        b"\x80" + b"\x00" * 3 + b"\x7f" * 8,
        "mtime field .* out of range",
    ),
    ("uid past 32 bits", 108, b"\x80\x00\x00\x01\x00\x00\x00\x00", "uid field .* out of range"),
    ("non-octal gid", 116, b"0000008\x00", "bad number in the gid field"),
]


@pytest.mark.parametrize(("name", "start", "raw", "says"), FIELDS, ids=[f[0] for f in FIELDS])
def test_X2_a_header_field_off_its_grammar_or_range_is_refused(
    name: str, start: int, raw: bytes, says: str
) -> None:
    with pytest.raises(HostileArchive, match=says):
        read(set_field(_block(), start, raw) + end())


def test_X2_a_base_256_size_within_range_is_read() -> None:
    block = set_field(_block(), 124, b"\x80" + b"\x00" * 10 + b"\x05")
    assert [m.size for m in read(block + b"hello" + b"\x00" * 507 + end()).members] == [5]


def test_X2_a_header_without_ustar_magic_is_refused() -> None:
    with pytest.raises(HostileArchive, match="not a ustar or GNU tar header"):
        read(set_field(_block(), 257, b"\x00" * 8) + end())


# -- PAX mtime: out of range was an OverflowError that escaped (issue 10 hole 3) ----------
@pytest.mark.parametrize(
    ("mtime", "says"),
    [
        ("1e400", "bad PAX mtime"),
        ("inf", "bad PAX mtime"),
        ("99999999999999999999", "out of range"),
        ("-5", "out of range"),
    ],
)
def test_T6_an_out_of_range_pax_mtime_is_a_named_refusal(mtime: str, says: str) -> None:
    with pytest.raises(HostileArchive, match=says):
        read(with_pax([("mtime", mtime)]))


def test_T6_at_bank_time_such_a_bank_is_refused_by_name_not_raised(tmp_path: object) -> None:
    """HostArchive (teardown) gets a named refusal, so the teardown still records (T6)."""
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    sink = HostArchive(tmp_path / "bank.tgz", gzipped_input=True, gzip_level=1, cap=1 << 20)
    sink.write(gz(with_pax([("mtime", "1e400")])))
    facts = sink.finish()
    assert facts.manifest is None and "bad PAX mtime" in facts.refused


# -- PAX keys: the allow-list ----------------------------------------------------------------
HARMLESS = {
    "atime": "1600000000.5",
    "ctime": "1600000000.25",
    "uid": "1000",
    "gid": "1000",
    "uname": "mallory",
    "gname": "staff",
    "hdrcharset": "BINARY",
}


@pytest.mark.parametrize("key", sorted(DROPPED_PAX_KEYS))
def test_X2_a_harmless_pax_key_is_normalised_away(key: str) -> None:
    (info,) = canonical(with_pax([(key, HARMLESS[key])]))
    assert key not in info.pax_headers and (info.uid, info.gid, info.uname, info.gname) == (0, 0, "", "")


def test_X2_the_used_pax_keys_are_honoured_and_rewritten_from_the_validated_member() -> None:
    assert {"path", "linkpath", "size", "mtime"} == USED_PAX_KEYS
    raw = with_pax([("path", "long/" * 30 + "name"), ("size", "5"), ("mtime", "1600000000.75")])
    raw = (
        raw[:-1024]
        + pax_header(pax_payload([("linkpath", "t" * 120)]))
        + ustar(member("l", tarfile.SYMTYPE, linkname="ignored"))
        + end()
    )
    f, link = canonical(raw)
    assert (f.name, f.size, f.mtime) == ("long/" * 30 + "name", 5, 1600000000)
    assert (link.name, link.linkname) == ("l", "t" * 120)


@pytest.mark.parametrize(
    "key",
    [
        "comment",
        "charset",
        "SCHILY.xattr.user.x",
        "LIBARCHIVE.creationtime",
        "SCHILY.fflags",
        "realtime.any",
        "security.selinux",
    ],
)
def test_X2_an_unknown_pax_key_is_refused_by_name(key: str) -> None:
    with pytest.raises(HostileArchive, match=f"PAX key '{key}' is not accepted"):
        read(with_pax([(key, "x")]))


def test_X2_a_hdrcharset_other_than_binary_or_utf8_is_refused() -> None:
    with pytest.raises(HostileArchive, match="hdrcharset 'latin-1' is not accepted"):
        read(with_pax([("hdrcharset", "latin-1")]))


def test_X2_a_pax_key_given_twice_is_refused() -> None:
    with pytest.raises(HostileArchive, match="given twice"):
        read(with_pax([("path", "a"), ("path", "b")]))


def test_X2_two_pax_headers_for_one_member_are_refused() -> None:
    raw = pax_header(pax_payload([("path", "a")])) + with_pax([("mtime", "5")])
    with pytest.raises(HostileArchive, match="two PAX headers"):
        read(raw)


@pytest.mark.parametrize("payload", [b"5 a=b\n", b"06 a=b\n", b"7 a=bXY", b"x a=b\n", b"7 =b\nxx"])
def test_X2_a_malformed_pax_record_is_refused(payload: bytes) -> None:
    with pytest.raises(HostileArchive, match="malformed PAX"):
        read(pax_header(payload) + ustar(member("f")) + end())


# -- one boundary -------------------------------------------------------------------------------
class _Buggy(TarReader):
    def _header(self, block: bytes) -> None:
        raise OverflowError("a parser bug met by hostile bytes")


def test_X2_any_parser_failure_becomes_a_named_refusal_at_one_boundary() -> None:
    reader = _Buggy()
    with pytest.raises(UnreadableArchive, match="OverflowError") as first:
        reader.feed(ustar(member("f")))
    assert first.value.code == "ARCHIVE_UNREADABLE"
    with pytest.raises(UnreadableArchive):  # a reader that failed stays failed
        reader.close()


def test_X2_the_gzip_reader_is_the_same_boundary() -> None:
    gunzip = GzipReader(_Buggy().feed, 1 << 20)
    with pytest.raises(UnreadableArchive):
        gunzip.feed(gz(ustar(member("f")) + end()))


def test_X2_a_failure_of_what_consumes_the_stream_passes_through_unnamed() -> None:
    """A broken pipe into a sandbox is not a hostile bank: it keeps its own type."""

    def broken(_: object) -> None:
        raise BrokenPipeError("the sandbox went away")

    reader = TarReader(on_member=broken)
    with pytest.raises(BrokenPipeError):
        GzipReader(reader.feed, 1 << 20).feed(gz(ustar(member("f")) + end()))


# -- forward only ------------------------------------------------------------------------------
def test_X2_implicit_parents_are_accepted_and_a_later_non_directory_there_is_refused() -> None:
    members = read(ustar(member("a/b/f")) + ustar(member("a", tarfile.DIRTYPE)) + end()).members
    assert sorted((m.path, m.type) for m in members) == [("a", "dir"), ("a/b/f", "file")]
    with pytest.raises(HostileArchive, match="parent of earlier members but not a directory"):
        read(ustar(member("a/f")) + ustar(member("a", tarfile.SYMTYPE, linkname="/etc")) + end())


def test_X2_a_size_that_claims_more_than_the_archive_holds_is_truncation() -> None:
    block = set_field(_block(), 124, b"%011o\x00" % 4096)
    with pytest.raises(HostileArchive, match="truncated"):
        read(block + b"x" * 512 + end())


# -- memory: flat in the member count (issue 10 hole 5) --------------------------------------
def _many(n: int) -> bytes:
    return b"".join(ustar(member(f"d{i % 50}/f{i}", size=1), b"z") for i in range(n)) + end()


def _peak_while_reading(raw: bytes) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        reader = TarReader()
        for i in range(0, len(raw), 1 << 16):
            reader.feed(raw[i : i + (1 << 16)])
        reader.close()
        lines = sum(1 for _ in reader.log.lines())
        assert lines == len(raw) // 1024 - 1
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_X2_host_memory_does_not_grow_with_the_member_count() -> None:
    """The members go to disk (SQLite), in batches: 10x the members, the same Python peak."""
    small, large = _many(1_000), _many(10_000)
    growth = _peak_while_reading(large) - _peak_while_reading(small)
    assert growth < 1 << 20, f"{growth} bytes more for 9,000 more members"
