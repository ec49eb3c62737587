"""The timeline on eventsourcing's recorders: SQLite embedded, PostgreSQL shared.

Each run is an event stream keyed by its id; record i is stored at version i + 1 as
its wire object (JSON), so the storage contract is the wire format, not Python class
paths. Appends rely on the recorder's unique (stream, version) constraint: of two
writers racing on one run exactly one wins and the other gets TimelineConflict.
Every driver error is translated here: a conflict, an unreadable timeline (R15) or a
failed write.

Every call has a deadline (``call_seconds``, T8): SQLite's busy timeout; on
PostgreSQL the server's ``statement_timeout`` and ``lock_timeout`` (a held row or
table lock), libpq's ``connect_timeout`` and the pool's wait, and, for a network
that stops forwarding (the server's own timeouts cannot reach us then), a watchdog
that shuts the call's socket down a grace after the deadline. A call past it raises
TimelineUnreadable (a read) or TimelineWriteFailed (an append), never hangs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, unquote, urlparse

from eventsourcing.persistence import (
    AggregateRecorder,
    InfrastructureFactory,
    IntegrityError,
    PersistenceError,
    StoredEvent,
)

from scratchbank.application.retry import Deadline
from scratchbank.domain.errors import TimelineConflict, TimelineUnreadable, TimelineWriteFailed
from scratchbank.domain.records import Record, UnknownRecord
from scratchbank.domain.runs import check_run_id
from scratchbank.domain.wire import decode, encode

from .watchdog import Watchdog

TOPIC_PREFIX = "scratchbank.wire:"
APPEND_RETRIES = 30
#: Each read or append ends within this (configurable per timeline: ``call_seconds``).
CALL_SECONDS = 10.0
#: The client-side cut comes this long after the server's own timeouts would have.
CUT_GRACE = 2.0

T = TypeVar("T")


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


def _timeouts(settings: dict[str, str], seconds: float) -> dict[str, str]:
    """The deadline as each backend's own settings (SQLite's busy timeout; the pool's
    wait and the insert's ``SET LOCAL lock_timeout`` on PostgreSQL)."""
    whole = str(max(1, math.ceil(seconds)))
    if settings.get("PERSISTENCE_MODULE") == "eventsourcing.sqlite":
        return {"SQLITE_LOCK_TIMEOUT": whole}
    return {"POSTGRES_CONNECT_TIMEOUT": whole, "POSTGRES_LOCK_TIMEOUT": whole}


def _read_only(settings: Mapping[str, str]) -> dict[str, str]:
    """Settings that open the store for reading only: SQLite's ``mode=ro`` URI (the file is
    never written: a snapshot save fails quietly, as a cache's may); no CREATE TABLE."""
    extra = {"CREATE_TABLE": "no"}
    name = settings.get("SQLITE_DBNAME", ":memory:")
    if settings.get("PERSISTENCE_MODULE") == "eventsourcing.sqlite" and name != ":memory:":
        extra["SQLITE_DBNAME"] = f"file:{quote(str(Path(name).resolve()))}?mode=ro"
    return extra


def _once(recorder: AggregateRecorder, name: str) -> Callable[..., Any]:
    """The recorder's method without the driver's own retry loop (eventsourcing's
    PostgreSQL recorder tries an OperationalError ten times): one call, one deadline;
    retries are the use case's, within its budget (T8)."""
    method = getattr(type(recorder), name)
    bare = getattr(method, "__wrapped__", method)
    return functools.partial(bare, recorder)


def _server_timeouts(factory: InfrastructureFactory[Any], seconds: float) -> None:
    """PostgreSQL: every connection the pool opens ends a statement or a lock wait by
    the deadline, and gives up connecting by it (set before the pool first opens)."""
    pool = getattr(getattr(factory, "datastore", None), "pool", None)
    kwargs = getattr(pool, "kwargs", None)
    if not isinstance(kwargs, dict):
        return
    ms = int(seconds * 1000)
    kwargs["connect_timeout"] = max(2, math.ceil(seconds))
    kwargs["options"] = f"-c statement_timeout={ms} -c lock_timeout={ms}"


class _Cutter:
    """Knows the PostgreSQL connection each thread's call is using, to shut its socket
    down when that call's deadline passes (a stalled network)."""

    def __init__(self, factory: InfrastructureFactory[Any]) -> None:
        self.in_use: dict[int, Any] = {}
        datastore = getattr(factory, "datastore", None)
        original = getattr(datastore, "get_connection", None)
        if original is None:
            return

        @contextlib.contextmanager
        def get_connection(*args: Any, **kwargs: Any) -> Iterator[Any]:
            with original(*args, **kwargs) as conn:
                self.in_use[threading.get_ident()] = conn
                try:
                    yield conn
                finally:
                    self.in_use.pop(threading.get_ident(), None)

        datastore.get_connection = get_connection  # type: ignore[union-attr]

    def cut(self, thread: int) -> None:
        conn = self.in_use.get(thread)
        if conn is None:
            return
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)


class EventStoreTimeline:
    """A Timeline over an eventsourcing aggregate recorder, every call within ``call_seconds``."""

    def __init__(
        self,
        url: str,
        *,
        env: Mapping[str, str] | None = None,
        call_seconds: float = CALL_SECONDS,
        read_only: bool = False,
    ) -> None:
        settings = env_for_url(url)
        settings = settings | _timeouts(settings, call_seconds) | dict(env or {})
        if read_only:  # a read (`status`): no table created, no snapshot saved, no checkpoint
            settings = settings | _read_only(settings)
        self.call_seconds = call_seconds
        try:
            name = settings.get("SQLITE_DBNAME", ":memory:")
            if name != ":memory:" and not read_only:  # an engine's first run: its folder
                Path(name).parent.mkdir(parents=True, exist_ok=True)
            self._factory = InfrastructureFactory.construct(env=settings)
            _server_timeouts(self._factory, call_seconds)
            self._cutter = _Cutter(self._factory)
            self._recorder: AggregateRecorder = self._factory.aggregate_recorder("events")
            self._select = _once(self._recorder, "select_events")
            self._insert_events = _once(self._recorder, "insert_events")
            self._snapshots: AggregateRecorder = self._factory.aggregate_recorder("snapshots")
        except Exception as error:  # any backend's driver error: sqlite3, psycopg, ...
            raise TimelineUnreadable(f"cannot open the timeline store {url}: {error}") from error
        self.url = url
        self._outbox_indexed = False

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

    def _within(self, call: Callable[[], T], fail: Callable[[str], Exception], what: str) -> T:
        """Run one store call within the deadline; a driver error (or the cut) by name."""
        thread = threading.get_ident()
        deadline = Deadline.after(self.call_seconds + CUT_GRACE)
        with Watchdog(deadline, lambda: self._cutter.cut(thread)) as dog:
            try:
                return call()
            except PersistenceError as error:
                if dog.fired:
                    why = f"{what}: no answer within its deadline ({self.call_seconds:.0f} s): cut"
                    raise fail(why) from error
                raise fail(f"{what}: {error}") from error

    def read_after(self, run_id: str, position: int) -> tuple[Record, ...]:
        """The records after the first ``position`` ones (a snapshot's tail)."""
        check_run_id(run_id)
        stored_events = self._within(
            lambda: self._select(run_id, gt=position or None),
            TimelineUnreadable,
            f"cannot read run {run_id}",
        )
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

    def run_ids(self) -> list[str]:
        """Every run this store holds a record of (the operator MCP's listing), within the deadline."""
        recorder: Any = self._recorder
        table = recorder.events_table_name
        schema = getattr(recorder.datastore, "schema", "")
        name = f'"{schema}"."{table}"' if schema else f'"{table}"'

        def select() -> list[str]:
            with recorder.datastore.transaction(commit=False) as cursor:
                cursor.execute(f"SELECT DISTINCT originator_id FROM {name}")
                return [
                    str(row["originator_id"] if isinstance(row, dict) else row[0])
                    for row in cursor.fetchall()
                ]

        return self._within(select, TimelineUnreadable, "cannot list the runs")

    def _length(self, run_id: str) -> int:
        last = self._within(
            lambda: self._select(run_id, desc=True, limit=1),
            TimelineWriteFailed,
            f"cannot read run {run_id} to append",
        )
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
            stored = self._stored(run_id, start, records)
            try:
                self._within(
                    functools.partial(self._insert, stored),
                    TimelineWriteFailed,
                    f"cannot append to run {run_id}",
                )
                return start + len(records)
            except _Conflict:
                if expected is not None:
                    raise TimelineConflict(
                        f"run {run_id}: another writer appended past {expected} records"
                    ) from None
        raise TimelineConflict(f"run {run_id}: lost {APPEND_RETRIES} append races in a row")

    def queued_unclaimed(self, before: datetime) -> list[str]:
        """The outbox (L4, issue #19): runs whose latest queueing (``attempt_queued``, or the
        orphan sweeper's republication) no claim followed, published at or before ``before``.

        One query on the events table, served by a partial index on the three topics
        (created here once, on SQLite and PostgreSQL alike): a row is listed while no later
        queueing, claim or sweep of its run exists. Parked runs and publications after
        ``before`` are left out here; the sweeper judges each listed run from its records.
        Raises TimelineUnreadable.
        """
        out = []
        for run_id, topic, state in self._outbox_rows():
            try:
                wire = json.loads(state)
            except (ValueError, UnicodeDecodeError):
                out.append(str(run_id))  # the sweeper's read names what is wrong with it
                continue
            if topic == TOPIC_PREFIX + "orphan_swept" and wire.get("parked") is True:
                continue
            at = self._outbox_time(wire.get("at"))
            if at is None or at <= before:
                out.append(str(run_id))
        return sorted(out)

    @staticmethod
    def _outbox_time(value: object) -> datetime | None:
        if not isinstance(value, str):
            return None
        try:
            at = datetime.fromisoformat(value)
        except ValueError:
            return None
        return at if at.tzinfo else at.replace(tzinfo=UTC)

    def _outbox_rows(self) -> list[tuple[str, str, bytes]]:
        from scratchbank.domain.records import AttemptClaimed, AttemptQueued, OrphanSwept

        datastore = self._factory.datastore  # type: ignore[attr-defined]
        table = self._recorder.events_table_name  # type: ignore[attr-defined]
        postgres = hasattr(datastore, "schema")
        if postgres:
            table = f'"{datastore.schema}"."{table}"'
        topics = ", ".join(
            f"'{TOPIC_PREFIX}{kind.WIRE}'" for kind in (AttemptQueued, AttemptClaimed, OrphanSwept)
        )
        index = (
            f"CREATE INDEX IF NOT EXISTS sb_outbox_idx ON {table} (topic, originator_id) "
            f"WHERE topic IN ({topics})"
        )
        queueings = ", ".join(f"'{TOPIC_PREFIX}{kind.WIRE}'" for kind in (AttemptQueued, OrphanSwept))
        query = (
            f"SELECT q.originator_id, q.topic, q.state FROM {table} q WHERE q.topic IN ({queueings}) "
            f"AND NOT EXISTS (SELECT 1 FROM {table} l WHERE l.originator_id = q.originator_id "
            f"AND l.originator_version > q.originator_version AND l.topic IN ({topics}))"
        )

        def call() -> list[tuple[str, str, bytes]]:
            if not self._outbox_indexed:
                with datastore.transaction(commit=True) as curs:
                    curs.execute(index)
                self._outbox_indexed = True
            with datastore.transaction(commit=False) as curs:
                curs.execute(query)
                fetched = curs.fetchall()
            return [(r["originator_id"], r["topic"], bytes(r["state"])) for r in fetched]

        thread = threading.get_ident()
        with Watchdog(Deadline.after(self.call_seconds + CUT_GRACE), lambda: self._cutter.cut(thread)):
            try:
                return call()
            except Exception as error:  # any driver's error: sqlite3, psycopg
                raise TimelineUnreadable(f"cannot list the queued runs: {error}") from error

    def _insert(self, stored: list[StoredEvent]) -> None:
        try:
            self._insert_events(stored)
        except IntegrityError:
            raise _Conflict from None


class _Conflict(Exception):
    """The unique (stream, version) constraint said no: another writer won (internal)."""
