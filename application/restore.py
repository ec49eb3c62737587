"""The restore (X1-X6): bring a bank back safely, into a sandbox or a host directory.

The bank is fetched to a host file, checked against the size and digest its teardown
recorded (an expectation kept outside the archive), parsed on the allow-list and
re-serialised as a canonical archive; only that canonical archive is streamed into the
sandbox, which extracts it into a fresh directory and moves it into place. The
restored tree is then compared with the manifest: a partial restore is refused by
name, never handed to the first node.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import attrs

from scratchbank.domain.errors import (
    BankGone,
    BankMismatch,
    BankReadFailed,
    ExecFailed,
    HostileArchive,
    RestoreRefused,
    SandboxGone,
    StreamBroken,
)
from scratchbank.domain.fold import Bank
from scratchbank.domain.restore import RestoreAttempt, RestoreResult
from scratchbank.domain.resume_gate import ResumeDecision
from scratchbank.domain.teardown import CAP_BYTES

from .ports import BankStore, Sandbox
from .tarstream import CanonicalWriter, GzipReader, Limits, Manifest, TarReader, manifest_lines

Progress = Callable[[str, int, int], None]


@attrs.frozen
class Checked:
    """A bank that passed the host check: its canonical form and its tree."""

    path: Path
    bytes: int
    sha256: str
    manifest: list[str]


def check_on_host(bank: Bank, fetched: Path, work: Path, *, limits: Limits, cap: int = CAP_BYTES) -> Checked:
    """Size and digest as recorded, then the allow-list; write the canonical archive (X2)."""
    rec = bank.record
    size = fetched.stat().st_size
    if size > cap:
        raise HostileArchive(f"the bank is {size} bytes, over the cap")
    if size != rec.bytes:
        raise BankMismatch(f"the stored bank is {size} bytes; its record says {rec.bytes}")
    canonical = work / "canonical.tar"
    with open(canonical, "wb") as out:
        writer = CanonicalWriter(out)
        reader = TarReader(limits, on_member=writer.member, on_data=writer.data)
        gunzip = GzipReader(reader.feed, limits.uncompressed_bytes)
        digest = _feed_file(fetched, gunzip.feed)
        if rec.sha256 and digest != rec.sha256:
            raise BankMismatch("the stored bank's SHA-256 is not the one its record names")
        gunzip.close()
        reader.close()
        sha = writer.finish()
    manifest = Manifest.of(reader.members)
    if rec.manifest_sha256 and manifest.sha256 != rec.manifest_sha256:
        raise BankMismatch("the bank's members are not the ones recorded at teardown")
    return Checked(canonical, writer.bytes, sha, manifest_lines(reader.members))


def _feed_file(path: Path, feed: Callable[[bytes], None]) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            feed(chunk)
    return digest.hexdigest()


def _into_host_directory(checked: Checked, target: Path) -> None:
    """X6: extract the canonical archive into a host directory, via a fresh sibling."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=".scratchbank-restore-", dir=target.parent))
    try:
        with tarfile.open(checked.path, "r:") as tar:
            tar.extractall(fresh, filter="data")
        if target.exists():
            shutil.rmtree(target)
        fresh.rename(target)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise


def restore_bank(
    run_id: str,
    decision: ResumeDecision,
    *,
    store: BankStore,
    sandbox: Sandbox | None,
    host_directory: Path | None = None,
    cap: int = CAP_BYTES,
    progress: Progress | None = None,
) -> RestoreAttempt:
    """Try to restore the decision's bank; say what happened as a RestoreAttempt (X1-X6)."""
    assert decision.bank is not None
    if sandbox is None and host_directory is None:
        return RestoreAttempt(RestoreResult.NO_SANDBOX, detail="the resume runs without a sandbox")
    work = Path(tempfile.mkdtemp(prefix="scratchbank-restore-"))
    try:
        fetched = work / "bank.tgz"
        try:
            with open(fetched, "wb") as out:
                got = store.fetch(run_id, out, max_bytes=cap)
        except BankGone as error:
            return RestoreAttempt(RestoreResult.GONE, detail=error.message)
        except BankReadFailed as error:
            return RestoreAttempt(RestoreResult.READ_FAILED, detail=error.message)
        except HostileArchive as error:
            return RestoreAttempt(RestoreResult.REFUSED_ON_HOST, detail=error.message)
        if progress:
            progress("fetched", got.bytes, got.bytes)
        limits = Limits(host_directory=host_directory is not None)
        try:
            checked = check_on_host(decision.bank, fetched, work, limits=limits, cap=cap)
        except (HostileArchive, BankMismatch) as error:
            return RestoreAttempt(RestoreResult.REFUSED_ON_HOST, detail=f"{error.code}: {error.message}")
        if progress:
            progress("checked", checked.bytes, checked.bytes)
        if host_directory is not None:
            _into_host_directory(checked, host_directory)
            return RestoreAttempt(RestoreResult.RESTORED, got.bytes, into_host_dir=True)
        assert sandbox is not None
        return _into_sandbox(sandbox, checked, got.bytes, progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _Counted:
    """A file reader that reports progress every 8 MiB (for long transfers)."""

    def __init__(self, src: BinaryIO, total: int, progress: Progress | None) -> None:
        self.src, self.total, self.progress, self.done, self._next = src, total, progress, 0, 8 << 20

    def read(self, n: int = -1) -> bytes:
        data = self.src.read(n)
        self.done += len(data)
        if self.progress and (self.done >= self._next or self.done == self.total):
            self.progress("streamed into the sandbox", self.done, self.total)
            self._next += 8 << 20
        return data


def _into_sandbox(
    sandbox: Sandbox, checked: Checked, banked_bytes: int, progress: Progress | None = None
) -> RestoreAttempt:
    try:
        with open(checked.path, "rb") as raw:
            src = _Counted(raw, checked.bytes, progress)
            sandbox.restore(src, size=checked.bytes, sha256=checked.sha256, compressed=False)  # type: ignore[arg-type]
        restored = sandbox.list_scratch()
    except RestoreRefused as error:
        return RestoreAttempt(RestoreResult.REFUSED_IN_SANDBOX, detail=error.message)
    except (StreamBroken, ExecFailed, SandboxGone) as error:
        return RestoreAttempt(RestoreResult.STREAM_BROKEN, detail=error.message)
    if restored != checked.manifest:
        missing = len(set(checked.manifest) - set(restored))
        extra = len(set(restored) - set(checked.manifest))
        why = f"partial restore: {missing} expected entries missing or different, {extra} unexpected"
        return RestoreAttempt(RestoreResult.REFUSED_IN_SANDBOX, detail=why)
    return RestoreAttempt(RestoreResult.RESTORED, banked_bytes)
