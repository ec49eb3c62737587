"""X6: a bank restored into a host directory never changes anything outside it, whatever
its bytes (issue 10 holes 1-3), through the public ``resume()`` with a faithfully
recorded bank (real size, SHA-256 and manifest digest)."""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
from pathlib import Path

import pytest
from hostile import end, gz, member, pax_header, pax_payload, record_for, ustar

from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.application.resume import ResumeOutcome, resume
from scratchbank.domain import ResumeRequest
from scratchbank.domain.records import ScratchBanked, ScratchRestored
from scratchbank.testing.builders import started


def tree_digest(root: Path, *, skip: Path | None = None) -> str:
    """Every entry under ``root`` (never following a link): name, kind, mode, content."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            if skip is not None and (path == skip or skip in path.parents):
                continue
            st = path.lstat()
            digest.update(f"{path.relative_to(root)}|{st.st_mode:o}|".encode("utf-8", "surrogateescape"))
            if stat.S_ISLNK(st.st_mode):
                digest.update(os.readlink(path).encode("utf-8", "surrogateescape"))
            elif stat.S_ISREG(st.st_mode):
                digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def outer(tmp_path: Path) -> Path:
    """A canary tree around the destination ``outer/dest`` (which already holds a tree)."""
    root = tmp_path / "outer"
    (root / "sibling").mkdir(parents=True)
    (root / "canary.txt").write_text("canary")
    (root / "sibling" / "secret").write_text("secret")
    (root / "dest").mkdir()
    (root / "dest" / "old.txt").write_text("old scratch")
    return root


def restore_into(data: bytes, target: Path, *, manifest_bytes: int | None = None) -> ResumeOutcome:
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    record = record_for(data, manifest_bytes)
    assert isinstance(record, ScratchBanked)
    timeline.append("run-x", [started(), record])
    store.banks["run-x"] = data
    return resume(
        "run-x", ResumeRequest(), timeline=timeline, store=store, sandbox=None, host_directory=target
    )


def refused(out: ResumeOutcome, says: str) -> None:
    assert out.restore is not None and out.restore.park is not None, out
    assert says in out.restore.record.reason, out.restore.record.reason


def root_dir(mode: int = 0o755) -> bytes:
    return ustar(member("./", tarfile.DIRTYPE, mode=mode))


# -- hole 1: a negative PAX size moved the reader backwards -------------------------------------
def test_X6_a_negative_pax_size_is_refused_and_nothing_changes(outer: Path) -> None:
    before = tree_digest(outer)
    victim = outer / "sibling" / "secret"
    evil = ustar(member("x", tarfile.SYMTYPE, linkname=str(victim))) + ustar(member("x2", size=4), b"PWND")
    raw = (
        root_dir() + pax_header(pax_payload([("size", "-1536")])) + ustar(member("a", size=0)) + evil + end()
    )
    out = restore_into(gz(raw), outer / "dest")
    refused(out, "bad PAX size")
    assert tree_digest(outer) == before


# -- hole 2: symlinks contained as text, out through the bank's own links ----------------------
CHAIN = [
    ustar(member("d", tarfile.DIRTYPE)),
    ustar(member("d/l1", tarfile.SYMTYPE, linkname="..")),
    ustar(member("l2", tarfile.SYMTYPE, linkname="d/l1/..")),  # text: inside; tree: the parent of dest
]


@pytest.mark.parametrize("order", [(0, 1, 2), (0, 2, 1)], ids=["link-first", "link-last"])
def test_X6_a_symlink_out_through_other_links_of_the_bank_is_refused(
    outer: Path, order: tuple[int, ...]
) -> None:
    before = tree_digest(outer)
    out = restore_into(gz(root_dir() + b"".join(CHAIN[i] for i in order) + end()), outer / "dest")
    refused(out, "points outside the scratch ('d/l1/..')")
    assert tree_digest(outer) == before


@pytest.mark.parametrize(
    ("name", "target"),
    [("abs", "/etc"), ("up", "../sibling"), ("deep", "a/../../x"), ("loop", "loop/x")],
)
def test_X6_links_leading_out_or_looping_are_refused(outer: Path, name: str, target: str) -> None:
    before = tree_digest(outer)
    out = restore_into(
        gz(root_dir() + ustar(member(name, tarfile.SYMTYPE, linkname=target)) + end()), outer / "dest"
    )
    refused(out, "points outside the scratch")
    assert tree_digest(outer) == before


def test_X6_links_that_stay_inside_through_other_links_are_restored(outer: Path) -> None:
    raw = (
        root_dir()
        + CHAIN[0]
        + ustar(member("d/l1", tarfile.SYMTYPE, linkname="."))
        + ustar(member("l2", tarfile.SYMTYPE, linkname="d/l1/.."))
        + ustar(member("f", size=2), b"ok")
        + end()
    )
    outside = tree_digest(outer, skip=outer / "dest")
    out = restore_into(gz(raw), outer / "dest")
    assert out.proceeds, out
    assert (
        os.readlink(outer / "dest" / "l2") == "d/l1/.."
        and (outer / "dest" / "l2" / "f").read_bytes() == b"ok"
    )
    assert tree_digest(outer, skip=outer / "dest") == outside


# -- hole 3: the destination as a symlink, the swap, the modes ---------------------------------
def _bank() -> bytes:
    return gz(
        root_dir(0o751)
        + ustar(member("sub", tarfile.DIRTYPE, mode=0o711, mtime=1_600_000_000))
        + ustar(member("sub/tool", size=3, mode=0o4755), b"run")
        + ustar(member("hard", tarfile.LNKTYPE, linkname="sub/tool"))
        + ustar(member("ro", tarfile.DIRTYPE, mode=0o555))
        + ustar(member("ro/f", size=1, mode=0o444), b"r")
        + ustar(member("implicit/parent/f", size=1), b"i")
        + end()
    )


def test_X6_modes_as_banked_setid_cleared_and_the_directory_not_0700(outer: Path) -> None:
    out = restore_into(_bank(), outer / "dest")
    assert out.proceeds, out
    dest = outer / "dest"
    mode = {
        p: stat.S_IMODE((dest / p).lstat().st_mode) for p in ("", "sub", "sub/tool", "ro", "ro/f", "implicit")
    }
    assert mode == {"": 0o751, "sub": 0o711, "sub/tool": 0o755, "ro": 0o555, "ro/f": 0o444, "implicit": 0o755}
    assert (dest / "sub").stat().st_mtime == 1_600_000_000
    assert (dest / "hard").stat().st_ino == (dest / "sub" / "tool").stat().st_ino
    assert not (dest / "old.txt").exists()
    rec = out.restore.record if out.restore else None
    assert isinstance(rec, ScratchRestored) and rec.host_backed


def test_X6_a_destination_that_is_a_symlink_is_replaced_by_name(outer: Path) -> None:
    """The link is swapped out and removed; the directory it pointed to is untouched."""
    (outer / "dest-link").symlink_to(outer / "sibling")
    before = tree_digest(outer / "sibling")
    out = restore_into(_bank(), outer / "dest-link")
    assert out.proceeds, out
    assert (
        not (outer / "dest-link").is_symlink()
        and (outer / "dest-link" / "sub" / "tool").read_bytes() == b"run"
    )
    assert tree_digest(outer / "sibling") == before


def test_X6_the_swap_leaves_no_half_tree_and_no_sibling_behind(outer: Path) -> None:
    out = restore_into(_bank(), outer / "dest")
    assert out.proceeds, out
    assert sorted(p.name for p in outer.iterdir()) == ["canary.txt", "dest", "sibling"]
    assert restore_into(_bank(), outer / "new" / "dest").proceeds  # a missing parent is made
    assert sorted(p.name for p in (outer / "new").iterdir()) == ["dest"]


def test_X6_less_free_space_than_declared_is_refused_by_name_first(outer: Path) -> None:
    before = tree_digest(outer)
    out = restore_into(_bank(), outer / "dest", manifest_bytes=1 << 60)
    refused(out, "NO_SPACE_AT_DESTINATION")
    assert tree_digest(outer) == before
    assert sorted(p.name for p in outer.iterdir()) == ["canary.txt", "dest", "sibling"]


def test_X6_a_member_the_host_refuses_midway_changes_nothing(outer: Path) -> None:
    """Checked whole before the first entry is created: a late refusal leaves no trace."""
    before = tree_digest(outer)
    raw = root_dir() + ustar(member("fine", size=2), b"ok") + ustar(member("../escape", size=1), b"x") + end()
    refused(restore_into(gz(raw), outer / "dest"), "'..'")
    assert tree_digest(outer) == before
