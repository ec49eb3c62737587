"""The ports the use cases drive. Each has one contract test suite every adapter passes.

Ports are Protocols so that an engine can implement one over what it already has
(its own event log, its own object store) without inheriting from us.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, Protocol

import attrs

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


@attrs.frozen
class StoredBank:
    """What a store holds for a run: how many bytes, and their SHA-256."""

    bytes: int
    sha256: str


class BankStore(Protocol):
    """Where banks are kept, one per run (T3: swept with the run).

    Contract (``scratchbank.testing.contracts.check_bank_store``):
    - ``put`` replaces the run's bank atomically from a host file: a reader sees the old
      bank or the new one, never a part; failures raise BankWriteFailed.
    - ``fetch`` streams the bank into ``dest`` and returns its size and digest; it raises
      BankGone only when the store says the bank does not exist, BankReadFailed for any
      failure a later read may cure (and on a checksum the store kept that does not
      match), HostileArchive past ``max_bytes`` (it never reads more than max + 1).
    - ``delete`` and ``sweep`` are idempotent.
    - ``keeps_banks`` False: a store that keeps none (T20 names it).
    """

    keeps_banks: bool

    def put(self, run_id: str, archive: Path, *, sha256: str) -> None: ...

    def fetch(self, run_id: str, dest: BinaryIO, *, max_bytes: int) -> StoredBank: ...

    def delete(self, run_id: str) -> None: ...

    def sweep(self, run_id: str) -> None: ...
