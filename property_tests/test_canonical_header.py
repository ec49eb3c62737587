"""The canonical header encoder (issue 14): byte for byte what tarfile's PAX writer wrote.

``header_of`` (bank_format/header_encoder.py) builds every header a sandbox ever extracts. It used to
build them with ``tarfile.TarInfo.tobuf(PAX_FORMAT)``; it now lays the fields out itself
(tarfile was a third of the host's per-member work). The model is the old code, kept
here: for any member the reader can accept (names of any bytes but NUL, long names and
links, non-ASCII and undecodable bytes, sizes and mtimes within and past an 11-digit
octal field, any mode, every kind), both give the same bytes, and the reader reads the
header back to the same member.
"""

from __future__ import annotations

import tarfile

from hypothesis import assume, example, given
from hypothesis import strategies as st

from scratchbank.application.bank_format.header_encoder import header_of
from scratchbank.application.bank_format.members import DIR, FILE, HARDLINK, SYMLINK, Member
from scratchbank.application.bank_format.reader import Limits, TarReader
from scratchbank.application.bank_format.tar_header import MAX_MTIME

_TYPES = {FILE: tarfile.REGTYPE, DIR: tarfile.DIRTYPE, SYMLINK: tarfile.SYMTYPE, HARDLINK: tarfile.LNKTYPE}


def tarfile_header_of(m: Member, mode: int | None = None) -> bytes:
    """The encoder as it was (tarfile's PAX writer): the model."""
    name = m.path + "/" if m.type == DIR and m.path else (m.path or "./")
    info = tarfile.TarInfo(name)
    info.type = _TYPES[m.type]
    info.size = m.size if m.type == FILE else 0
    info.mode = (m.mode if mode is None else mode) & 0o777
    info.mtime = m.mtime
    info.linkname = m.linkname
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


_ANY_BYTE = st.binary(min_size=1, max_size=40).filter(lambda b: b"\x00" not in b and b"/" not in b)
_COMPONENT = st.one_of(
    _ANY_BYTE,
    st.text(min_size=1, max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(1, 255).map(lambda n: b"n" * n),  # long ASCII components
).filter(lambda b: b"\x00" not in b and b"/" not in b and b not in (b".", b".."))


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


_PATH = st.lists(_COMPONENT, min_size=1, max_size=24).map(lambda parts: _text(b"/".join(parts)))
_LINK = st.one_of(
    _PATH,
    st.lists(st.sampled_from([b"..", b".", b"a", b"\xff\xfe", "é".encode()]), min_size=1, max_size=60).map(
        lambda parts: _text(b"/".join(parts))
    ),
)
_SIZE = st.one_of(st.integers(0, 1 << 20), st.integers(8**11 - 4, 8**11 + 4), st.integers(0, 1 << 44))
_MTIME = st.one_of(st.integers(0, MAX_MTIME), st.sampled_from([0, 1, 1_764_000_000, MAX_MTIME]))


@st.composite
def members(draw: st.DrawFn) -> Member:
    kind = draw(st.sampled_from([FILE, DIR, SYMLINK, HARDLINK]))
    path = "" if kind == DIR and draw(st.booleans()) and draw(st.booleans()) else draw(_PATH)
    size = draw(_SIZE) if kind == FILE else 0
    link = draw(_LINK) if kind in (SYMLINK, HARDLINK) else ""
    return Member(path, kind, size, draw(st.integers(0, 0o7777)), draw(_MTIME), link)


@given(members(), st.one_of(st.none(), st.integers(0, 0o7777)))
@example(Member("a" * 100, FILE, 0, 0o644, 0), None)
@example(Member("a" * 101, FILE, 0, 0o644, 0), None)
@example(Member("d" * 99, DIR, 0, 0o555, 0), 0o755)
@example(Member("l", SYMLINK, 0, 0o777, 0, "t" * 101), None)
@example(Member("é", FILE, 8**11, 0o644, MAX_MTIME), None)
@example(Member(_text(b"\xff" * 300), HARDLINK, 0, 0o644, 0, _text(b"\xfe")), None)
def test_the_canonical_header_is_byte_identical_to_tarfiles(m: Member, mode: int | None) -> None:
    assert header_of(m, mode) == tarfile_header_of(m, mode)


@given(members())
def test_the_canonical_header_reads_back_to_the_same_member(m: Member) -> None:
    """What the encoder wrote, the reader reads back to the member (limits wide enough
    to hold it; a hard link after its target; only the header fed: the member comes
    before its data). Sizes an 11-digit field holds: past it (8 GiB, over the default
    cap of 4 GiB) tarfile wrote a size of 0 beside the PAX size, which the reader refuses
    as a contradiction; kept byte for byte, as the encoder must match."""
    assume(m.path not in ("", "t") and not m.path.startswith("t/"))
    assume(m.size < 8**11)
    m = Member(m.path, m.type, m.size, m.mode & 0o777, m.mtime, "t" if m.type == HARDLINK else m.linkname)
    wide = Limits(uncompressed_bytes=1 << 45, name_bytes=1 << 20, component_bytes=1 << 20, depth=64)
    got: list[Member] = []
    reader = TarReader(wide, on_member=got.append)
    reader.feed(
        header_of(Member("", DIR, 0, 0o755, 0)) + header_of(Member("t", FILE, 0, 0o644, 0)) + header_of(m)
    )
    reader.log.close()
    assert got[-1] == m
