"""A staged tree's listing (manifest lines a sandbox wrote to a host file), compared
with the bank's manifest on disk, so the host does not grow with the member count."""

from __future__ import annotations

from typing import BinaryIO

from scratchbank.domain.errors import StreamBroken

from .manifest_line import parse_line
from .members import Comparison
from .spill_log import MemberLog, OverBudget

_BATCH_BYTES = 1 << 20


def load_listing(log: MemberLog, listing: BinaryIO) -> Comparison:
    """Read the listing file from its start into the log; compare it with the manifest."""
    listing.seek(0)
    add = log.add_listed
    try:
        while batch := listing.readlines(_BATCH_BYTES):  # in bulk: one read per ~1 MiB of lines
            for raw in batch:
                if raw.strip():
                    add(*parse_line(raw))
        return log.compare()
    except OverBudget as over:
        raise StreamBroken(
            f"the restored tree's listing takes the member log past its temp-disk budget "
            f"({over.budget} bytes, twice over with the listing; Limits.member_log_bytes)"
        ) from None
