"""The host's check of a fetched bank, as a sink the store streams into (X2, ADR 0002).

One pass: count and hash the stored bytes (against the size and SHA-256 its teardown
recorded, an expectation kept outside the archive), gunzip and parse them on the
allow-list, and hand every accepted member to a consumer (a canonical writer, or a
host-directory tree writer). ``finish`` gives the verdict once the stream has ended:
it raises BankMismatch or HostileArchive, or returns the bank's manifest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from scratchbank.domain.errors import BankMismatch, HostileArchive
from scratchbank.domain.records import ScratchBanked

from ..ports import Progress
from .gunzip import GzipReader
from .members import Member
from .reader import Limits, TarReader
from .spill_log import Manifest, MemberLog

_EVERY = 8 << 20


class BankCheck:
    """A write-only file object for ``BankStore.fetch``."""

    def __init__(
        self,
        record: ScratchBanked,
        *,
        limits: Limits,
        cap: int,
        on_member: Callable[[Member], None] | None = None,
        on_data: Callable[[bytes], None] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.record = record
        self.cap = cap
        self.reader = TarReader(limits, on_member=on_member, on_data=on_data)
        self._gunzip = GzipReader(self.reader.feed, limits.uncompressed_bytes)
        self._digest = hashlib.sha256()
        self.bytes = 0
        self._progress = progress
        self._next = _EVERY

    @property
    def log(self) -> MemberLog:
        return self.reader.log

    def write(self, data: bytes) -> int:
        self.bytes += len(data)
        if self.bytes > self.cap:
            raise HostileArchive(f"the bank is over the cap ({self.cap} bytes)")
        if self.bytes > self.record.bytes:
            raise BankMismatch(f"the stored bank is longer than the {self.record.bytes} bytes recorded")
        self._digest.update(data)
        self._gunzip.feed(data)
        if self._progress is not None and self.bytes >= self._next:
            self._progress("fetched and checked", self.bytes, self.record.bytes)
            self._next += _EVERY
        return len(data)

    def finish(self) -> Manifest:
        """The verdict on the whole stream: the manifest, or a named refusal."""
        rec = self.record
        if self.bytes != rec.bytes:
            raise BankMismatch(f"the stored bank is {self.bytes} bytes; its record says {rec.bytes}")
        if rec.sha256 and self._digest.hexdigest() != rec.sha256:
            raise BankMismatch("the stored bank's SHA-256 is not the one its record names")
        self._gunzip.close()
        self.reader.close()
        manifest = self.reader.log.manifest()
        if rec.manifest_sha256 and manifest.sha256 != rec.manifest_sha256:
            raise BankMismatch("the bank's members are not the ones recorded at teardown")
        if self._progress is not None:
            self._progress("fetched and checked", self.bytes, rec.bytes)
        return manifest

    def close(self) -> None:
        self.reader.log.close()
