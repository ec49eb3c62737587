"""Banks on a filesystem, as content-named, create-only objects (A17, ADR 0006).

Layout beneath ``<root>/runs/<id>/``: ``banks/<sha256>.tgz`` (the object) and
``banks/<sha256>.tgz.stamp`` (its stamp, JSON). The legacy fixed key
``scratch-bank.tgz`` (T3, before ADR 0006) is still read, and deleted once no record
needs it.

A put copies the archive (hashing it on the way) to a temporary ``.put-*.part`` in the
run's ``banks/`` folder and fsyncs it, writes the stamp, then hard-links the temporary
file to the object's name: the link fails when the name exists, so nothing is ever
replaced; an existing name is the same content (idempotent). The folder is fsynced. A
crash leaves at most a temporary file, which ``delete`` and ``sweep`` remove. Run ids
and object names are validated so that none can address a path outside its run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from scratchbank.application.cancellation import Deadline
from scratchbank.application.ports import Placed, StoredBank
from scratchbank.application.streams import CHUNK, TooLarge, copy_hashed
from scratchbank.domain.errors import (
    BankGone,
    BankReadFailed,
    BankWriteFailed,
    HostileArchive,
    InvalidBankObject,
)
from scratchbank.domain.objects import (
    BankStamp,
    Listing,
    StoredObject,
    check_object_name,
    object_name,
    stamp_fields,
    stamp_of,
)
from scratchbank.domain.runs import check_run_id

#: The legacy fixed key (T3), read for records that name no object.
BANK_NAME = "scratch-bank.tgz"
BANKS = "banks"
STAMP = ".stamp"
#: Temporary files of puts: in the run's banks folder (new) and the run's folder (legacy).
TEMP_GLOBS = ((BANKS, ".put-*.part"), ("", ".bank-*.part"))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FilesystemBankStore:
    """Banks as files under ``root`` (a BankStore): ``<root>/runs/<id>/banks/<sha256>.tgz``.

    ``put`` is create-only (temporary file, fsync, stamp, hard link, fsync of the folder);
    ``fetch`` streams and digests; ``stat`` reads size and SHA-256 without copying;
    ``objects`` lists the run's objects with their stamps; ``sweep`` removes the run's
    folder. Run ids and names that could leave their folder are refused (InvalidRunId,
    InvalidBankObject). The root is created on the first ``put``, never by a read.
    """

    keeps_banks = True

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / check_run_id(run_id)

    def path(self, run_id: str, name: str | None = None) -> Path:
        """The file holding the named object (None: the legacy key)."""
        if name is None:
            return self.run_dir(run_id) / BANK_NAME
        return self.run_dir(run_id) / check_object_name(name)

    def put(
        self,
        run_id: str,
        archive: Path,
        *,
        sha256: str,
        stamp: BankStamp | None = None,
        deadline: Deadline | None = None,
    ) -> str:
        """Create-only; ``deadline`` is accepted for the port (a local disk has no transport)."""
        name = object_name(sha256)
        final = self.path(run_id, name)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            created = not final.exists() and self._create(final, archive, sha256, stamp)
        except OSError as error:
            raise BankWriteFailed(f"filesystem bank {name} for {run_id}: {error}") from error
        return Placed(name, created)

    def _create(self, final: Path, archive: Path, sha256: str, stamp: BankStamp | None) -> bool:
        """True when this put's link created the object (False: another put's had)."""
        folder = final.parent
        fd, tmp = tempfile.mkstemp(prefix=".put-", suffix=".part", dir=folder)
        try:
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out, open(archive, "rb") as src:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if digest.hexdigest() != sha256:
                raise BankWriteFailed(f"{archive} is not the archive {sha256} names (it changed on the host)")
            if stamp is not None:
                _write_stamp(final, stamp)
            # create-only: never replaces an object; an existing name is the same content
            # (another put created it first)
            try:
                os.link(tmp, final)
                created = True
            except FileExistsError:
                created = False
        finally:
            Path(tmp).unlink(missing_ok=True)
        _fsync_dir(folder)
        return created

    def fetch(
        self,
        run_id: str,
        dest: BinaryIO,
        *,
        max_bytes: int,
        name: str | None = None,
        deadline: Deadline | None = None,
    ) -> StoredBank:
        path = self.path(run_id, name)
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

    def delete(self, run_id: str, name: str | None = None) -> None:
        """Remove one object and its stamp, and every dead put's temporary file of the run."""
        path = self.path(run_id, name)
        try:
            path.unlink(missing_ok=True)
            if name is not None:
                Path(f"{path}{STAMP}").unlink(missing_ok=True)
            self._remove_temporaries(run_id)
        except OSError as error:
            raise BankWriteFailed(f"deleting the bank {name or BANK_NAME} of {run_id}: {error}") from error

    def _remove_temporaries(self, run_id: str) -> None:
        """A put whose process died leaves its temporary file; a live one loses it and
        fails its link (BankWriteFailed: tried again, T10)."""
        folder = self.run_dir(run_id)
        for sub, pattern in TEMP_GLOBS:
            for temp in (folder / sub).glob(pattern) if (folder / sub).is_dir() else ():
                temp.unlink(missing_ok=True)

    def sweep(self, run_id: str) -> None:
        try:
            shutil.rmtree(self.run_dir(run_id), ignore_errors=False)
        except FileNotFoundError:
            return
        except OSError as error:
            raise BankWriteFailed(f"sweeping {run_id}: {error}") from error

    def stat(self, run_id: str, name: str | None = None) -> StoredBank | None:
        """Size and SHA-256 of the named object; None when there is none."""
        path = self.path(run_id, name)
        try:
            with open(path, "rb") as src:
                size, digest = copy_hashed(src.read, lambda _chunk: 0, limit=None)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise BankReadFailed(f"reading {path}: {error}") from error
        return StoredBank(size, digest)

    def objects(self, run_id: str, *, named: Collection[str | None] = ()) -> Sequence[StoredObject]:
        """The run's objects with their stamps (the legacy key first, with none); a
        local stamp costs no round trip, so ``named`` ones come with theirs too. Times
        are the filesystem's (issue 26): each object's mtime (set as its bytes were
        written, before the link; a later same-content put leaves it), and the listing's
        ``now`` the mtime of a fresh file made at the store's root (``_now``: never in the
        run's folder, which a ``sweep`` may be removing: a file made there mid-sweep failed it)."""
        folder = self.run_dir(run_id)
        found: list[StoredObject] = []
        now = None
        try:
            legacy = folder / BANK_NAME
            if legacy.is_file():
                found.append(StoredObject(None, legacy.stat().st_size))
            banks = folder / BANKS
            if banks.is_dir():
                now = _now(self.root)
            for path in sorted(banks.glob("*.tgz")) if banks.is_dir() else ():
                name = f"{BANKS}/{path.name}"
                try:
                    check_object_name(name)
                except InvalidBankObject:
                    continue  # not a bank object (nothing we wrote): never listed, never deleted
                info = path.stat()
                found.append(StoredObject(name, info.st_size, _read_stamp(path), _mtime(info)))
        except FileNotFoundError:
            return Listing(found, now)
        except OSError as error:
            raise BankReadFailed(f"listing {folder}: {error}") from error
        return Listing(found, now)


def _mtime(info: os.stat_result) -> datetime | None:
    """The mtime as a time; None past what a datetime holds (a filesystem with 64-bit
    times, an mtime set by hand: an object of unknown age, never a raw ValueError)."""
    try:
        return datetime.fromtimestamp(info.st_mtime_ns / 1e9, UTC)
    except (ValueError, OverflowError, OSError):
        return None


def _now(folder: Path) -> datetime | None:
    """The filesystem's time now: the mtime it gives a file made in ``folder`` (the
    objects' own clock: a shared mount's server, not this process), removed at once (one
    left by a crash is three bytes at the root, named as a put's temporary file).
    None when no file can be made there (a read-only mount: no object gets an age)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".put-now-", suffix=".part", dir=folder)
    except OSError:
        return None
    try:
        os.write(fd, b"now")
        return _mtime(os.fstat(fd))
    except OSError:
        return None
    finally:
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)


def _write_stamp(final: Path, stamp: BankStamp) -> None:
    """The stamp beside the object, in place before the object is linked (ADR 0006)."""
    target = Path(f"{final}{STAMP}")
    fd, tmp = tempfile.mkstemp(prefix=".put-", suffix=".part", dir=final.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(stamp_fields(stamp), out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, target)
        except FileExistsError:
            if not final.exists():  # a dead put's stamp of the same content: ours is as good
                os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _read_stamp(path: Path) -> BankStamp | None:
    try:
        fields = json.loads(Path(f"{path}{STAMP}").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(fields, dict) or not all(isinstance(v, str) for v in fields.values()):
        return None
    return stamp_of(fields)
