"""The RestoreTarget contract (application/ports.py) on a sandbox's scratch and on a host
directory: the same cases where they share behaviour (X1-X6, L5), one subclass per target.

Each target starts holding an old tree. A checked bank is restored as its manifest; a
refusal (a hostile member, bytes not as recorded, a cut run context) leaves the target
byte for byte as it was."""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile import end, gz, member, record_for, ustar

from scratchbank.adapters.host_directory import HostDirectory
from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore
from scratchbank.application.bank_format.manifest_line import line_of
from scratchbank.application.cancellation import Cancel
from scratchbank.application.ports import ForwardingBankStore, RestoreTarget
from scratchbank.application.restore import SandboxTarget, restore_bank
from scratchbank.domain.fold import Bank, Evidence
from scratchbank.domain.records import ScratchBanked
from scratchbank.domain.restore import RestoreAttempt, RestoreResult
from scratchbank.domain.resume_gate import ResumeDecision, Verdict

RUN = "run-t"
GOOD = gz(
    ustar(member("./", tarfile.DIRTYPE, mode=0o755))
    + ustar(member("sub", tarfile.DIRTYPE, mode=0o755))
    + ustar(member("sub/f", size=3), b"abc")
    + ustar(member("top", size=1), b"t")
    + end()
)
EXPECTED = sorted([line_of("sub", "dir", 0), line_of("sub/f", "file", 3), line_of("top", "file", 1)])
HOSTILE = gz(ustar(member("ok", size=1), b"o") + ustar(member("../escape", size=1), b"x") + end())


class _CutOnFetch(ForwardingBankStore):
    """A store whose fetch cuts the run context first (the lease lost mid-restore, L5)."""

    def __init__(self, inner: InMemoryBankStore, cancel: Cancel) -> None:
        super().__init__(inner)
        self.cancel = cancel

    def before(self, call: str, run_id: str) -> None:
        if call == "fetch":
            self.cancel.cut("the lease was lost")


def _decision(
    stored: bytes, recorded: bytes | None = None, manifest_bytes: int | None = None
) -> tuple[ResumeDecision, InMemoryBankStore]:
    """A restore decision whose record is ``recorded``'s (default: what is stored)."""
    record = record_for(recorded if recorded is not None else stored, manifest_bytes)
    assert isinstance(record, ScratchBanked)
    store = InMemoryBankStore()
    store.banks[RUN] = stored
    bank = Bank(Evidence(1, ScratchBanked.WIRE), record, 1)
    return ResumeDecision(Verdict.RESTORE, "X1", "restore", bank=bank), store


class RestoreTargetContract:
    """The cases every restore target passes; a subclass says how to make and read one."""

    hands_over: bool

    def make(self, tmp: Path) -> RestoreTarget:  # pragma: no cover - abstract
        """A target holding an old tree."""
        raise NotImplementedError

    def listing(self, target: RestoreTarget) -> list[str]:  # pragma: no cover - abstract
        """What stands at the target, as sorted manifest lines."""
        raise NotImplementedError

    def checksum(self, target: RestoreTarget) -> str:  # pragma: no cover - abstract
        """Everything the target can see, byte for byte (staged and leftover trees too)."""
        raise NotImplementedError

    def _restore(self, target: RestoreTarget, stored: bytes, recorded: bytes | None = None) -> RestoreAttempt:
        decision, store = _decision(stored, recorded)
        return restore_bank(RUN, decision, store=store, into=target)

    def test_a_checked_bank_is_restored_as_its_manifest(self, tmp_path: Path) -> None:
        """X1, X6: restore_bank through the port: RESTORED with the bank's bytes, the tree its manifest."""
        target = self.make(tmp_path)
        got = self._restore(target, GOOD)
        assert got.result is RestoreResult.RESTORED, got
        assert got.bytes == len(GOOD) and got.into_host_dir is self.hands_over
        assert self.listing(target) == EXPECTED
        assert target.hands_over is self.hands_over

    def test_a_hostile_bank_is_refused_and_changes_nothing(self, tmp_path: Path) -> None:
        """X3, X6: a member leading out of the tree: refused on the host, the target as it was."""
        target = self.make(tmp_path)
        before = self.checksum(target)
        got = self._restore(target, HOSTILE)
        assert got.result is RestoreResult.REFUSED_ON_HOST, got
        assert self.checksum(target) == before

    def test_a_bank_not_as_recorded_is_refused_and_changes_nothing(self, tmp_path: Path) -> None:
        """X3: stored bytes whose size and digest are not the record's: refused, the target as it was."""
        target = self.make(tmp_path)
        before = self.checksum(target)
        tampered = gz(ustar(member("top", size=1), b"T") + end())  # a valid bank, not the recorded one
        got = self._restore(target, tampered, recorded=GOOD)
        assert got.result is RestoreResult.REFUSED_ON_HOST, got
        assert self.checksum(target) == before

    def test_a_bank_larger_than_the_room_is_refused_and_changes_nothing(self, tmp_path: Path) -> None:
        """X2, X6: a bank declaring more bytes than the target has free: refused first."""
        target = self.make(tmp_path)
        before = self.checksum(target)
        decision, store = _decision(GOOD, manifest_bytes=1 << 60)
        got = restore_bank(RUN, decision, store=store, into=target)
        assert got.result in (RestoreResult.REFUSED_ON_HOST, RestoreResult.REFUSED_IN_SANDBOX), got
        assert self.checksum(target) == before

    def test_a_restore_cut_midway_is_lease_lost_and_changes_nothing(self, tmp_path: Path) -> None:
        """L5: the run context cut once the fetch began: LEASE_LOST, nothing moved into place."""
        target = self.make(tmp_path)
        before = self.checksum(target)
        decision, store = _decision(GOOD)
        cancel = Cancel()
        got = restore_bank(RUN, decision, store=_CutOnFetch(store, cancel), into=target, cancel=cancel)
        assert got.result is not RestoreResult.RESTORED and "LEASE_LOST" in got.detail, got
        assert self.checksum(target) == before


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
