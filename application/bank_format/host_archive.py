"""The bank as it arrives on the host: compressed, hashed, written and checked as it streams.

The sandbox streams a tar (or a tar.gz) into this sink. Its ``write`` only gathers the
bytes into 1 MiB batches and hands each batch to two lanes, each a thread of its own
behind a short bounded queue, so neither holds the transport up (an archive under one
batch is worked at ``finish``, in the caller's thread: no thread for a small bank):

- the store lane compresses the batch when it came raw (ISA-L or zlib, see
  gzip_codec), hashes what will be stored (SHA-256) and writes it to a host temporary
  file; past the cap it stops writing and only counts (T2, T20);
- the check lane parses it on the allow-list for the manifest (reader.py, gunzip.py), gunzipping
  it first when the sandbox compressed it.

Compression, hashing and file writes release the GIL, so on two cores the store lane
runs beside the parse and the transport (ADR 0003). Memory is bounded by the queues
(``DEPTH`` batches per lane), not by the archive's size. ``write`` never raises: a
transport must drain the stream whatever happens here, so a lane that fails keeps
draining and ``finish`` names the failure (HostArchiveFailed).
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import attrs

from scratchbank.domain.errors import HostArchiveFailed, HostileArchive

from ..ports import Compressor
from .gunzip import GzipReader
from .gzip_codec import GzipCodec, choose_codec
from .reader import Limits, TarReader
from .spill_log import Manifest

BATCH = 1 << 20
DEPTH = 4


@attrs.frozen
class ArchiveFacts:
    path: Path
    bytes: int
    sha256: str
    manifest: Manifest | None
    refused: str = ""  # why the host refused the archive, if it did


class Lane:
    """A worker thread fed batches through a bounded queue; it keeps the first error.

    The thread starts with the first batch ``put``: an archive that fits in one batch never
    needs it (``finish`` hands that batch to ``do``, in the caller's thread: a small bank
    costs no thread). After an error it goes on draining (so a producer never blocks on it)
    but does no more work. ``close`` waits for every batch queued before it.
    """

    def __init__(self, name: str, work: Callable[[bytes], None]) -> None:
        self._name = name
        self._work = work
        self._queue: queue.Queue[bytes | None] = queue.Queue(DEPTH)  # its thread's inbox
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def put(self, batch: bytes) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._queue.put(batch)

    def do(self, batch: bytes) -> None:
        """The batch's work in the caller's thread (the lane's thread never started)."""
        if self.error is None:
            try:
                self._work(batch)
            except BaseException as error:  # kept for finish(), as the thread keeps it
                self.error = error

    def _run(self) -> None:
        while (batch := self._queue.get()) is not None:
            self.do(batch)

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


class StoreLane:
    """Compress (when raw), hash and write to the host file; count past the cap (T2, T20)."""

    def __init__(self, path: Path, compressor: Compressor | None, cap: int) -> None:
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._compressor = compressor
        self._digest = hashlib.sha256()
        self._cap = cap
        self.bytes = 0

    def work(self, batch: bytes) -> None:
        self._store(self._compressor.compress(batch) if self._compressor else batch)

    def _store(self, data: bytes) -> None:
        if not data:
            return
        self.bytes += len(data)
        self._digest.update(data)
        if self.bytes <= self._cap:
            self._file.write(data)

    def end(self) -> str:
        """Flush the gzip trailer and the file; return the SHA-256 of what was stored."""
        if self._compressor is not None:
            self._store(self._compressor.flush())
        self._file.close()
        return self._digest.hexdigest()

    def close(self) -> None:
        self._file.close()


class CheckLane:
    """Parse the tar on the allow-list (gunzipping it first when it came compressed)."""

    def __init__(self, limits: Limits, gzipped_input: bool) -> None:
        self.reader = TarReader(limits)
        self._gunzip = GzipReader(self.reader.feed, limits.uncompressed_bytes) if gzipped_input else None
        self.refused = ""

    def work(self, batch: bytes) -> None:
        if self.refused:
            return
        try:
            (self._gunzip.feed if self._gunzip else self.reader.feed)(batch)
        except HostileArchive as error:
            self.refused = error.message
        except Exception as error:  # an archive the host cannot even parse is refused, never trusted
            self.refused = f"bank refused on the host: the check failed ({type(error).__name__}: {error})"

    def end(self) -> Manifest | None:
        """Check the stream ended where an archive ends; the manifest, or None if refused."""
        if not self.refused:
            try:
                if self._gunzip is not None:
                    self._gunzip.close()
                self.reader.close()
            except HostileArchive as error:
                self.refused = error.message
        manifest = None if self.refused else Manifest.of(self.reader.members)
        self.release()
        return manifest

    def release(self) -> None:
        """Let go of the members the reader kept (an on-disk log, once the reader keeps one)."""
        log = getattr(self.reader, "log", None)
        if log is not None:
            log.close()


class HostArchive:
    """A write-only file object for ``Sandbox.archive``: see the module's docstring."""

    def __init__(
        self,
        path: Path,
        *,
        gzipped_input: bool,
        gzip_level: int,
        cap: int,
        limits: Limits = Limits(),
        codec: GzipCodec | None = None,
    ) -> None:
        self.path = path
        compressor = None if gzipped_input else (codec or choose_codec(gzip_level)).open()
        self._store = StoreLane(path, compressor, cap)
        self._check = CheckLane(limits, gzipped_input)
        self._lanes = (Lane("bank-store", self._store.work), Lane("bank-check", self._check.work))
        self._pending: list[bytes] = []  # joined once per batch: one copy, not one per write
        self._pending_bytes = 0
        self._closed = False

    def write(self, data: bytes) -> int:
        self._pending.append(bytes(data))
        self._pending_bytes += len(data)
        if self._pending_bytes >= BATCH:
            self._send()
        return len(data)

    def _send(self, *, here: bool = False) -> None:
        """The pending bytes as one batch to both lanes (``here``: worked in this thread)."""
        batch = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending, self._pending_bytes = [], 0
        for lane in self._lanes:
            (lane.do if here else lane.put)(batch)

    def finish(self) -> ArchiveFacts:
        """Wait for both lanes; raise HostArchiveFailed if the host could not keep the bank."""
        if self._pending:  # the whole archive, when under one batch: no lane thread started
            self._send(here=not self._lanes[0].started)
        self._stop_lanes()
        try:
            failed = next((lane.error for lane in self._lanes if lane.error is not None), None)
            if failed is not None:
                raise failed
            sha256 = self._store.end()
        except Exception as error:
            self._store.close()
            self._check.release()
            raise HostArchiveFailed(f"the host could not keep the archive at {self.path}: {error}") from error
        manifest = self._check.end()
        return ArchiveFacts(self.path, self._store.bytes, sha256, manifest, self._check.refused)

    def _stop_lanes(self) -> None:
        if not self._closed:
            self._closed = True
            for lane in self._lanes:
                lane.close()

    def close(self) -> None:
        """Stop the lanes and close the file without a verdict (the archive was cut short)."""
        self._stop_lanes()
        self._store.close()
        self._check.release()
