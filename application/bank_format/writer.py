"""The canonical writer: accepted members written back out as a plain PAX archive.

The only bytes a sandbox ever extracts are these: headers built from the validated
members (header_encoder.py), no owners, no setid bits, gzip optional (ISA-L's at
levels 0-3, as a bank is written: gzip_codec.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import BinaryIO

from .gzip_codec import choose_codec
from .header_encoder import header_of
from .members import DIR, FILE, Member
from .spill_log import MemberLog
from .tar_header import BLOCK


class CanonicalWriter:
    """Writes accepted members back out as a plain PAX archive (gzip optional).

    Every header is built from the validated member (normalised path, kind, size,
    mode without setid bits, mtime in range, owners 0 and unnamed); no raw field of
    the bank is ever copied.
    """

    def __init__(
        self,
        out: BinaryIO,
        *,
        gzip_level: int | None = None,
        writable_dirs: bool = False,
        digest: bool = True,
    ) -> None:
        """``digest``: take the SHA-256 of every byte written (False: ``finish`` returns
        "", for a stream whose framing digests the same bytes already: issue 24)."""
        self._out = out
        self._writable_dirs = writable_dirs
        self._z = choose_codec(gzip_level).open() if gzip_level is not None else None
        self._pending = 0
        self.bytes = 0
        self.tar_bytes = 0
        self._digest = hashlib.sha256() if digest else None

    def _write(self, data: bytes) -> None:
        self.tar_bytes += len(data)
        if self._z is not None:
            data = self._z.compress(data)
        self._emit(data)

    def _emit(self, data: bytes) -> None:
        """Bytes as they leave (compressed when the stream is): written, counted, digested."""
        if data:
            self._out.write(data)
            self.bytes += len(data)
            if self._digest is not None:
                self._digest.update(data)

    def member(self, m: Member) -> None:
        """Write a member's header; with ``writable_dirs`` a directory is written u+rwx
        (its banked mode is applied after extraction: ``dir_modes``)."""
        header = header_of(m, m.mode | 0o700) if self._writable_dirs and m.type == DIR else header_of(m)
        if self._pending:  # the previous member's padding and this header: one write
            header = bytes(self._pending) + header
            self._pending = 0
        self._write(header)
        self._pending = (-m.size) % BLOCK if m.type == FILE else 0

    def data(self, chunk: bytes) -> None:
        self._write(chunk)

    def _pad(self) -> None:
        if self._pending:
            self._write(b"\x00" * self._pending)
            self._pending = 0

    def finish(self) -> str:
        """End the archive; return the SHA-256 of every byte written ("" unless ``digest``)."""
        self._pad()
        self._write(b"\x00" * (2 * BLOCK))
        if self._z is not None:
            self._emit(self._z.flush())
        return self._digest.hexdigest() if self._digest is not None else ""


def dir_modes(log: MemberLog) -> Iterator[tuple[str, int]]:
    """The directories whose banked mode is not u+rwx, deepest first (the root last, as
    ""): a non-root tar (BusyBox's) cannot fill a 0555 directory it has just made, so a
    sandbox stream writes directories u+rwx and these modes are applied after."""
    for d in log.members_of(DIR, deepest_first=True):
        if d.mode & 0o700 != 0o700:
            yield d.path, d.mode & 0o777
