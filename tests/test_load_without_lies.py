"""Issue 26: load without lies. A report says ``recorded`` only for a record known to have
landed; a busy timeline waits for a call slot and is never read as unreadable (R15)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scratchbank.adapters.event_store import EventStoreTimeline


def test_the_in_flight_bound_is_one_setting_with_a_default_per_store(tmp_path: Path) -> None:
    """SQLite's default, the URL's ``in_flight``, and SQLite's pool sized from it."""
    default = EventStoreTimeline(f"sqlite:///{tmp_path}/a.db")
    given = EventStoreTimeline(f"sqlite:///{tmp_path}/b.db?in_flight=7")
    assert (default.in_flight, given.in_flight) == (8, 7)
    pool = given._factory.datastore.pool  # type: ignore[attr-defined]
    assert (pool.pool_size, pool.max_overflow, pool.pool_timeout) == (7, 0, given.call_seconds)
    with pytest.raises(ValueError, match="in_flight"):
        EventStoreTimeline(f"sqlite:///{tmp_path}/c.db?in_flight=0")
