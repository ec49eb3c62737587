"""The bank as it arrives on the host: one pass writes, hashes and inspects it.

The sandbox streams a tar (or a tar.gz) into this sink. In the same pass it is
compressed when it came raw, written to a host temporary file, hashed (SHA-256 of
the bytes that will be stored), and parsed on the allow-list for its manifest. Past
the cap it stops writing and only counts (T2, T20). Nothing here holds more than a
chunk in memory.
"""

from __future__ import annotations

import hashlib
import zlib
from pathlib import Path
from typing import BinaryIO

import attrs

from scratchbank.domain.errors import HostileArchive

from .tarstream import GzipReader, Limits, Manifest, TarReader


@attrs.frozen
class ArchiveFacts:
    path: Path
    bytes: int
    sha256: str
    manifest: Manifest | None
    refused: str = ""  # why the host refused the archive, if it did


class HostArchive:
    """A write-only file object for ``Sandbox.archive``."""

    def __init__(
        self, path: Path, *, gzipped_input: bool, gzip_level: int, cap: int, limits: Limits = Limits()
    ) -> None:
        self.path = path
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed by finish/close
        self._digest = hashlib.sha256()
        self._bytes = 0
        self._cap = cap
        self._reader = TarReader(limits)
        self._refused = ""
        self._gunzip = GzipReader(self._parse, limits.uncompressed_bytes) if gzipped_input else None
        self._gzip = None if gzipped_input else zlib.compressobj(gzip_level, zlib.DEFLATED, 31)

    def _parse(self, data: bytes) -> None:
        if not self._refused:
            try:
                self._reader.feed(data)
            except HostileArchive as error:
                self._refused = error.message

    def _store(self, data: bytes) -> None:
        if not data:
            return
        self._bytes += len(data)
        self._digest.update(data)
        if self._bytes <= self._cap:
            self._file.write(data)

    def write(self, data: bytes) -> int:
        if self._gunzip is not None:
            self._store(data)
            if not self._refused:
                try:
                    self._gunzip.feed(data)
                except HostileArchive as error:
                    self._refused = error.message
        else:
            self._parse(data)
            assert self._gzip is not None
            self._store(self._gzip.compress(data))
        return len(data)

    def finish(self) -> ArchiveFacts:
        if self._gzip is not None:
            self._store(self._gzip.flush())
        self._file.close()
        if not self._refused:
            try:
                if self._gunzip is not None:
                    self._gunzip.close()
                self._reader.close()
            except HostileArchive as error:
                self._refused = error.message
        manifest = None if self._refused else Manifest.of(self._reader.members)
        return ArchiveFacts(self.path, self._bytes, self._digest.hexdigest(), manifest, self._refused)

    def close(self) -> None:
        self._file.close()
