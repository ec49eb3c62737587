"""The Timeline contract against every adapter: in memory, SQLite, a real PostgreSQL."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.application.ports import Timeline
from scratchbank.domain.errors import TimelineUnreadable, TimelineWriteFailed
from scratchbank.testing.builders import banked, started
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


def test_R15_a_corrupt_stored_record_makes_the_timeline_unreadable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    EventStoreTimeline(url).append("run-1", [started(), banked()])
    with sqlite3.connect(tmp_path / "t.db") as db:
        names = [r[0] for r in db.execute("select name from sqlite_master where type='table'")]
        (table,) = [n for n in names if "snapshot" not in n]
        db.execute(f"update {table} set state = ? where originator_version = 2", (b"{broken",))
    with pytest.raises(TimelineUnreadable, match="record 2: not JSON"):
        EventStoreTimeline(url).read("run-1")


def test_R15_a_store_that_cannot_be_read_raises_never_reads_empty(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    timeline = EventStoreTimeline(f"sqlite:///{path}")
    timeline.append("run-1", [started()])
    timeline.close()
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(TimelineUnreadable):
        EventStoreTimeline(f"sqlite:///{path}").read("run-1")


@pytest.mark.postgres
def test_R15_unreachable_postgres_is_unreadable_and_writes_fail_by_name(postgres_url: str) -> None:
    dead = "postgresql://postgres@127.0.0.1:9/postgres"
    with pytest.raises((TimelineUnreadable, TimelineWriteFailed)):
        EventStoreTimeline(dead).read("run-1")


def test_unsupported_url_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported timeline URL"):
        EventStoreTimeline("mysql://x")
