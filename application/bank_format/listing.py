"""A staged tree's listing (manifest lines a sandbox wrote to a host file), compared
with the bank's manifest on disk, so the host does not grow with the member count."""

from __future__ import annotations

import re
from typing import BinaryIO

from scratchbank.domain.errors import StreamBroken

from .manifest_line import parse_line
from .members import Comparison
from .spill_log import MemberLog, OverBudget

_BATCH_BYTES = 1 << 20

#: A line exactly as ``line_of`` writes it, but for a directory and for a path with a
#: ``\u`` escape: printable ASCII but ``"`` and ``\``, or their short escapes. Such a
#: line IS its canonical form (``line_of(*parse_line(line))``), so it is compared as it
#: is, without its JSON decoded again (issue 24); any other line (a directory's: its
#: path keys the implicit-parent check) goes through ``parse_line``, refusals and all.
_CANONICAL = re.compile(
    rb'\["((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\bfnrt])*)", '
    rb'"(file|symlink|fifo|other)", (0|[1-9][0-9]{0,17})\]\n?'
)


def load_listing(log: MemberLog, listing: BinaryIO) -> Comparison:
    """Read the listing file from its start into the log; compare it with the manifest."""
    listing.seek(0)
    add, add_line, canonical = log.add_listed, log.add_listed_line, _CANONICAL.fullmatch
    try:
        while batch := listing.readlines(_BATCH_BYTES):  # in bulk: one read per ~1 MiB of lines
            for raw in batch:
                if (m := canonical(raw)) is not None:
                    add_line(raw.rstrip(b"\n").decode("ascii"), m[2].decode("ascii"), int(m[3]))
                elif raw.strip():
                    add(*parse_line(raw))
        return log.compare()
    except OverBudget as over:
        raise StreamBroken(
            f"the restored tree's listing takes the member log past its temp-disk budget "
            f"({over.budget} bytes, twice over with the listing; Limits.member_log_bytes)"
        ) from None
