"""A staged tree's listing (manifest lines a sandbox wrote to a host file), compared
with the bank's manifest on disk, so the host does not grow with the member count."""

from __future__ import annotations

import json
from typing import BinaryIO

from scratchbank.domain.errors import StreamBroken

from .manifest import Comparison, MemberLog, OverBudget

KINDS = frozenset({"file", "dir", "symlink", "fifo", "other"})


def parse_line(raw: bytes) -> tuple[str, str, int]:
    """One listing line: ``[path, kind, size]``; anything else means the listing broke."""
    try:
        path, kind, size = json.loads(raw)
    except ValueError:
        raise StreamBroken(f"unreadable listing line {raw[:80]!r}") from None
    if not (isinstance(path, str) and kind in KINDS and isinstance(size, int) and size >= 0):
        raise StreamBroken(f"unreadable listing line {raw[:80]!r}")
    return path, kind, size


def load_listing(log: MemberLog, listing: BinaryIO) -> Comparison:
    """Read the listing file from its start into the log; compare it with the manifest."""
    listing.seek(0)
    try:
        for raw in listing:
            if raw.strip():
                log.add_listed(*parse_line(raw))
        return log.compare()
    except OverBudget as over:
        raise StreamBroken(
            f"the restored tree's listing takes the member log past its temp-disk budget "
            f"({over.budget} bytes, twice over with the listing; Limits.member_log_bytes)"
        ) from None
