"""Every call has a deadline (T8, T14, X5): a stalled transport fails in time, by name.

The stall checker shipped in ``scratchbank.testing.contracts`` runs against the local
sandbox, Docker, Podman, the Kubernetes double, S3 (through a loopback TCP proxy
that stops forwarding mid-transfer) and the timeline: PostgreSQL through a proxy
that stops forwarding and under a table lock held elsewhere, SQLite under a write
lock held elsewhere; the times it measured are printed (pytest -s).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import attrs
import boto3
import pytest
from async_engine import bank_at_teardown_shielded
from rigs import rig

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.exec_output import ExecResult
from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.s3_bank import S3BankStore
from scratchbank.adapters.scripted import ARCHIVE, BANK, Exec
from scratchbank.application.cancellation import Deadline
from scratchbank.application.retry import Budget, Pauses, retry_within
from scratchbank.application.teardown import Budgets
from scratchbank.domain.errors import (
    BankReadFailed,
    BankWriteFailed,
    ExecFailed,
    TimelineUnreadable,
    TimelineWriteFailed,
)
from scratchbank.domain.records import ScratchBanked
from scratchbank.testing.builders import started
from scratchbank.testing.clocks import ManualClock
from scratchbank.testing.contracts import check_sandbox_stalls, check_stall

STALL_SECONDS = 2.0
TIMES: dict[str, dict[str, float]] = {}


@pytest.mark.parametrize("engine", ["local", "docker-busybox", "podman-busybox", "k8s-double"])
def test_T8_X5_a_stalled_exec_or_stream_fails_in_time_on_every_transport(engine: str) -> None:
    with rig(engine) as r:
        times = check_sandbox_stalls(r.sandbox, seconds=STALL_SECONDS, grace=5.0)
    TIMES[engine] = times
    for what, took in times.items():
        if what != "stream in fails":
            assert took >= STALL_SECONDS * 0.9, f"{what} failed before its deadline: not a stall test"
    print(f"\nstall times {TIMES}")


# ---- S3 through a proxy that stops forwarding mid-transfer ---------------------------


class StallingProxy:
    """A loopback TCP proxy that forwards ``budget`` bytes each way per connection (all of
    them when None) until ``stall()``, then swallows what it receives: the sockets stay
    open, a network that stops forwarding, not a reset."""

    def __init__(self, host: str, port: int, *, budget: int | None = None) -> None:
        self.upstream = (host, port)
        self.budget = budget
        self.stalled = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self) -> None:
        self.stalled.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            self.open += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        left = self.budget
        try:
            while data := src.recv(1 << 16):
                if self.stalled.is_set() or (left is not None and left <= 0):
                    continue  # swallowed: the stall
                dst.sendall(data if left is None else data[:left])
                left = None if left is None else left - len(data)
        except OSError:
            return

    def close(self) -> None:
        self.server.close()
        for s in self.open:
            s.close()


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> tuple[str, str]:
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id="k",
        aws_secret_access_key="s",
        region_name="us-east-1",
    )
    bucket = "stall-" + uuid.uuid4().hex[:10]
    client.create_bucket(Bucket=bucket)
    return s3_endpoint, bucket


@pytest.fixture
def through_proxy(s3_bucket: tuple[str, str]) -> Iterator[tuple[S3BankStore, S3BankStore]]:
    """(a store straight to S3, the same store through a proxy that stalls mid-transfer)."""
    endpoint, bucket = s3_bucket
    host, port = endpoint.removeprefix("http://").split(":")
    proxy = StallingProxy(host, int(port), budget=256 << 10)
    keys = {"aws_access_key_id": "k", "aws_secret_access_key": "s", "region_name": "us-east-1"}
    direct = S3BankStore(bucket, client=boto3.client("s3", endpoint_url=endpoint, **keys))
    stalled = S3BankStore(bucket, endpoint_url=proxy.url)
    stalled.client = boto3.client("s3", endpoint_url=proxy.url, config=stalled.client.meta.config, **keys)
    try:
        yield direct, stalled
    finally:
        proxy.close()


class _Endless(io.RawIOBase):
    """A stdin source that never ends (a restore's stream the script stops reading)."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        buffer[:] = b"x" * len(buffer)
        return len(buffer)


@pytest.mark.parametrize("engine", ["local", "docker-busybox", "podman-busybox", "k8s-double"])
def test_X2_a_command_that_exits_without_reading_its_stdin_ends_with_its_own_status(engine: str) -> None:
    """A restore refused before it reads its stream (no room, a mount point) exits at once:
    its exit status is the answer, never a cut at the deadline while the host still tries
    to send a stream nobody reads (Docker kept the hijacked socket open: 80 s per refusal)."""
    with rig(engine) as r:
        deadline = Deadline.after(60)
        done = r.sandbox.run("exit 21", [], stdin=_Endless(), deadline=deadline)  # type: ignore[arg-type]
        assert done.exit_code == 21
        # Not a speed goal: the exec must not have sat out its deadline (60 s) waiting on a
        # send nobody reads; an exec here takes a few seconds at most, even on a loaded machine.
        assert deadline.left() > 30, "the exec waited for its deadline after the command exited"


def test_X5_a_fetch_whose_stream_stalls_mid_object_fails_in_time(
    through_proxy: tuple[S3BankStore, S3BankStore], tmp_path: Path
) -> None:
    direct, stalled = through_proxy
    bank = tmp_path / "bank.tgz"
    bank.write_bytes(bytes(range(256)) * (16 << 10))  # 4 MiB, far past the proxy's 256 KiB
    name = direct.put("run-1", bank, sha256=hashlib.sha256(bank.read_bytes()).hexdigest())
    took = check_stall(
        lambda d: stalled.fetch("run-1", io.BytesIO(), max_bytes=1 << 30, name=name, deadline=d),
        seconds=STALL_SECONDS,
        expect=(BankReadFailed,),
    )
    TIMES["s3"] = {**TIMES.get("s3", {}), "fetch stalls": took}
    print(f"\nstall times {TIMES}")


def test_T8_T10_an_upload_that_stalls_mid_object_fails_in_time(
    through_proxy: tuple[S3BankStore, S3BankStore], tmp_path: Path
) -> None:
    _, stalled = through_proxy
    bank = tmp_path / "bank.tgz"
    bank.write_bytes(bytes(range(256)) * (16 << 10))
    took = check_stall(
        lambda d: stalled.put(
            "run-1", bank, sha256=hashlib.sha256(bank.read_bytes()).hexdigest(), deadline=d
        ),
        seconds=STALL_SECONDS,
        expect=(BankWriteFailed,),
    )
    TIMES["s3"] = {**TIMES.get("s3", {}), "put stalls": took}
    print(f"\nstall times {TIMES}")


# ---- the teardown under its shield does not hang on a stuck exec ------------------


class StuckArchive(LocalSandbox):
    """A real local sandbox whose tar never ends (a hung filesystem): its transport's
    deadline must cut it."""

    def execute(self, exec_: Exec) -> ExecResult:
        source = exec_.source
        if source in (ARCHIVE, BANK):  # the bank's one exec quiesces, then its tar hangs
            tar = 'archive_scratch "$1" "$2" "$verify"'
            source = "sleep 1000" if source == ARCHIVE else source.replace(tar, "exec sleep 1000")
        return super().execute(attrs.evolve(exec_, source=source))


def test_T7_T8_a_stuck_exec_under_the_shield_does_not_hold_the_teardown_for_ever() -> None:
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-1", [started()])
    box = StuckArchive()
    box.run('mkdir -p "$1" && echo x > "$1/f"', [box.facts.scratch])
    started_at = time.monotonic()
    try:
        report = asyncio.run(
            bank_at_teardown_shielded(
                run_id="run-1",
                timeline=timeline,
                store=store,
                sandbox=box,
                run_finished=False,
                budgets=Budgets(banking_seconds=2.0, first_pause=0.5),
            )
        )
    finally:
        box.destroy()
    took = time.monotonic() - started_at
    assert took < 20, f"the teardown took {took:.1f} s"
    rec = timeline.read("run-1")[-1]
    assert isinstance(rec, ScratchBanked) and rec.unknown and "deadline" in rec.reason
    assert report.recorded and store.only("run-1") is None


# ---- the one retry helper ---------------------------------------------------------


def test_T8_pauses_double_and_are_capped() -> None:
    pauses = iter(Pauses(1.0, 8.0))
    assert [next(pauses) for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_T8_retry_within_a_budget_tries_until_it_runs_out_then_raises_the_last_error() -> None:
    clock = ManualClock()
    calls: list[float] = []

    def flaky(deadline: Deadline) -> str:
        calls.append(deadline.left())
        raise ExecFailed(f"blip {len(calls)}")

    with pytest.raises(ExecFailed, match="blip 4"):
        retry_within(Budget.start(clock, 10.0), flaky, retry_on=(ExecFailed,))
    assert clock.slept == [1.0, 2.0, 4.0]  # 7 s slept; another 8 s pause would pass 10 s
    assert all(left >= 1.0 for left in calls)  # each call had a deadline from the budget


def test_T8_errors_a_retry_cannot_cure_are_raised_at_once() -> None:
    clock = ManualClock()

    def bug(deadline: Deadline) -> str:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        retry_within(Budget.start(clock, 30.0), bug, retry_on=(ExecFailed,))
    assert clock.slept == []


def test_a_deadline_gives_each_call_what_is_left_of_its_budget() -> None:
    clock = ManualClock()
    budget = Budget.start(clock, 30.0)
    clock.advance(25.0)
    assert 4.0 < budget.call_deadline().left() <= 5.0
    assert budget.call_deadline(cap=2.0).left() <= 2.0
    clock.advance(10.0)
    assert budget.call_deadline().left() >= 0.9  # never a call with no time at all


# ---- the timeline: appends and reads end by their deadline (PostgreSQL, SQLite) ---------


TIMELINE_SECONDS = 2.0


@pytest.fixture
def pg_database(postgres_url: str) -> str:
    import psycopg

    name = "stall_" + uuid.uuid4().hex[:12]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres_url.rsplit("/", 1)[0] + "/" + name


@pytest.mark.postgres
def test_T8_R15_a_postgres_that_stops_answering_fails_reads_and_appends_in_time(pg_database: str) -> None:
    """Through a proxy that stops forwarding: the server's timeouts never reach us, the
    client cut does: a read is TimelineUnreadable, an append TimelineWriteFailed."""
    parsed = urlparse(pg_database)
    proxy = StallingProxy(parsed.hostname or "127.0.0.1", parsed.port or 5432)
    url = parsed._replace(netloc=f"{parsed.username or 'postgres'}@127.0.0.1:{proxy.port}").geturl()
    timeline = EventStoreTimeline(url, call_seconds=TIMELINE_SECONDS)
    try:
        timeline.append("run-1", [started()])
        proxy.stall()
        read = check_stall(
            lambda d: timeline.read("run-1"), seconds=TIMELINE_SECONDS, expect=(TimelineUnreadable,)
        )
        append = check_stall(
            lambda d: timeline.append("run-1", [started()], expected=1),
            seconds=TIMELINE_SECONDS,
            expect=(TimelineWriteFailed,),
        )
    finally:
        proxy.close()
        timeline.close()  # never left to a garbage collection in another test's thread
    TIMES["postgres"] = {**TIMES.get("postgres", {}), "read stalls": read, "append stalls": append}
    print(f"\nstall times {TIMES}")


@pytest.mark.postgres
def test_T8_a_postgres_table_lock_held_elsewhere_fails_appends_and_reads_in_time(pg_database: str) -> None:
    """Another connection holds the events table: lock_timeout / statement_timeout end the
    call on the server, by name."""
    import psycopg

    timeline = EventStoreTimeline(pg_database, call_seconds=TIMELINE_SECONDS)
    timeline.append("run-1", [started()])
    with psycopg.connect(pg_database) as holder:
        (table,) = [
            r[0]
            for r in holder.execute(
                "select tablename from pg_tables where schemaname = 'public' and tablename not like '%snapshot%'"
            )
        ]
        holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")  # held until the block ends
        append = check_stall(
            lambda d: timeline.append("run-1", [started()], expected=1),
            seconds=TIMELINE_SECONDS,
            expect=(TimelineWriteFailed,),
        )
        read = check_stall(
            lambda d: timeline.read("run-1"), seconds=TIMELINE_SECONDS, expect=(TimelineUnreadable,)
        )
        with pytest.raises(TimelineWriteFailed, match=r"lock timeout|statement timeout"):
            timeline.append("run-1", [started()], expected=1)  # the server ended it, not our cut
        holder.rollback()
    assert [r.WIRE for r in timeline.read("run-1")] == ["run_started"]  # nothing half-written
    timeline.close()
    TIMES["postgres"] = {**TIMES.get("postgres", {}), "lock held, append": append, "lock held, read": read}
    print(f"\nstall times {TIMES}")


def test_T8_a_sqlite_write_lock_held_elsewhere_fails_appends_in_time(tmp_path: Path) -> None:
    """Another process's write transaction holds the file: the busy timeout ends the append."""
    path = tmp_path / "t.db"
    timeline = EventStoreTimeline(f"sqlite:///{path}", call_seconds=TIMELINE_SECONDS)
    timeline.append("run-1", [started()])
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        append = check_stall(
            lambda d: timeline.append("run-1", [started()], expected=1),
            seconds=TIMELINE_SECONDS,
            expect=(TimelineWriteFailed,),
        )
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert [r.WIRE for r in timeline.read("run-1")] == ["run_started"]
    TIMES["sqlite"] = {"lock held, append": append}  # reads (WAL) never wait on a writer
    print(f"\nstall times {TIMES}")
