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
that stops forwarding (the server's own timeouts cannot reach us then), an alarm (the
process's one alarm thread: alarms.py) that shuts the call's socket down a grace
after the deadline. A call past it raises
TimelineUnreadable (a read) or TimelineWriteFailed (an append), never hangs.

Backpressure (ADR 0010): at most ``in_flight`` store calls run at once per timeline
object (one process's worth; on SQLite a write first waits its turn at the one writer,
holding no slot); a call waits in line for a slot, nearest deadline first (``wait_seconds``,
and never past its caller's deadline: ``cancellation.calls_within``, set by every
``retry_within`` try), and
the connection pool is sized from the same number, so load queues here instead of timing
out in the pool. A call that found no slot (or, on SQLite, no turn at the single
writer) by its deadline raises TimelineBusy: retryable, never R15.

A lost answer (issue 26): an insert that failed after it may have committed (the reply
lost, the connection cut) raises TimelineWriteFailed, and its position and content are
kept per run; the caller's retry of the same records inserts at that same position, so
the unique (stream, version) constraint settles it: it lands there once, or it finds the
lost insert there (nothing more is written), or another writer's records (the lost one
never landed, and no longer can). Without an expected position a retry used to read the
new length and write the records a second time. Each lost insert of a run is kept on its
own (two callers of one run may each lose one: a single one per run wrote the other's
retry twice). Within one timeline object (one process).

Snapshots (ADR 0010): an append that carries the timeline past a multiple of
``snapshot_every`` records saves the folded state there, so a decision in a fresh
process folds at most that many records after the latest snapshot. Reads are paged
(``PAGE`` records per store call): a fold over them holds one page at a time.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import heapq
import itertools
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
from urllib.parse import parse_qs, quote, unquote, urlparse

import attrs
from eventsourcing.domain import EventSourcingError
from eventsourcing.persistence import (
    AggregateRecorder,
    ConnectionUnavailableError,
    InfrastructureFactory,
    IntegrityError,
    PersistenceError,
    StoredEvent,
)

from scratchbank.application.cancellation import Deadline, caller_deadline
from scratchbank.domain.errors import (
    ScratchbankError,
    TimelineBusy,
    TimelineConflict,
    TimelineUnreadable,
    TimelineWriteFailed,
)
from scratchbank.domain.fold import ScratchState, fold
from scratchbank.domain.records import Record, UnknownRecord
from scratchbank.domain.runs import check_run_id
from scratchbank.domain.snapshot import state_from_data, state_to_data
from scratchbank.domain.wire import decode, encode

from .alarms import ALARMS

TOPIC_PREFIX = "scratchbank.wire:"
APPEND_RETRIES = 30
#: Each read or append ends within this (configurable per timeline: ``call_seconds``).
CALL_SECONDS = 10.0
#: The client-side cut comes this long after the server's own timeouts would have.
CUT_GRACE = 2.0
#: Store calls in flight at once per timeline (``in_flight``, or ``?in_flight=N`` on the
#: URL): SQLite has one writer (its writes wait in a line of one besides: ``_writes``) and
#: its readers run beside it in WAL, so a handful; PostgreSQL, its pool (ADR 0010).
IN_FLIGHT = {"sqlite": 8, "postgresql": 10}
#: How long a call may wait in line for a slot (``wait_seconds``) before TimelineBusy:
#: longer than a call's own deadline, since a line of 200 callers at a few tens of
#: milliseconds each is load, not an outage.
WAIT_SECONDS = 60.0
#: Records per store call when reading (a fold holds one page at a time).
PAGE = 1000
#: An append past a multiple of this many records saves a snapshot there.
SNAPSHOT_EVERY = 1000
#: How many runs' folded states an appender keeps (so its snapshots cost no read).
FOLDED_RUNS = 256
#: How many lost inserts of one run an appender keeps until their retries settle them.
UNSURE_PER_RUN = 16

T = TypeVar("T")


def in_flight_for_url(url: str) -> int:
    """The URL's ``in_flight=N`` query, else the store's documented default (ADR 0010)."""
    parsed = urlparse(url)
    given = parse_qs(parsed.query).get("in_flight")
    if given:
        try:
            n = int(given[-1])
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"in_flight must be a whole number >= 1, not {given[-1]!r}")
        return n
    return IN_FLIGHT["sqlite" if parsed.scheme == "sqlite" else "postgresql"]


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


def _timeouts(settings: dict[str, str], seconds: float, in_flight: int) -> dict[str, str]:
    """The deadline as each backend's own settings (SQLite's busy timeout; the pool's
    wait and the insert's ``SET LOCAL lock_timeout`` on PostgreSQL), and PostgreSQL's
    pool sized from ``in_flight`` (SQLite's pool is sized once built: ``_size_pool``)."""
    whole = str(max(1, math.ceil(seconds)))
    if settings.get("PERSISTENCE_MODULE") == "eventsourcing.sqlite":
        return {"SQLITE_LOCK_TIMEOUT": whole}
    return {
        "POSTGRES_CONNECT_TIMEOUT": whole,
        "POSTGRES_LOCK_TIMEOUT": whole,
        "POSTGRES_POOL_SIZE": str(in_flight),
        "POSTGRES_MAX_OVERFLOW": "0",
    }


def _size_pool(factory: InfrastructureFactory[Any], in_flight: int, seconds: float) -> None:
    """SQLite: eventsourcing's pool (5 + 10 connections, a fixed 5 s wait) takes the
    slot count and the call's deadline instead (its settings have no key for them)."""
    pool = getattr(getattr(factory, "datastore", None), "pool", None)
    if pool is not None and hasattr(pool, "pool_timeout"):
        pool.pool_size, pool.max_overflow, pool.pool_timeout = in_flight, 0, seconds


def _read_only(settings: Mapping[str, str]) -> dict[str, str]:
    """Settings that open the store for reading only: SQLite's ``mode=ro`` URI (the file is
    never written: a snapshot save fails quietly, as a cache's may); no CREATE TABLE."""
    extra = {"CREATE_TABLE": "no"}
    name = settings.get("SQLITE_DBNAME", ":memory:")
    if settings.get("PERSISTENCE_MODULE") == "eventsourcing.sqlite" and name != ":memory:":
        extra["SQLITE_DBNAME"] = f"file:{quote(str(Path(name).resolve()))}?mode=ro"
    return extra


@attrs.frozen
class _Quiet:
    """A SQLite file no connection holds open (no ``-wal`` beside it) read as ``immutable``: a
    read creates no ``-wal``/``-shm`` and checkpoints nothing. Safe only while the file stays
    as it was: a writer that opens it creates the ``-wal`` and a checkpoint moves its mtime, so
    each call checks the file's stamp after it and, if anything moved, reads again the plain
    ``mode=ro`` way (the side files are then a live writer's, not ours)."""

    path: Path
    stamp: tuple[int, int, int] | None

    @classmethod
    def of(cls, path: Path) -> _Quiet:
        return cls(path, cls.stamp_of(path))

    @staticmethod
    def stamp_of(path: Path) -> tuple[int, int, int] | None:
        if Path(f"{path}-wal").exists() or Path(f"{path}-journal").exists():
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    @property
    def holds(self) -> bool:
        return self.stamp is not None and self.stamp_of(self.path) == self.stamp


def _quiet(settings: Mapping[str, str]) -> tuple[dict[str, str], _Quiet | None]:
    """Read-only settings that open a quiet SQLite file ``immutable`` (``_Quiet``); as
    ``_read_only`` when it is not quiet (a writer holds it) or not SQLite."""
    extra = _read_only(settings)
    name = settings.get("SQLITE_DBNAME", ":memory:")
    if "SQLITE_DBNAME" not in extra:
        return extra, None
    quiet = _Quiet.of(Path(name).resolve())
    if quiet.stamp is None:
        return extra, None
    return extra | {"SQLITE_DBNAME": extra["SQLITE_DBNAME"] + "&immutable=1"}, quiet


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


class _Turn:
    """One waiter in line, due by ``due`` (its caller's deadline or its own bound): woken
    when handed a slot (``granted``) or when its caller's run context is cancelled
    (``cancelled``); ``gone`` once it left the line without one."""

    __slots__ = ("cancelled", "due", "event", "gone", "granted")

    def __init__(self, due: float) -> None:
        self.due = due
        self.event = threading.Event()
        self.granted = self.cancelled = self.gone = False

    def cancel(self) -> None:
        self.cancelled = True
        self.event.set()


#: Why a wait for a slot ended without one: its own bound, the caller's deadline, the
#: caller's run context cancelled.
WAITED, DEADLINE, CANCELLED = "waited", "deadline", "cancelled"


class _Slots:
    """At most ``n`` holders at once; a freed slot goes to the waiter whose deadline is
    nearest (arrival order among equals), each waiting within its own deadline: a plain
    semaphore could starve one caller past its deadline while later ones run, and a line
    in arrival order kept a claim with seconds left of its budget behind a crowd of fresh
    reads that could each wait a minute (issue 26: 4 of 200 resumes refused TIMELINE_BUSY).
    A waiter whose run context is cancelled leaves the line at once."""

    def __init__(self, n: int) -> None:
        self._free = n
        self._line: list[tuple[float, int, _Turn]] = []  # a heap by (due, arrival)
        self._waiting = 0
        self._order = itertools.count()
        self._lock = threading.Lock()

    def acquire(self, timeout: float, deadline: Deadline | None = None) -> str:
        """A slot within ``timeout`` seconds and by ``deadline`` (the caller's): "" when
        taken, else why the wait ended (WAITED, DEADLINE or CANCELLED)."""
        bound, why = timeout, WAITED
        if deadline is not None and deadline.left() < timeout:
            bound, why = deadline.left(), DEADLINE
        with self._lock:
            if self._free and not self._waiting:
                self._free -= 1
                return ""
            if deadline is not None and deadline.cancelled():
                return CANCELLED
            if bound <= 0:
                return why
            turn = _Turn(time.monotonic() + bound)
            heapq.heappush(self._line, (turn.due, next(self._order), turn))
            self._waiting += 1
        unhook = deadline.on_cancel(turn.cancel) if deadline is not None else (lambda: None)
        try:
            turn.event.wait(bound)
        finally:
            unhook()
        with self._lock:
            if turn.granted:  # handed a slot (perhaps just as the wait ended)
                return ""
            turn.gone = True  # dropped from the heap when it comes up
            self._waiting -= 1
            return CANCELLED if turn.cancelled else why

    def release(self) -> None:
        with self._lock:
            while self._line:
                turn = heapq.heappop(self._line)[2]
                if turn.gone:
                    continue
                turn.granted = True  # the slot passes straight to the nearest deadline
                self._waiting -= 1
                turn.event.set()
                return
            self._free += 1

    def waiting(self) -> int:
        """How many callers are in line (the tests wait on it, never on time)."""
        with self._lock:
            return self._waiting


class EventStoreTimeline:
    """A Timeline over an eventsourcing aggregate recorder, every call within ``call_seconds``
    and at most ``in_flight`` calls at once (module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        env: Mapping[str, str] | None = None,
        call_seconds: float = CALL_SECONDS,
        read_only: bool = False,
        in_flight: int | None = None,
        wait_seconds: float = WAIT_SECONDS,
        snapshot_every: int = SNAPSHOT_EVERY,
    ) -> None:
        self.in_flight = in_flight or in_flight_for_url(url)
        self.wait_seconds = wait_seconds
        settings = env_for_url(url)
        settings = settings | _timeouts(settings, call_seconds, self.in_flight) | dict(env or {})
        #: A quiet SQLite file read ``immutable`` (``_Quiet``); None: read the plain way.
        self._quiet: _Quiet | None = None
        self._reopening = threading.Lock()
        self._retired: list[InfrastructureFactory[Any]] = []  # closed by close()
        self._plain: Mapping[str, str] = settings
        if read_only:  # a read (`status`): no table created, no snapshot saved, no checkpoint
            self._plain = settings | _read_only(settings)
            settings, self._quiet = _quiet(settings)
            settings = self._plain | settings
        self.call_seconds = call_seconds
        self.snapshot_every = snapshot_every
        self.sqlite = settings.get("PERSISTENCE_MODULE") == "eventsourcing.sqlite"
        #: Records decoded from the store by this object (the bench and the tests count them).
        self.records_read = 0
        self._slots = _Slots(self.in_flight)
        #: SQLite's one writer as a line of its own: an append waiting for it holds no slot
        #: (the reads go on); None on PostgreSQL, whose writers run side by side.
        self._writes: _Slots | None = _Slots(1) if self.sqlite else None
        #: The folded state of the runs this object appended to last (``_after_append``).
        self._folded: collections.OrderedDict[str, ScratchState] = collections.OrderedDict()
        self._folded_lock = threading.Lock()
        #: Per run, the inserts whose answers were lost (``_append``), until settled: each one
        #: (two callers of one run may each lose one; the oldest past ``UNSURE_PER_RUN`` is dropped).
        self._unsure: collections.OrderedDict[str, list[_Unsure]] = collections.OrderedDict()
        self.url = url
        name = settings.get("SQLITE_DBNAME", ":memory:")
        if name != ":memory:" and not read_only:  # an engine's first run: its folder
            with contextlib.suppress(OSError):
                Path(name).parent.mkdir(parents=True, exist_ok=True)
        self._open(settings)
        self._outbox_indexed = False

    def _open(self, settings: Mapping[str, str]) -> None:
        """Open the store; one that fails to open is closed before the error is raised (a
        PostgreSQL store's pool, made before its first connection failed, would otherwise go on
        trying to connect in its own threads until collected: by one of them, which then
        cannot join itself)."""
        made: InfrastructureFactory[Any] | None = None
        try:
            self._factory = made = InfrastructureFactory.construct(env=settings)
            _server_timeouts(self._factory, self.call_seconds)
            _size_pool(self._factory, self.in_flight, self.call_seconds)
            self._cutter = _Cutter(self._factory)
            self._recorder: AggregateRecorder = self._factory.aggregate_recorder("events")
            self._select = _once(self._recorder, "select_events")
            self._insert_events = _once(self._recorder, "insert_events")
            self._snapshots: AggregateRecorder = self._factory.aggregate_recorder("snapshots")
        except Exception as error:  # any backend's driver error: sqlite3, psycopg, ...
            if made is not None:
                with contextlib.suppress(Exception):
                    made.close()
            raise TimelineUnreadable(f"cannot open the timeline store {self.url}: {error}") from error

    def _no_longer_quiet(self) -> None:
        """A writer came to the file under an immutable read: from now on read the plain way.
        Once, whichever call sees it first; the first store is closed with the timeline,
        not now: another call may still be reading on it (its pool would close under it)."""
        with self._reopening:
            if self._quiet is None:  # another call reopened already
                return
            self._quiet = None
            self._retired.append(self._factory)
            self._open(self._plain)

    def close(self) -> None:
        for factory in (*self._retired, self._factory):
            factory.close()

    # -- every store call goes through here ----------------------------------------------

    def _within(self, call: Callable[[], T], fail: Callable[[str], Exception], what: str) -> T:
        """Run one store call in a slot, within the deadline; a driver error (or the cut) by name.
        A write on SQLite first waits its turn at the one writer (``_writes``), holding no slot."""
        writer = self._writes is not None and fail is TimelineWriteFailed
        if writer:
            self._take_slot(what, writer=True)
        try:
            self._take_slot(what)
        except BaseException:
            if writer:
                self._release_writer()
            raise
        try:
            if self._quiet is not None and not self._quiet.holds:  # a writer came between calls
                self._no_longer_quiet()
            quiet = self._quiet
            result = self._cut_at_deadline(call, fail, what)
            if quiet is not None and not quiet.holds:  # the file moved under the read: read again
                self._no_longer_quiet()
                result = self._cut_at_deadline(call, fail, what)
            return result
        finally:
            self._slots.release()
            if writer:
                self._release_writer()

    def _release_writer(self) -> None:
        assert self._writes is not None
        self._writes.release()

    def _take_slot(self, what: str, *, writer: bool = False) -> None:
        """Wait in line for a call slot (``writer``: for SQLite's one writer): at most
        ``wait_seconds``, and never past the caller's deadline (``cancellation.calls_within``:
        the use case's budget, its run context's cancellation). No slot by then:
        TimelineBusy, naming which bound ended the wait."""
        line, n, calls = (self._writes, 1, "write") if writer else (self._slots, self.in_flight, "calls")
        assert line is not None
        ended = line.acquire(self.wait_seconds, caller_deadline())
        if not ended:
            return
        if ended != WAITED:
            why = "the run context was cancelled" if ended == CANCELLED else "the caller's deadline passed"
            raise TimelineBusy(
                f"{what}: {n} timeline {calls} in flight in this process; {why} while waiting for one to end"
            )
        raise TimelineBusy(
            f"{what}: {n} timeline {calls} in flight in this process, "
            f"none ended within {self.wait_seconds:g} s"
        )

    def _cut_at_deadline(self, call: Callable[[], T], fail: Callable[[str], Exception], what: str) -> T:
        thread = threading.get_ident()
        alarm = ALARMS.arm(self.call_seconds + CUT_GRACE, lambda: self._cutter.cut(thread))
        try:
            return call()
        except PersistenceError as error:
            if alarm.fired:
                why = f"{what}: no answer within its deadline ({self.call_seconds:.0f} s): cut"
                raise fail(why) from error
            if self._busy(error, reading=fail is TimelineUnreadable):
                raise TimelineBusy(f"{what}: the store's writer stayed busy: {error}") from error
            raise fail(f"{what}: {error}") from error
        except EventSourcingError as error:  # the library's others (a pool closed under the call...)
            raise fail(f"{what}: {error!r}") from error
        finally:
            alarm.disarm()

    def _busy(self, error: PersistenceError, *, reading: bool) -> bool:
        """SQLite under load, not broken: this process's writer lock or pool still taken
        at the deadline, or (for a read, which R15 would otherwise refuse on) the file
        locked by another process. An append the file's lock stopped stays a failed
        write (T8: retried within its budget all the same)."""
        if not self.sqlite:
            return False
        return isinstance(error, ConnectionUnavailableError) or (
            reading and "database is locked" in str(error)
        )

    # -- snapshots (SnapshotStore) ---------------------------------------------------------

    def load_snapshot(self, run_id: str) -> tuple[int, dict[str, Any]] | None:
        """The latest folded state saved for the run; None when there is none or it is bad.
        A run this object appended to last answers from its own fold (``_after_append``),
        exact at its length: a decision then reads only what others appended since (issue 26).

        Raises TimelineBusy (a busy store is not a missing snapshot: a full read under
        load is the last thing to start)."""
        check_run_id(run_id)
        with self._folded_lock:
            followed = self._folded.get(run_id)
        if followed is not None:  # this object appended the run last: its fold, no store call
            return followed.records, state_to_data(followed)
        try:
            last = self._within(
                lambda: self._snapshots.select_events(run_id, desc=True, limit=1),
                TimelineUnreadable,
                f"cannot read run {run_id}'s snapshot",
            )
            return (last[0].originator_version, json.loads(last[0].state)) if last else None
        except (TimelineUnreadable, ValueError):
            return None

    def save_snapshot(self, run_id: str, position: int, data: dict[str, Any]) -> None:
        """Best effort: a snapshot is a cache, and another writer may have saved this one."""
        state = json.dumps(data, sort_keys=True).encode()
        stored = [StoredEvent(run_id, position, "scratchbank.snapshot", state)]
        with contextlib.suppress(ScratchbankError, PersistenceError):
            self._within(
                lambda: self._snapshots.insert_events(stored),
                TimelineWriteFailed,
                f"cannot save run {run_id}'s snapshot",
            )

    def _after_append(self, run_id: str, start: int, records: Sequence[Record]) -> None:
        """Keep the run's folded state (this process appended it: no read), and save it as
        a snapshot when the append crossed a multiple of ``snapshot_every``. The state of a
        run this process did not follow is folded from the latest snapshot, and only when
        one is due. Never fails the append that landed: a snapshot is a cache."""
        end = start + len(records)
        due = end // self.snapshot_every > start // self.snapshot_every
        with self._folded_lock:
            state = self._folded.pop(run_id, None)
        with contextlib.suppress(ScratchbankError):
            if start == 0:
                state = fold(records)
            elif state is not None and state.records == start:
                state = fold(records, start=state)
            elif due:
                begin = _trusted(self.load_snapshot(run_id))
                state = fold(self.read_after(run_id, begin.records if begin else 0), start=begin)
            else:
                return
            if due:
                self.save_snapshot(run_id, state.records, state_to_data(state))
            with self._folded_lock:
                self._folded[run_id] = state
                while len(self._folded) > FOLDED_RUNS:
                    self._folded.popitem(last=False)

    # -- reads ---------------------------------------------------------------------------

    def read(self, run_id: str) -> tuple[Record, ...]:
        return tuple(self.read_after(run_id, 0))

    def read_after(self, run_id: str, position: int) -> Iterator[Record]:
        """The records after the first ``position`` ones, a page per store call (lazily:
        a fold over it holds one page; TimelineUnreadable is raised while iterating)."""
        check_run_id(run_id)
        index = position
        while True:
            page = self._within(
                functools.partial(self._select_late, run_id, gt=index or None, limit=PAGE),
                TimelineUnreadable,
                f"cannot read run {run_id}",
            )
            for stored in page:
                yield self._decode(run_id, stored, index)
                index += 1
            self.records_read += len(page)
            if len(page) < PAGE:
                return

    def _select_late(self, *args: Any, **kwargs: Any) -> Any:
        return self._select(*args, **kwargs)  # the current recorder's, looked up at the call

    def _decode(self, run_id: str, stored: StoredEvent, index: int) -> Record:
        if stored.originator_version != index + 1:
            raise TimelineUnreadable(
                f"run {run_id} has a gap before version {stored.originator_version}", position=index
            )
        try:
            obj = json.loads(stored.state)
        except (ValueError, UnicodeDecodeError) as error:
            raise TimelineUnreadable(f"not JSON: {error}", position=index) from None
        return decode(obj, position=index)

    # -- appends -------------------------------------------------------------------------

    def run_ids(self) -> list[str]:
        """Every run this store holds a record of (the operator MCP's listing), within the deadline."""

        def select() -> list[str]:
            recorder: Any = self._recorder  # the current one (a quiet read may reopen the store)
            table = recorder.events_table_name
            schema = getattr(recorder.datastore, "schema", "")
            name = f'"{schema}"."{table}"' if schema else f'"{table}"'
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
        start = self._append(run_id, records, expected)
        end = start + len(records)
        self._after_append(run_id, start, records)
        return end

    def _append(self, run_id: str, records: Sequence[Record], expected: int | None) -> int:
        """Insert at ``expected`` (or at the end, retrying lost races); the start used.

        An insert whose answer was lost (TimelineWriteFailed: it may have committed) is
        remembered by its position and content (``_unsure``); the caller's retry of the same
        records first settles that position (``_settle``), so it lands once (issue 26)."""
        settled = self._settle(run_id, records, expected)
        if settled is not None:
            return settled
        for attempt in range(APPEND_RETRIES):
            if attempt:
                # Racing writers without an expectation: back off with jitter, so that
                # each of them eventually appends instead of colliding in lockstep.
                time.sleep(random.uniform(0, min(0.2, 0.005 * 2**attempt)))
            start = self._length(run_id) if expected is None else expected
            stored = self._stored(run_id, start, records)
            try:
                self._insert_unsure(run_id, stored)
                return start
            except _Conflict:
                if expected is not None:
                    raise TimelineConflict(
                        f"run {run_id}: another writer appended past {expected} records"
                    ) from None
        raise TimelineConflict(f"run {run_id}: lost {APPEND_RETRIES} append races in a row")

    def _insert_unsure(self, run_id: str, stored: list[StoredEvent]) -> None:
        """One insert; one that failed after it may have committed is remembered (``_unsure``)."""
        try:
            self._within(
                functools.partial(self._insert, stored), TimelineWriteFailed, f"cannot append to run {run_id}"
            )
        except TimelineWriteFailed:
            if not stored:
                raise
            lost = _Unsure(stored[0].originator_version - 1, _content(stored))
            with self._folded_lock:
                kept = [u for u in self._unsure.pop(run_id, []) if u != lost] + [lost]
                self._unsure[run_id] = kept[-UNSURE_PER_RUN:]
                while len(self._unsure) > FOLDED_RUNS:
                    self._unsure.popitem(last=False)
            raise
        if not stored:
            return
        first, end = stored[0].originator_version - 1, stored[-1].originator_version
        with self._folded_lock:  # this insert took those positions: a lost one starting there never landed
            kept = [u for u in self._unsure.get(run_id, []) if not first <= u.start < end]
            if kept:
                self._unsure[run_id] = kept
            else:
                self._unsure.pop(run_id, None)

    def _forget(self, run_id: str, unsure: _Unsure) -> None:
        """``unsure`` is settled: forget it (and the run, when nothing else of it is unsure)."""
        with self._folded_lock:
            kept = [u for u in self._unsure.get(run_id, []) if u != unsure]
            if kept:
                self._unsure[run_id] = kept
            else:
                self._unsure.pop(run_id, None)

    def _settle(self, run_id: str, records: Sequence[Record], expected: int | None) -> int | None:
        """The retry of an append whose answer was lost: insert at the position the lost one
        took. It lands there, or finds the lost one there (it had committed: nothing more is
        written), or finds another writer's records there (the lost one never landed, and no
        longer can: that position is taken). The start used, or None: append as usual.
        Each lost insert of the run is its own (two callers may each have lost one)."""
        with self._folded_lock:
            lost = list(self._unsure.get(run_id, []))
        if not lost:
            return None  # the usual append: no record encoded twice
        content = _content(self._stored(run_id, 0, records))
        unsure = next(
            (u for u in lost if u.content == content and (expected is None or expected == u.start)), None
        )
        if unsure is None:
            return None  # other records (or another position): not a retry of a lost append
        stored = self._stored(run_id, unsure.start, records)
        try:
            self._insert_unsure(run_id, stored)
            return unsure.start
        except _Conflict:
            pass
        there = self._within(
            lambda: self._select(run_id, gt=unsure.start or None, limit=len(stored)),
            TimelineWriteFailed,
            f"cannot read run {run_id} to append",
        )
        self._forget(run_id, unsure)
        if _content(there) == unsure.content:
            return unsure.start  # the lost append had landed
        if expected is not None:
            raise TimelineConflict(f"run {run_id}: another writer appended past {expected} records")
        return None

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
        self._take_slot("cannot list the queued runs")  # in line with every call (ADR 0010)
        try:
            alarm = ALARMS.arm(self.call_seconds + CUT_GRACE, lambda: self._cutter.cut(thread))
            try:
                return call()
            except Exception as error:  # any driver's error: sqlite3, psycopg
                raise TimelineUnreadable(f"cannot list the queued runs: {error}") from error
            finally:
                alarm.disarm()
        finally:
            self._slots.release()

    def _insert(self, stored: list[StoredEvent]) -> None:
        try:
            self._insert_events(stored)
        except IntegrityError:
            raise _Conflict from None


def _trusted(snap: tuple[int, dict[str, Any]] | None) -> ScratchState | None:
    """The snapshot's state when this build can trust it (its position is its length)."""
    if snap is None:
        return None
    state = state_from_data(snap[1])
    return state if state is not None and state.records == snap[0] else None


@attrs.frozen
class _Unsure:
    """An insert at ``start`` whose answer was lost: it may have committed ``content``."""

    start: int
    content: tuple[tuple[str, bytes], ...]


def _content(stored: Sequence[StoredEvent]) -> tuple[tuple[str, bytes], ...]:
    """What an insert writes, positions aside: each record's topic and state."""
    return tuple((event.topic, bytes(event.state)) for event in stored)


class _Conflict(Exception):
    """The unique (stream, version) constraint said no: another writer won (internal)."""
