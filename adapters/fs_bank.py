"""Banks on a filesystem: ``<root>/runs/<id>/scratch-bank.tgz`` (T3).

Writes go to a temporary file in the run's folder, are fsynced, then renamed over the
real name, and the folder is fsynced: a crash leaves the old bank or the new one,
never half of one. Run ids are validated so that none can address a path outside
its own folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

from scratchbank.application.ports import StoredBank
from scratchbank.application.retry import Deadline
from scratchbank.application.streams import CHUNK, TooLarge, copy_hashed
from scratchbank.domain.errors import BankGone, BankReadFailed, BankWriteFailed, HostileArchive
from scratchbank.domain.runs import check_run_id

BANK_NAME = "scratch-bank.tgz"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FilesystemBankStore:
    """Banks as files under ``root`` (a BankStore): ``<root>/runs/<id>/scratch-bank.tgz``.

    ``put`` is atomic (temporary file, fsync, rename, fsync of the folder); ``fetch``
    streams and digests; ``stat`` reads size and SHA-256 without copying; ``sweep``
    removes the run's folder. Run ids that could leave their folder are refused
    (InvalidRunId). The root is created on the first ``put``, never by a read.
    """

    keeps_banks = True

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / check_run_id(run_id)

    def path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / BANK_NAME

    def put(self, run_id: str, archive: Path, *, sha256: str, deadline: Deadline | None = None) -> None:
        """Atomic replace; ``deadline`` is accepted for the port (a local disk has no transport)."""
        folder = self.run_dir(run_id)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".bank-", suffix=".part", dir=folder)
            try:
                with os.fdopen(fd, "wb") as out, open(archive, "rb") as src:
                    shutil.copyfileobj(src, out, CHUNK)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, folder / BANK_NAME)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            _fsync_dir(folder)
        except OSError as error:
            raise BankWriteFailed(f"filesystem bank for {run_id}: {error}") from error

    def fetch(
        self, run_id: str, dest: BinaryIO, *, max_bytes: int, deadline: Deadline | None = None
    ) -> StoredBank:
        path = self.path(run_id)
        try:
            with open(path, "rb") as src:
                size, digest = copy_hashed(src.read, dest.write, limit=max_bytes)
        except FileNotFoundError:
            raise BankGone(f"no bank for run {run_id} at {path}") from None
        except TooLarge:
            raise HostileArchive(f"bank for {run_id} is over {max_bytes} bytes") from None
        except OSError as error:
            raise BankReadFailed(f"reading {path}: {error}") from error
        return StoredBank(size, digest)

    def delete(self, run_id: str) -> None:
        try:
            self.path(run_id).unlink(missing_ok=True)
        except OSError as error:
            raise BankWriteFailed(f"deleting the bank of {run_id}: {error}") from error

    def sweep(self, run_id: str) -> None:
        try:
            shutil.rmtree(self.run_dir(run_id), ignore_errors=False)
        except FileNotFoundError:
            return
        except OSError as error:
            raise BankWriteFailed(f"sweeping {run_id}: {error}") from error

    def stat(self, run_id: str) -> StoredBank | None:
        """Size and SHA-256 of the run's bank file; None when there is none."""
        path = self.path(run_id)
        try:
            with open(path, "rb") as src:
                size, digest = copy_hashed(src.read, lambda _chunk: 0, limit=None)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise BankReadFailed(f"reading {path}: {error}") from error
        return StoredBank(size, digest)
