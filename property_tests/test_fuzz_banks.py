"""Differential fuzz of the host check (issue 10, Build 6a; ADR 0002).

Valid banks are built as SECURITY.md describes them (GNU and PAX tars of directories,
files, symlinks and hard links, long and non-ASCII names, gzip'd), then mutated at the
byte level: header fields (with or without a fixed checksum), PAX records, truncation,
concatenation, gzip members. For every mutant, either the reader refuses it with a
named code, or the canonical archive it yields is listed identically to the manifest
by Python's tarfile, GNU tar and BusyBox tar (each extracting it into a directory of
its own), and a host-directory restore of it creates exactly the manifest and changes
nothing outside the destination (a canary tree around it).

CI runs the ``ci`` profile (fixed seed); ``HYPOTHESIS_PROFILE=long`` runs 20k examples.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from scratchbank.adapters.host_directory import restore_into_host_directory
from scratchbank.adapters.memory import InMemoryBankStore
from scratchbank.application.bank_format.gunzip import GzipReader
from scratchbank.application.bank_format.reader import Limits, TarReader
from scratchbank.application.bank_format.writer import CanonicalWriter
from scratchbank.domain.errors import HostileArchive
from scratchbank.domain.fold import Bank, Evidence
from scratchbank.domain.records import ScratchBanked

BLOCK = 512
GNU_TAR = shutil.which("tar")
BUSYBOX = shutil.which("busybox")
NAMED = {"HOSTILE_ARCHIVE", "ARCHIVE_UNREADABLE"}
#: each example's three extractions and canary tree: in memory where the host has a tmpfs (a
#: directory removed from this machine's disk costs ~1.4 ms: ~10% of the test's time)
SCRATCH_DIR = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None

# -- valid banks ---------------------------------------------------------------------------------
names = st.sampled_from(["a", "b", "dir", "é", "x y", "n\nl", "long" * 30, "ü" * 60, ".hidden", "-dash"])
paths = st.lists(names, min_size=1, max_size=3).map("/".join)


@st.composite
def banks(draw: st.DrawFn) -> bytes:
    """A tar as an honest tar writes it: parents before children, links to earlier files."""
    fmt = draw(st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        root = tarfile.TarInfo("./")
        root.type, root.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(root)
        made: set[str] = set()
        regular: list[str] = []
        leaves: set[str] = set()  # files and links: nothing goes under them
        for path in draw(st.lists(paths, min_size=1, max_size=6, unique=True)):
            if path in made or any(p in leaves for p in _parents(path)):
                continue
            for parent in _parents(path):
                if parent not in made:
                    tar.addfile(_info(parent, tarfile.DIRTYPE))
                    made.add(parent)
            kind = draw(st.sampled_from(["file", "file", "dir", "symlink", "hardlink"]))
            if kind == "hardlink" and not regular:
                kind = "file"
            if kind == "file":
                data = draw(st.binary(max_size=1500))
                tar.addfile(_info(path, tarfile.REGTYPE, size=len(data)), io.BytesIO(data))
                regular.append(path)
                leaves.add(path)
            elif kind == "dir":
                tar.addfile(_info(path, tarfile.DIRTYPE))
            elif kind == "symlink":
                tar.addfile(
                    _info(path, tarfile.SYMTYPE, linkname=draw(st.sampled_from(["a", "../b", "dir/a", "."])))
                )
                leaves.add(path)
            else:
                tar.addfile(_info(path, tarfile.LNKTYPE, linkname=draw(st.sampled_from(regular))))
                leaves.add(path)
            made.add(path)
    return out.getvalue()


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _info(name: str, kind: bytes, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size, linkname
    info.mode, info.mtime, info.uid, info.uname = (
        0o644 if kind == tarfile.REGTYPE else 0o755,
        1_600_000_000,
        1000,
        "u",
    )
    return info


# -- mutations -------------------------------------------------------------------------------
FIELDS = [
    (0, 100),
    (100, 8),
    (108, 8),
    (124, 12),
    (136, 12),
    (148, 8),
    (156, 1),
    (157, 100),
    (257, 8),
    (345, 155),
]
PAX_KEYS = ["size", "path", "linkpath", "mtime", "atime", "uid", "comment", "GNU.sparse.size", "hdrcharset"]
PAX_VALUES = [
    "-512",
    "-1",
    "0",
    "1",
    "511",
    "513",
    "1024",
    "99999999999",
    "1e400",
    "../x",
    "/etc",
    "a/../../b",
    "1600000000.5",
    "BINARY",
    "",
    "x" * 200,
]


def _headers(tar: bytes) -> list[int]:
    """Offsets of the header blocks of an honest tar (walking sizes)."""
    out, pos = [], 0
    while pos + BLOCK <= len(tar) and any(tar[pos : pos + BLOCK]):
        out.append(pos)
        size = int(tar[pos + 124 : pos + 136].split(b"\x00")[0].strip() or b"0", 8)
        pos += BLOCK + size + (-size) % BLOCK
    return out


def _fix_checksum(block: bytearray) -> None:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\x00 " % sum(block)


@st.composite
def header_field(draw: st.DrawFn, tar: bytes) -> bytes:
    at = draw(st.sampled_from(_headers(tar)))
    start, length = draw(st.sampled_from(FIELDS))
    raw = draw(
        st.binary(min_size=1, max_size=length)
        | st.sampled_from(
            [
                b"-1",
                b"\x80" + b"\x00" * 10 + b"\x05",
                b"\xff" * 12,
                b"7" * length,
                b"1",
                b"2",
                b"5",
                b"x",
                b"L",
                b"K",
            ]
        )
    )
    block = bytearray(tar[at : at + BLOCK])
    block[start : start + len(raw[:length])] = raw[:length]
    if start != 148 and draw(st.booleans()):  # past the checksum, to the field's own check
        _fix_checksum(block)
    return tar[:at] + bytes(block) + tar[at + BLOCK :]


@st.composite
def pax_record(draw: st.DrawFn, tar: bytes) -> bytes:
    headers = _headers(tar)
    files = [at for at in headers if tar[at + 156 : at + 157] in (b"0", b"\x00")]
    at = draw(st.sampled_from(files or headers))
    anything = st.lists(
        st.tuples(st.sampled_from(PAX_KEYS), st.sampled_from(PAX_VALUES)), min_size=1, max_size=3
    )
    renamed_and_resized = st.tuples(  # the shape that makes a reader disagree with itself
        st.tuples(st.just("path"), st.sampled_from(["renamed", "p/q", "n\nl2"])),
        st.tuples(st.just("size"), st.sampled_from(["-512", "-1024", "-512", "-1536", "1", "700"])),
    ).map(list)
    pairs = draw(st.one_of(renamed_and_resized, anything))
    payload = b""
    for key, value in pairs:
        body = f" {key}={value}\n".encode()
        n = len(body) + 1
        while len(str(n)) + len(body) != n:
            n = len(str(n)) + len(body)
        payload += str(n).encode() + body
    if len(pairs) != 2 and draw(st.booleans()):
        payload = payload[: draw(st.integers(0, len(payload)))]  # a torn record
    x = tarfile.TarInfo("././@PaxHeader")
    x.type, x.size = tarfile.XHDTYPE, len(payload)
    header = x.tobuf(tarfile.USTAR_FORMAT) + payload + b"\x00" * ((-len(payload)) % BLOCK)
    return tar[:at] + header + tar[at:]


@st.composite
def mutants(draw: st.DrawFn) -> bytes:
    """A gzip'd bank, mutated (or not) at the tar or gzip level."""
    tar = draw(banks())
    how = draw(st.sampled_from(["none", "field", "field", "pax", "pax", "pax", "truncate", "concat", "gzip"]))
    if how == "field":
        tar = draw(header_field(tar))
    elif how == "pax":
        tar = draw(pax_record(tar))
    elif how == "truncate":
        tar = tar[: draw(st.integers(0, len(tar)))]
    elif how == "concat":
        tar = tar + draw(st.sampled_from([tar, b"\x00" * BLOCK, b"garbage", draw(banks())]))
    data = gzip.compress(tar, mtime=0)
    if how == "gzip":
        cut = draw(st.integers(0, len(tar)))
        data = draw(
            st.sampled_from(
                [
                    gzip.compress(tar[:cut], mtime=0) + gzip.compress(tar[cut:], mtime=0),  # two members
                    data + gzip.compress(b"x", mtime=0),
                    data[: draw(st.integers(0, len(data)))],
                    data[:-5] + bytes([data[-5] ^ 0x55]) + data[-4:],
                ]
            )
        )
    return data


# -- the property -----------------------------------------------------------------------------
def accept(data: bytes, note: Callable[[str], None] = event) -> tuple[bytes, list[str]] | None:
    """The canonical tar and the manifest, or None when refused by name."""
    out = io.BytesIO()
    writer = CanonicalWriter(out)
    reader = TarReader(Limits(), on_member=writer.member, on_data=writer.data)
    code = ""
    try:
        gunzip = GzipReader(reader.feed, 1 << 30)
        gunzip.feed(data)
        gunzip.close()
        reader.close()
    except HostileArchive as error:
        code = error.code
        note(f"refused: {error.message.split(':')[1].strip()[:28]}")
    if code:
        assert code in NAMED
        return None
    note("accepted")
    writer.finish()
    return out.getvalue(), list(reader.log.lines())


def tarfile_listing(canonical: bytes) -> list[str]:
    sizes: dict[str, int] = {}
    lines = []
    for m in tarfile.open(fileobj=io.BytesIO(canonical)):
        name = m.name.rstrip("/")
        if name in ("", "."):
            continue
        if m.isfile():
            sizes[name] = m.size
            lines.append(json.dumps([name, "file", m.size]))
        elif m.isdir():
            lines.append(json.dumps([name, "dir", 0]))
        elif m.issym():
            lines.append(json.dumps([name, "symlink", len(m.linkname.encode("utf-8", "surrogateescape"))]))
        elif m.islnk():
            lines.append(json.dumps([name, "file", sizes[m.linkname]]))
    return sorted(lines)


def tree_listing(root: Path) -> list[str]:
    lines = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st_ = path.lstat()
            rel = os.fsdecode(path.relative_to(root))
            kind = "dir" if stat.S_ISDIR(st_.st_mode) else "symlink" if stat.S_ISLNK(st_.st_mode) else "file"
            lines.append(json.dumps([rel, kind, 0 if kind == "dir" else st_.st_size]))
    return sorted(lines)


def with_implicit(manifest: list[str]) -> list[str]:
    """The manifest plus the parent directories a bank may leave implicit (tars create them)."""
    paths = {json.loads(line)[0] for line in manifest}
    implicit = {p for line in manifest for p in _parents(json.loads(line)[0])} - paths
    return sorted(manifest + [json.dumps([p, "dir", 0]) for p in implicit])


def extracted_by(argv: list[str], canonical: bytes, where: Path) -> list[str]:
    where.mkdir()
    done = subprocess.run([*argv, "-x", "-f", "-", "-C", str(where)], input=canonical, capture_output=True)
    assert done.returncode == 0, (argv, done.stderr)
    return tree_listing(where)


def canary_digest(root: Path, skip: Path) -> str:
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            if path == skip or skip in path.parents:
                continue
            digest.update(os.fsencode(path) + b"%o" % path.lstat().st_mode)
            if path.is_file() and not path.is_symlink():
                digest.update(path.read_bytes())
    return digest.hexdigest()


def host_restore(data: bytes, canary: Path) -> list[str] | None:
    store = InMemoryBankStore()
    store.banks["run-f"] = data
    record = ScratchBanked(
        banked=True, empty=False, unknown=False, bytes=len(data), sha256=hashlib.sha256(data).hexdigest()
    )
    bank = Bank(Evidence(1, ScratchBanked.WIRE), record, 1)
    dest = canary / "box" / "dest"
    try:
        restore_into_host_directory("run-f", bank, dest, store=store, cap=1 << 30)
    except HostileArchive:  # a link leading out: refused for a host directory only
        return None
    return tree_listing(dest)


@pytest.mark.skipif(GNU_TAR is None or BUSYBOX is None, reason="needs GNU tar and BusyBox on the host")
@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutants())
def test_X2_X6_every_bank_is_refused_by_name_or_read_alike_by_every_tar_and_restored_contained(
    data: bytes,
) -> None:
    accepted = accept(data)
    if accepted is None:
        return
    canonical, manifest = accepted
    assert tarfile_listing(canonical) == manifest
    with tempfile.TemporaryDirectory(dir=SCRATCH_DIR) as tmp:
        work = Path(tmp)
        assert extracted_by([str(GNU_TAR), "--no-same-owner"], canonical, work / "gnu") == with_implicit(
            manifest
        )
        assert extracted_by([str(BUSYBOX), "tar"], canonical, work / "busybox") == with_implicit(manifest)
        canary = work / "canary"
        (canary / "box").mkdir(parents=True)
        (canary / "box" / "neighbour").write_text("n")
        (canary / "secret").write_text("s")
        before = canary_digest(canary, canary / "box" / "dest")
        restored = host_restore(data, canary)
        assert canary_digest(canary, canary / "box" / "dest") == before
        if restored is not None:
            assert restored == with_implicit(manifest)


def test_the_fuzz_meets_both_outcomes() -> None:
    """The generator is not vacuous: an honest bank is accepted, a mutated one refused."""
    honest = gzip.compress(_tar_of(_info("a", tarfile.REGTYPE, size=0)), mtime=0)
    assert accept(honest, print) is not None
    assert accept(honest[:-3], print) is None
    assert zlib.crc32(honest) != 0


def _tar_of(*infos: tarfile.TarInfo) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info in infos:
            tar.addfile(info, io.BytesIO(b""))
    return out.getvalue()
