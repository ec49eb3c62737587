"""The teardown banking use case under faults, with fakes (T1-T20). Each test names the
expected outcome and checks that nothing was lost."""

from __future__ import annotations

import hashlib
import io

from scratchbank.adapters.memory import InMemoryBankStore
from scratchbank.application.ports import StoredBank


def test_the_fake_store_round_trips() -> None:
    store = InMemoryBankStore()
    store.banks["r"] = b"abc"
    out = io.BytesIO()
    assert store.fetch("r", out, max_bytes=10) == StoredBank(3, hashlib.sha256(b"abc").hexdigest())
