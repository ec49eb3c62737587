"""The gunzip in front of the tar reader: a bank's gzip stream inflated in bounded memory.

A gzip member is inflated chunk by chunk into the TarReader; a failure while inflating
is a named refusal (UnreadableArchive), as the reader's own are. ISA-L's inflate (the
``isal`` core dependency, ~2x zlib's speed on the host's producer lane) when it imports,
else zlib's: the same stream calls (``decompress(data, max_length)``, ``unconsumed_tail``,
``unused_data``, ``eof``) and the same refusals (issue 24 item 2).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, cast

from scratchbank.domain.errors import HostileArchive

from .reader import _Downstream, _named
from .tar_header import refuse


def _inflater() -> tuple[Any, tuple[type[Exception], ...]]:
    """ISA-L's gzip decompressor and its error (zlib's when isal does not import)."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.decompressobj(wbits=31), (zlib.error,)
    isal_error = cast("type[Exception]", isal_zlib.error)  # typeshed calls it an instance
    return isal_zlib.decompressobj(wbits=31), (isal_error, zlib.error)


class GzipReader:
    """Feed gzip bytes, get tar bytes, with a cap on what it expands to."""

    def __init__(self, sink: Callable[[bytes], None], limit: int) -> None:
        self._d, self._errors = _inflater()
        self._sink = sink
        self._limit = limit
        self._refused: list[HostileArchive] = []
        self.out = 0

    def feed(self, data: bytes) -> None:
        with _named(self._refused):
            self._feed(data)

    def close(self) -> None:
        with _named(self._refused):
            if not self._d.eof:
                raise refuse("the gzip stream is truncated")

    def _ended(self) -> bool:
        return bool(self._d.eof)

    def _feed(self, data: bytes) -> None:
        if self._ended():
            if data:
                raise refuse("trailing data after the gzip stream")
            return
        try:
            while data:
                chunk = self._d.decompress(data, 1 << 20)
                self.out += len(chunk)
                if self.out > self._limit:
                    raise refuse("the gzip stream expands past the cap (a bomb?)")
                if chunk:
                    self._pass_on(chunk)
                if self._ended():
                    if self._d.unused_data:
                        raise refuse("trailing data after the gzip stream")
                    return
                data = self._d.unconsumed_tail
        except self._errors as error:
            raise refuse(f"corrupt gzip stream ({error})") from None

    def _pass_on(self, chunk: bytes) -> None:
        try:
            self._sink(chunk)
        except HostileArchive:
            raise
        except _Downstream:
            raise
        except Exception as error:
            raise _Downstream(error) from error
