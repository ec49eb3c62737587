"""The ports the use cases drive. Each has one contract test suite every adapter passes.

Ports are Protocols so that an engine can implement one over what it already has
(its own event log, its own object store) without inheriting from us.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from scratchbank.domain.records import Record


class Timeline(Protocol):
    """A run's records, in order, appended with optimistic concurrency.

    ``read`` raises TimelineUnreadable when the store cannot be read or a known record
    is malformed; it never answers an empty history for a history it could not read
    (R15). ``append`` raises TimelineConflict when ``expected`` is given and the
    timeline no longer has that many records (another writer won).
    """

    def read(self, run_id: str) -> Sequence[Record]: ...

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        """Append records; return the timeline's new length."""
        ...
