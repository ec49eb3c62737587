"""The Timeline contract against every adapter: in memory, SQLite, a real PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.ports import Timeline
from scratchbank.testing.contracts import TimelineContract


class TestInMemoryTimeline(TimelineContract):
    def make(self) -> Timeline:
        return InMemoryTimeline()


class _Closed(TimelineContract):
    """Every event store a contract test made is closed after it: a PostgreSQL one holds a
    connection pool and its four threads, which outlived each test and were counted by the
    thread tests that ran after it on the same worker (session 8's flake)."""

    url: str

    @pytest.fixture(autouse=True)
    def _close_made(self) -> Iterator[None]:
        self._made: list[EventStoreTimeline] = []
        yield
        for timeline in self._made:
            timeline.close()

    def make(self) -> Timeline:
        self._made.append(EventStoreTimeline(self.url))
        return self._made[-1]


class TestSQLiteTimeline(_Closed):
    @pytest.fixture(autouse=True)
    def _db(self, tmp_path: Path) -> None:
        self.url = f"sqlite:///{tmp_path}/timeline.db"


@pytest.mark.postgres
class TestPostgresTimeline(_Closed):
    @pytest.fixture(autouse=True)
    def _db(self, postgres_url: str) -> None:
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        self.url = postgres_url.rsplit("/", 1)[0] + "/" + name


def test_unsupported_url_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported timeline URL"):
        EventStoreTimeline("mysql://x")
