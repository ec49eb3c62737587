"""In-memory adapters: real implementations of the ports, for tests and for engines' tests.

They pass the same contract suites as the persistent adapters, so an engine team
can test its integration against them and trust the behaviour carries over.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import threading
from collections.abc import Collection, Iterable, Iterator, MutableMapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Protocol

from scratchbank.application.bank_format.manifest_line import line_of
from scratchbank.application.cancellation import Deadline
from scratchbank.application.ports import (
    ArchiveReport,
    ByteSink,
    Placed,
    QuiesceReport,
    SandboxFacts,
    StagedRestore,
    StoredBank,
    SystemClock,
)
from scratchbank.domain.errors import (
    BankGone,
    BankWriteFailed,
    HostileArchive,
    RestoreRefused,
    SandboxGone,
    TimelineConflict,
)
from scratchbank.domain.objects import BankStamp, Listing, StoredObject, check_object_name, object_name
from scratchbank.domain.records import Record
from scratchbank.domain.runs import check_run_id


class InMemoryTimeline:
    """A Timeline kept in a dict; appends are atomic under a lock."""

    def __init__(self) -> None:
        self._runs: dict[str, list[Record]] = {}
        self._lock = threading.Lock()

    def read(self, run_id: str) -> Sequence[Record]:
        check_run_id(run_id)
        with self._lock:
            return tuple(self._runs.get(run_id, ()))

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        check_run_id(run_id)
        with self._lock:
            current = self._runs.setdefault(run_id, [])
            if expected is not None and len(current) != expected:
                raise TimelineConflict(f"run {run_id}: expected {expected} records, found {len(current)}")
            current.extend(records)
            return len(current)


class _LegacyBanks(MutableMapping[str, bytes]):
    """``InMemoryBankStore.banks``: each run's legacy fixed key (a bank recorded before
    objects had names), as a dict, so tests seed a bank the way they always did."""

    def __init__(self, objects: dict[str, dict[str | None, bytes]]) -> None:
        self._objects = objects

    def __getitem__(self, run_id: str) -> bytes:
        return self._objects.get(run_id, {})[None]

    def __setitem__(self, run_id: str, data: bytes) -> None:
        self._objects.setdefault(check_run_id(run_id), {})[None] = data

    def __delitem__(self, run_id: str) -> None:
        del self._objects.get(run_id, {})[None]

    def __iter__(self) -> Iterator[str]:
        return iter([run for run, named in self._objects.items() if None in named])

    def __len__(self) -> int:
        return sum(1 for named in self._objects.values() if None in named)


class _Now(Protocol):
    def now(self) -> datetime: ...


class InMemoryBankStore:
    """A BankStore in a dict of runs -> object name -> bytes (None: the legacy key), with
    the stamps beside. Create-only as the persistent stores are. ``keeps_banks=False``
    models a store that keeps none (T20). ``clock``: the store's own clock (anything with
    ``now()``; the system's by default): it times each object's creation (``stored_at``)
    and each listing's ``now``, as S3's ``LastModified`` and ``Date`` do (issue 26)."""

    def __init__(self, *, keeps_banks: bool = True, clock: _Now | None = None) -> None:
        self.keeps_banks = keeps_banks
        self.clock: _Now = clock or SystemClock()
        self.stored: dict[str, dict[str | None, bytes]] = {}
        self.stamps: dict[tuple[str, str], BankStamp] = {}
        #: when the store created each bank object, by its own clock
        self.stored_at: dict[tuple[str, str], datetime] = {}
        self.banks = _LegacyBanks(self.stored)
        self.puts = 0
        self._lock = threading.Lock()

    def put(
        self,
        run_id: str,
        archive: Path,
        *,
        sha256: str,
        stamp: BankStamp | None = None,
        deadline: Deadline | None = None,
    ) -> str:
        check_run_id(run_id)
        if not self.keeps_banks:
            raise BankWriteFailed("this store keeps no bank")
        name = object_name(sha256)
        data = archive.read_bytes()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise BankWriteFailed(f"{archive} is not the archive {sha256} names")
        with self._lock:
            named = self.stored.setdefault(run_id, {})
            created = name not in named
            if created:  # create-only: the same name is the same content
                named[name] = data
                self.stored_at[(run_id, name)] = self.clock.now()
                if stamp is not None:
                    self.stamps[(run_id, name)] = stamp
            self.puts += 1
        return Placed(name, created)

    def only(self, run_id: str) -> bytes | None:
        """The bytes of the run's one object (None: it has none); ValueError when it has
        several. For tests that bank once and read back what was kept."""
        named = self.stored.get(run_id, {})
        if len(named) > 1:
            raise ValueError(f"run {run_id} has {len(named)} bank objects: {sorted(map(str, named))}")
        return next(iter(named.values()), None)

    def bank(self, run_id: str, name: str | None = None) -> bytes | None:
        """The bytes of the named object (None: the legacy key), or None: for tests."""
        return self.stored.get(run_id, {}).get(name if name is None else check_object_name(name))

    def fetch(
        self,
        run_id: str,
        dest: BinaryIO,
        *,
        max_bytes: int,
        name: str | None = None,
        deadline: Deadline | None = None,
    ) -> StoredBank:
        check_run_id(run_id)
        data = self.bank(run_id, name)
        if data is None:
            raise BankGone(f"no bank {name or 'at the legacy key'} for run {run_id}")
        if len(data) > max_bytes:
            raise HostileArchive(f"bank for {run_id} is over {max_bytes} bytes")
        dest.write(data)
        return StoredBank(len(data), hashlib.sha256(data).hexdigest())

    def delete(self, run_id: str, name: str | None = None) -> None:
        check_run_id(run_id)
        with self._lock:
            named = self.stored.get(run_id, {})
            named.pop(name if name is None else check_object_name(name), None)
            if name is not None:
                self.stamps.pop((run_id, name), None)
                self.stored_at.pop((run_id, name), None)
            if not named:
                self.stored.pop(run_id, None)

    def sweep(self, run_id: str) -> None:
        check_run_id(run_id)
        with self._lock:
            self.stored.pop(run_id, None)
            for key in [k for k in self.stamps if k[0] == run_id]:
                del self.stamps[key]
            for key in [k for k in self.stored_at if k[0] == run_id]:
                del self.stored_at[key]

    def stat(self, run_id: str, name: str | None = None) -> StoredBank | None:
        data = self.bank(check_run_id(run_id), name)
        return None if data is None else StoredBank(len(data), hashlib.sha256(data).hexdigest())

    def objects(self, run_id: str, *, named: Collection[str | None] = ()) -> Sequence[StoredObject]:
        check_run_id(run_id)
        with self._lock:
            named = dict(self.stored.get(run_id, {}))
            stamps, stored_at = dict(self.stamps), dict(self.stored_at)
            now = self.clock.now()
        legacy = [StoredObject(None, len(named[None]))] if None in named else []
        return Listing(
            legacy
            + [
                StoredObject(name, len(data), stamps.get((run_id, name)), stored_at.get((run_id, name)))
                for name, data in sorted((n, d) for n, d in named.items() if n is not None)
            ],
            now,
        )


class FakeSandbox:
    """A Sandbox whose scratch is a dict of files; faults are queued per operation.

    ``faults["archive"] = [ExecFailed("blip"), None]`` makes the first archive fail and
    the second succeed; ``races = [("./log",), ()]`` makes the first pass race;
    ``quiesce_report`` is what every quiesce reports (a refusal stops nothing).
    """

    def __init__(
        self,
        files: dict[str, bytes] | None = None,
        *,
        isolated: bool = True,
        host_backed: bool = False,
    ) -> None:
        self.facts = SandboxFacts("/scratch", host_backed, isolated, "fake", "fake")
        self.files = files
        self.faults: dict[str, list[BaseException | None]] = {}
        self.races: list[tuple[str, ...]] = []
        self.stopped = False
        self.quiesce_report = QuiesceReport(True, False, (), 1)
        self.quiesces = 0
        self.continued = 0
        self.archives = 0
        self.gone = False
        self.free_bytes = 1 << 40
        self.staged: dict[str, dict[str, tuple[str, bytes]]] = {}
        self.tree: dict[str, tuple[str, bytes]] | None = None

    def _step(self, op: str) -> None:
        queue = self.faults.get(op)
        if queue:
            fault = queue.pop(0)
            if fault is not None:
                raise fault
        if self.gone:
            raise SandboxGone("the fake sandbox is gone")

    def quiesce(
        self, *, budget_seconds: int, wait_seconds: int, deadline: Deadline | None = None
    ) -> QuiesceReport:
        self._step("quiesce")
        self.quiesces += 1
        self.stopped = self.stopped or not self.quiesce_report.refused
        return self.quiesce_report

    def continue_processes(self, *, deadline: Deadline | None = None) -> None:
        self._step("continue")  # a gone sandbox cannot be continued either, as the real ones
        self.continued += 1
        self.stopped = False

    def archive(
        self, dest: ByteSink, *, compress: bool, verify: bool, deadline: Deadline | None = None
    ) -> ArchiveReport:
        self._step("archive")
        self.archives += 1
        if not self.files:
            return ArchiveReport(empty=True)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz" if compress else "w", format=tarfile.GNU_FORMAT) as tar:
            for folder in ("", *_folders(self.files)):  # directory entries, as tar writes them
                root = tarfile.TarInfo(f"./{folder}".rstrip("/") or ".")
                root.type, root.mode, root.mtime = tarfile.DIRTYPE, 0o755, 1_700_000_000
                tar.addfile(root)
            for name, data in sorted(self.files.items()):
                info = tarfile.TarInfo(f"./{name}")
                info.size, info.mode, info.mtime = len(data), 0o644, 1_700_000_000
                tar.addfile(info, io.BytesIO(data))
        data = buf.getvalue()
        for i in range(0, len(data), 1 << 16):
            dest.write(data[i : i + (1 << 16)])
        raced = self.races.pop(0) if self.races else ()
        return ArchiveReport(False, raced)

    # -- restore: the staged protocol, as the scripted sandboxes do it -----------------------
    def stage_restore(
        self, src: BinaryIO, *, compressed: bool, listing: ByteSink, need_bytes: int = 0
    ) -> StagedRestore:
        """Read ``src`` to its end, extract it into a staged tree (directories, implicit
        parents, hard links as files, symlinks), list it; the scratch is untouched."""
        self._step("restore")
        digest, data = hashlib.md5(usedforsecurity=False), bytearray()  # as restore.sh's md5sum
        while chunk := src.read(1 << 16):
            digest.update(chunk)
            data += chunk
        if need_bytes > self.free_bytes:
            raise RestoreRefused(f"the fake scratch has {self.free_bytes} bytes free, {need_bytes} needed")
        tree = _extract(bytes(data), compressed)
        token = f"staged-{len(self.staged)}-{digest.hexdigest()[:8]}"
        self.staged[token] = tree
        for line in self.staged_lines(tree):
            listing.write(line.encode("ascii") + b"\n")
        return StagedRestore(token, len(data), digest.hexdigest())

    def staged_lines(self, tree: dict[str, tuple[str, bytes]]) -> list[str]:
        """The staged tree's listing, sorted (a test may override it to lose an entry)."""
        return sorted(line_of(p, k, 0 if k == "dir" else len(d)) for p, (k, d) in tree.items())

    def commit_restore(self, staged: StagedRestore, *, dir_modes: Iterable[tuple[str, int]] = ()) -> None:
        """Move the staged tree in (the fake holds no modes: ``dir_modes`` is read, not kept)."""
        for _ in dir_modes:
            pass
        self._step("commit")
        tree = self.staged.pop(staged.token)
        self.tree = tree
        self.files = {path: payload for path, (kind, payload) in tree.items() if kind == "file"}

    def discard_restore(self, staged: StagedRestore) -> None:
        self.staged.pop(staged.token, None)

    def list_scratch(self) -> list[str]:
        if self.tree is not None and self.files == {p: d for p, (k, d) in self.tree.items() if k == "file"}:
            return sorted(line_of(p, k, 0 if k == "dir" else len(d)) for p, (k, d) in self.tree.items())
        files = self.files or {}
        dirs = [line_of(folder, "dir", 0) for folder in _folders(files)]
        return sorted(dirs + [line_of(name, "file", len(data)) for name, data in files.items()])


def _folders(files: dict[str, bytes]) -> list[str]:
    """Every directory the files lie in, parents first (a tar lists them before their files)."""
    found = {"/".join(name.split("/")[:i]) for name in files for i in range(1, name.count("/") + 1)}
    return sorted(found)


def _extract(data: bytes, compressed: bool) -> dict[str, tuple[str, bytes]]:
    """A canonical archive as the fake's tar extracts it: path -> (kind, data or target)."""
    tree: dict[str, tuple[str, bytes]] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz" if compressed else "r:") as tar:
            for member in tar:
                path = "/".join(p for p in member.name.split("/") if p not in ("", "."))
                if not path:
                    continue
                parts = path.split("/")
                for i in range(1, len(parts)):
                    tree.setdefault("/".join(parts[:i]), ("dir", b""))
                tree[path] = _entry(tar, member, tree)
    except (tarfile.TarError, EOFError, OSError, KeyError) as error:
        raise RestoreRefused(f"the fake's tar refused the stream: {error}") from None
    return tree


def _entry(
    tar: tarfile.TarFile, member: tarfile.TarInfo, tree: dict[str, tuple[str, bytes]]
) -> tuple[str, bytes]:
    if member.isdir():
        return "dir", b""
    if member.issym():
        return "symlink", member.linkname.encode("utf-8", "surrogateescape")
    if member.islnk():
        return tree[member.linkname.strip("/")]
    extracted = tar.extractfile(member)
    if not member.isfile() or extracted is None:
        raise RestoreRefused(f"the fake's tar cannot recreate {member.name!r}")
    return "file", extracted.read()
