"""In-memory adapters: real implementations of the ports, for tests and for engines' tests.

They pass the same contract suites as the persistent adapters, so an engine team
can test its integration against them and trust the behaviour carries over.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from scratchbank.application.ports import (
    ArchiveReport,
    ByteSink,
    QuiesceReport,
    SandboxFacts,
    StoredBank,
)
from scratchbank.application.retry import Deadline
from scratchbank.domain.errors import (
    BankGone,
    BankWriteFailed,
    HostileArchive,
    SandboxGone,
    StreamBroken,
    TimelineConflict,
)
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


class InMemoryBankStore:
    """A BankStore in a dict. ``keeps_banks=False`` models a store that keeps none (T20)."""

    def __init__(self, *, keeps_banks: bool = True) -> None:
        self.keeps_banks = keeps_banks
        self.banks: dict[str, bytes] = {}
        self.puts = 0

    def put(self, run_id: str, archive: Path, *, sha256: str, deadline: Deadline | None = None) -> None:
        check_run_id(run_id)
        if not self.keeps_banks:
            raise BankWriteFailed("this store keeps no bank")
        self.banks[run_id] = archive.read_bytes()
        self.puts += 1

    def fetch(
        self, run_id: str, dest: BinaryIO, *, max_bytes: int, deadline: Deadline | None = None
    ) -> StoredBank:
        check_run_id(run_id)
        data = self.banks.get(run_id)
        if data is None:
            raise BankGone(f"no bank for run {run_id}")
        if len(data) > max_bytes:
            raise HostileArchive(f"bank for {run_id} is over {max_bytes} bytes")
        dest.write(data)
        return StoredBank(len(data), hashlib.sha256(data).hexdigest())

    def delete(self, run_id: str) -> None:
        self.banks.pop(check_run_id(run_id), None)

    def sweep(self, run_id: str) -> None:
        self.delete(run_id)


class FakeSandbox:
    """A Sandbox whose scratch is a dict of files; faults are queued per operation.

    ``faults["archive"] = [ExecFailed("blip"), None]`` makes the first archive fail and
    the second succeed; ``races = [("./log",), ()]`` makes the first pass race.
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
        self.quiesces = 0
        self.continued = 0
        self.archives = 0
        self.gone = False

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
        self.stopped = True
        return QuiesceReport(True, False, (), 1)

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

    def restore(self, src: BinaryIO, *, size: int, sha256: str, compressed: bool) -> None:
        self._step("restore")
        data = src.read(size)
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
            raise StreamBroken("the fake restore stream broke")
        files: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz" if compressed else "r:") as tar:
            for member in tar:
                if member.isfile():
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    files[member.name.removeprefix("./")] = extracted.read()
        self.files = files

    def list_scratch(self) -> list[str]:
        files = self.files or {}
        dirs = [json.dumps([folder, "dir", 0]) for folder in _folders(files)]
        return sorted(dirs + [json.dumps([name, "file", len(data)]) for name, data in files.items()])


def _folders(files: dict[str, bytes]) -> list[str]:
    """Every directory the files lie in, parents first (a tar lists them before their files)."""
    found = {"/".join(name.split("/")[:i]) for name in files for i in range(1, name.count("/") + 1)}
    return sorted(found)
