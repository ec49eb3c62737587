"""The RestoreTarget contract (application/ports.py; the suite is the kit's
``scratchbank.testing.contracts.RestoreTargetContract``) on a sandbox's scratch (the fake
and the local sandbox, through ``SandboxTarget``) and on a host directory
(``HostDirectory``): the same cases where they share behaviour (X1-X6, L5).

Each target starts holding an old tree. A checked bank is restored as its manifest; a
refusal (a hostile member, bytes not as recorded, more than the room, a cut run context)
leaves the target byte for byte as it was."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from scratchbank.adapters.host_directory import HostDirectory
from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.memory import FakeSandbox
from scratchbank.application.bank_format.manifest_line import line_of
from scratchbank.application.ports import RestoreTarget
from scratchbank.application.restore import SandboxTarget
from scratchbank.testing.contracts import RestoreTargetContract


class TestSandboxTarget(RestoreTargetContract):
    hands_over = False

    def make(self, tmp: Path) -> RestoreTarget:
        return SandboxTarget(FakeSandbox({"old.txt": b"old scratch"}))

    def _box(self, target: RestoreTarget) -> FakeSandbox:
        assert isinstance(target, SandboxTarget) and isinstance(target.sandbox, FakeSandbox)
        return target.sandbox

    def listing(self, target: RestoreTarget) -> list[str]:
        return self._box(target).list_scratch()

    def checksum(self, target: RestoreTarget) -> str:
        box = self._box(target)
        return repr((sorted((box.files or {}).items()), box.tree, box.staged))


class TestLocalSandboxTarget(RestoreTargetContract):
    """A real sandbox's restore (unshare, its restore script): the staged protocol on disk."""

    hands_over = False

    @pytest.fixture(autouse=True)
    def _closed(self) -> Iterator[None]:
        self.made: list[LocalSandbox] = []
        yield
        for box in self.made:
            box.destroy()

    def make(self, tmp: Path) -> RestoreTarget:
        box = LocalSandbox(tmp / "box")
        self.made.append(box)
        scratch = Path(box.facts.scratch)
        scratch.mkdir(parents=True, exist_ok=True)
        (scratch / "old.txt").write_text("old scratch")
        return SandboxTarget(box)

    def _box(self, target: RestoreTarget) -> LocalSandbox:
        assert isinstance(target, SandboxTarget) and isinstance(target.sandbox, LocalSandbox)
        return target.sandbox

    def listing(self, target: RestoreTarget) -> list[str]:
        return _listing(Path(self._box(target).facts.scratch))

    def checksum(self, target: RestoreTarget) -> str:
        """The box's folder, whole: a staged tree left beside the scratch would show."""
        return _digest(Path(self._box(target).facts.scratch).parent)


class TestHostDirectory(RestoreTargetContract):
    hands_over = True

    def make(self, tmp: Path) -> RestoreTarget:
        (tmp / "outer" / "dest").mkdir(parents=True)
        (tmp / "outer" / "dest" / "old.txt").write_text("old scratch")
        (tmp / "outer" / "canary").write_text("canary")
        return HostDirectory(tmp / "outer" / "dest")

    def _path(self, target: RestoreTarget) -> Path:
        assert isinstance(target, HostDirectory)
        return target.path

    def listing(self, target: RestoreTarget) -> list[str]:
        return _listing(self._path(target))

    def checksum(self, target: RestoreTarget) -> str:
        """The destination's parent, whole: a fresh sibling left behind would show."""
        return _digest(self._path(target).parent)


def _listing(root: Path) -> list[str]:
    """The tree under ``root`` as sorted manifest lines (directories and files)."""
    lines = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = (Path(dirpath) / name).lstat()
            kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
            size = 0 if kind == "dir" else st.st_size
            lines.append(line_of(os.path.relpath(Path(dirpath) / name, root), kind, size))
    return sorted(lines)


def _digest(root: Path) -> str:
    """Every entry under ``root``: name, mode, content."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            st = path.lstat()
            digest.update(f"{path.relative_to(root)}|{st.st_mode:o}|".encode())
            if stat.S_ISREG(st.st_mode):
                digest.update(path.read_bytes())
    return digest.hexdigest()


def test_a_path_where_the_port_belongs_is_refused_by_name(tmp_path: Path) -> None:
    """X6: Target(host_directory=Path) is a TypeError naming the adapter, before anything is read."""
    from scratchbank.application.resume import Target

    with pytest.raises(TypeError, match="HostDirectory"):
        Target(host_directory=tmp_path)  # type: ignore[arg-type]
