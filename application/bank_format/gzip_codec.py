"""The gzip compressor a bank is written with: ISA-L's (a core dependency), else zlib's
where isal does not import.

Both write the same format (one gzip member, RFC 1952), so any tar or gunzip opens a
bank whichever wrote it. ISA-L (the ``isal`` package, a core dependency) compresses
6x faster than zlib at level 1 for a few tenths of a per cent more bytes (ADR 0003).
It knows levels 0-3 only: a higher level asks for zlib's better ratio, so it gets zlib.
Both release the GIL while they work, so compression overlaps the stream's other lanes.
"""

from __future__ import annotations

import zlib
from types import ModuleType

import attrs

from ..ports import Compressor

ISAL_MAX_LEVEL = 3


def _isal() -> ModuleType | None:
    try:
        from isal import isal_zlib
    except ImportError:
        return None
    return isal_zlib


@attrs.frozen
class GzipCodec:
    """Which library compresses at which level; ``open`` starts one gzip stream."""

    library: str  # "isal" or "zlib"
    level: int

    def open(self) -> Compressor:
        module = _isal() if self.library == "isal" else zlib
        assert module is not None, "GzipCodec('isal') chosen without isal installed"
        compressor: Compressor = module.compressobj(self.level, zlib.DEFLATED, 31)
        return compressor


def choose_codec(level: int, *, prefer_isal: bool = True) -> GzipCodec:
    """ISA-L for levels 0-3 when it is installed, zlib otherwise (same bytes format)."""
    if prefer_isal and level <= ISAL_MAX_LEVEL and _isal() is not None:
        return GzipCodec("isal", level)
    return GzipCodec("zlib", level)
