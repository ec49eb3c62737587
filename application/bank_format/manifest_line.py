"""The manifest line codec, the one place its format is written: ``json.dumps([path,
kind, size])`` (ASCII only, so SQLite's byte order is Python's ``sorted`` order).

The bank's manifest, a staged tree's listing and the fakes' listings all go through
``line_of``; a listing a sandbox wrote comes back through ``parse_line``.
"""

from __future__ import annotations

import json

from scratchbank.domain.errors import StreamBroken

KINDS = frozenset({"file", "dir", "symlink", "fifo", "other"})

_quote = json.encoder.encode_basestring_ascii


def line_of(path: str, kind: str, size: int) -> str:
    """``json.dumps([path, kind, size])``, without the encoder's per-call overhead."""
    return f'[{_quote(path)}, "{kind}", {size:d}]'


_loads = json.JSONDecoder().decode
#: a size past SQLite's INTEGER (a hostile sandbox's stat) is an unreadable line, never an OverflowError
_SIZES = 1 << 63


def parse_line(raw: bytes) -> tuple[str, str, int]:
    """One listing line: ``[path, kind, size]``; anything else means the listing broke.

    An ASCII line without NUL (every line ``line_of`` writes) is decoded as the str it
    is, skipping ``json.loads``'s per-call encoding sniffing (it reads such bytes as
    UTF-8 too: the same value, the same refusals); any other line goes through
    ``json.loads`` as before."""
    try:
        if raw.isascii() and b"\x00" not in raw:
            path, kind, size = _loads(raw.decode("ascii"))
        else:
            path, kind, size = json.loads(raw)
    except (ValueError, TypeError):  # TypeError: a line that is JSON but not a list (``5``)
        raise StreamBroken(f"unreadable listing line {raw[:80]!r}") from None
    if not (isinstance(path, str) and kind in KINDS and isinstance(size, int) and 0 <= size < _SIZES):
        raise StreamBroken(f"unreadable listing line {raw[:80]!r}")
    return path, kind, size
