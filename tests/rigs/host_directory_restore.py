"""A bank restored into a host directory through ``resume()``, the digest of a tree, and the refusal it
must name.

First written for tests/rules/test_X_adapters.py: X6: a bank restored into a host directory never
changes anything outside it, whatever its bytes (issue 10 holes 1-3), through the public
``resume()`` with a faithfully recorded bank (real size, SHA-256 and manifest digest)."""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
from pathlib import Path

import pytest
from hostile import end, gz, member, record_for, ustar

from scratchbank.adapters.host_directory import HostDirectory
from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.application.resume import ResumeOutcome, resume
from scratchbank.domain import ResumeRequest
from scratchbank.domain.records import ScratchBanked
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
        "run-x",
        ResumeRequest(),
        timeline=timeline,
        store=store,
        sandbox=None,
        host_directory=HostDirectory(target),
    )


def refused(out: ResumeOutcome, says: str) -> None:
    assert out.restore is not None and out.restore.park is not None, out
    assert says in out.restore.record.reason, out.restore.record.reason


def root_dir(mode: int = 0o755) -> bytes:
    return ustar(member("./", tarfile.DIRTYPE, mode=mode))


# -- hole 2: symlinks contained as text, out through the bank's own links ----------------------
CHAIN = [
    ustar(member("d", tarfile.DIRTYPE)),
    ustar(member("d/l1", tarfile.SYMTYPE, linkname="..")),
    ustar(member("l2", tarfile.SYMTYPE, linkname="d/l1/..")),  # text: inside; tree: the parent of dest
]


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
