"""The timeline on eventsourcing's recorders: SQLite embedded, PostgreSQL shared.

Each run is an event stream keyed by its id; record i is stored at version i + 1 as
its wire object (JSON), so the storage contract is the wire format, not Python class
paths. Appends rely on the recorder's unique (stream, version) constraint: of two
writers racing on one run exactly one wins and the other gets TimelineConflict.
Every driver error is translated here: a conflict, an unreadable timeline (R15) or a
failed write.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from eventsourcing.persistence import (
    AggregateRecorder,
    InfrastructureFactory,
    IntegrityError,
    PersistenceError,
    StoredEvent,
)

from scratchbank.domain.errors import TimelineConflict, TimelineUnreadable, TimelineWriteFailed
from scratchbank.domain.records import Record, UnknownRecord
from scratchbank.domain.runs import check_run_id
from scratchbank.domain.wire import decode, encode

TOPIC_PREFIX = "scratchbank.wire:"
APPEND_RETRIES = 30


def env_for_url(url: str) -> dict[str, str]:
    """eventsourcing settings for ``sqlite:///path`` or ``postgresql://user:pw@host:port/db``."""
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        path = unquote(parsed.path) if parsed.netloc == "" else parsed.netloc + parsed.path
        return {
            "PERSISTENCE_MODULE": "eventsourcing.sqlite",
            "SQLITE_DBNAME": path or ":memory:",
            "SQLITE_LOCK_TIMEOUT": "10",
            "ORIGINATOR_ID_TYPE": "text",
        }
    if parsed.scheme in ("postgres", "postgresql"):
        return {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": parsed.path.lstrip("/") or "postgres",
            "POSTGRES_HOST": parsed.hostname or "127.0.0.1",
            "POSTGRES_PORT": str(parsed.port or 5432),
            "POSTGRES_USER": unquote(parsed.username or "postgres"),
            "POSTGRES_PASSWORD": unquote(parsed.password or ""),
            "POSTGRES_CONNECT_TIMEOUT": "5",
            "ORIGINATOR_ID_TYPE": "text",
        }
    raise ValueError(f"unsupported timeline URL {url!r} (sqlite:///... or postgresql://...)")


class EventStoreTimeline:
    """A Timeline over an eventsourcing aggregate recorder."""

    def __init__(self, url: str, *, env: Mapping[str, str] | None = None) -> None:
        settings = env_for_url(url) | dict(env or {})
        try:
            if settings.get("SQLITE_DBNAME", ":memory:") != ":memory:":  # an engine's first run: its folder
                Path(settings["SQLITE_DBNAME"]).parent.mkdir(parents=True, exist_ok=True)
            self._factory = InfrastructureFactory.construct(env=settings)
            self._recorder: AggregateRecorder = self._factory.aggregate_recorder("events")
            self._snapshots: AggregateRecorder = self._factory.aggregate_recorder("snapshots")
        except Exception as error:  # any backend's driver error: sqlite3, psycopg, ...
            raise TimelineUnreadable(f"cannot open the timeline store {url}: {error}") from error
        self.url = url

    def close(self) -> None:
        self._factory.close()

    def load_snapshot(self, run_id: str) -> tuple[int, dict[str, Any]] | None:
        """The latest folded state saved for the run; None when there is none or it is bad."""
        try:
            last = self._snapshots.select_events(check_run_id(run_id), desc=True, limit=1)
            return (last[0].originator_version, json.loads(last[0].state)) if last else None
        except (PersistenceError, ValueError):
            return None

    def save_snapshot(self, run_id: str, position: int, data: dict[str, Any]) -> None:
        """Best effort: a snapshot is a cache, and another writer may have saved this one."""
        state = json.dumps(data, sort_keys=True).encode()
        with contextlib.suppress(PersistenceError):
            self._snapshots.insert_events([StoredEvent(run_id, position, "scratchbank.snapshot", state)])

    def read(self, run_id: str) -> tuple[Record, ...]:
        return self.read_after(run_id, 0)

    def read_after(self, run_id: str, position: int) -> tuple[Record, ...]:
        """The records after the first ``position`` ones (a snapshot's tail)."""
        try:
            stored_events = self._recorder.select_events(check_run_id(run_id), gt=position or None)
        except PersistenceError as error:
            raise TimelineUnreadable(f"cannot read run {run_id}: {error}") from error
        records = []
        for index, stored in enumerate(stored_events, start=position):
            if stored.originator_version != index + 1:
                raise TimelineUnreadable(
                    f"run {run_id} has a gap before version {stored.originator_version}",
                    position=index,
                )
            try:
                obj = json.loads(stored.state)
            except (ValueError, UnicodeDecodeError) as error:
                raise TimelineUnreadable(f"not JSON: {error}", position=index) from None
            records.append(decode(obj, position=index))
        return tuple(records)

    def _length(self, run_id: str) -> int:
        try:
            last = self._recorder.select_events(run_id, desc=True, limit=1)
        except PersistenceError as error:
            raise TimelineWriteFailed(f"cannot read run {run_id} to append: {error}") from error
        return last[0].originator_version if last else 0

    def _stored(self, run_id: str, start: int, records: Sequence[Record]) -> list[StoredEvent]:
        out = []
        for offset, record in enumerate(records):
            wire = encode(record)
            topic = record.type if isinstance(record, UnknownRecord) else record.WIRE
            state = json.dumps(wire, sort_keys=True).encode()
            out.append(StoredEvent(run_id, start + offset + 1, TOPIC_PREFIX + topic, state))
        return out

    def append(self, run_id: str, records: Sequence[Record], *, expected: int | None = None) -> int:
        check_run_id(run_id)
        for attempt in range(APPEND_RETRIES):
            if attempt:
                # Racing writers without an expectation: back off with jitter, so that
                # each of them eventually appends instead of colliding in lockstep.
                time.sleep(random.uniform(0, min(0.2, 0.005 * 2**attempt)))
            start = self._length(run_id) if expected is None else expected
            try:
                self._recorder.insert_events(self._stored(run_id, start, records))
                return start + len(records)
            except IntegrityError:
                if expected is not None:
                    raise TimelineConflict(
                        f"run {run_id}: another writer appended past {expected} records"
                    ) from None
            except PersistenceError as error:
                raise TimelineWriteFailed(f"cannot append to run {run_id}: {error}") from error
        raise TimelineConflict(f"run {run_id}: lost {APPEND_RETRIES} append races in a row")
