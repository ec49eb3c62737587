"""The Timeline contract against every adapter: in memory, SQLite, a real PostgreSQL."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.ports import Timeline
from scratchbank.testing.contracts import TimelineContract


class TestInMemoryTimeline(TimelineContract):
    def make(self) -> Timeline:
        return InMemoryTimeline()


class TestSQLiteTimeline(TimelineContract):
    @pytest.fixture(autouse=True)
    def _db(self, tmp_path: Path) -> None:
        self.url = f"sqlite:///{tmp_path}/timeline.db"

    def make(self) -> Timeline:
        return EventStoreTimeline(self.url)


@pytest.mark.postgres
class TestPostgresTimeline(TimelineContract):
    @pytest.fixture(autouse=True)
    def _db(self, postgres_url: str) -> None:
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        self.url = postgres_url.rsplit("/", 1)[0] + "/" + name

    def make(self) -> Timeline:
        return EventStoreTimeline(self.url)


def test_unsupported_url_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported timeline URL"):
        EventStoreTimeline("mysql://x")
