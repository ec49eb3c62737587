"""Rules T: teardown: banking the scratch when a sandbox stops. The engines tier's tests of T6, T7, T8,
T10, T11, T12, T13, T14, T15, T16, T17, T18, T19 (tests/tiers.py: a file of tests/rules/ has its
tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import shutil
import sqlite3
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
from async_engine import bank_at_teardown_shielded
from hostile import gz
from rigs.counted_teardowns import END_THE_EXEC, ONE_EXEC, Stalls, bank, counted, names, stopped, wait_for
from rigs.forked_child import _deep_unique, in_child
from rigs.hostile_sandbox import FRAMING, TRANSPORTS, started_execs, unread
from rigs.real_sandboxes import CONTAINERS, Rig, host_sleep, kept_containers, rig  # noqa: F401 - a fixture
from rigs.s3_buckets import new_bucket, s3_client
from rigs.sandbox_probes import (
    _members,
    any_rig,  # noqa: F401 - a fixture
    frozen,
    grows,
    kept_rig,  # noqa: F401 - a fixture
    running,
    wait_until_written,
    writer,
)
from rigs.stalls import (
    STALL_SECONDS,
    TIMELINE_SECONDS,
    TIMES,
    StallingProxy,
    StuckArchive,
    pg_database,  # noqa: F401 - a fixture
    s3_bucket,  # noqa: F401 - a fixture
    through_proxy,  # noqa: F401 - a fixture
)
from waiting import eventually

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.s3_bank import S3BankStore
from scratchbank.adapters.script_reports import QuiesceHead, bank_status, read_tar_stderr
from scratchbank.adapters.scripted import QUIESCE, Exec
from scratchbank.application.cancellation import Cancel, Deadline
from scratchbank.application.ports import QuiescedArchive, QuiesceReport
from scratchbank.application.retry import Budget, Pauses, retry_within
from scratchbank.application.teardown import Budgets
from scratchbank.domain.errors import (
    BankWriteFailed,
    ExecFailed,
    SandboxGone,
    StreamBroken,
    TimelineUnreadable,
    TimelineWriteFailed,
)
from scratchbank.domain.records import ScratchBanked
from scratchbank.testing.builders import started
from scratchbank.testing.clocks import ManualClock
from scratchbank.testing.contracts import check_sandbox_stalls, check_stall

# ---- from tests/rules/test_[TX]*.py: Findings of an independent attack on the restore path (issue 10's promises), each a test that fails on the ``attack`` branch as it stands and passes once the hole is closed.


def test_T6_implicit_parents_do_not_fill_the_hosts_temp_disk() -> None:
    """Each member's 126 implicit parents become 126 rows of the member log (bank_format/spill_log.py),
    each holding its whole path (up to 4 KB) twice (table and UNIQUE index): ~800 KB of
    SQLite temp file per 5 KB member. 200 members (a 4 KB gzip bank, 1 MB of tar) cost
    ~160 MB of the host's temp disk and ~6 s; 1,000 members (21 KB gzip) 810 MB and 33 s;
    the 200k member cap (~4 MB gzip) would need ~160 GB and hours, at bank time
    (HostArchive, T6) and again at every restore. Here the teardown's host check runs
    with its files limited to 32 MiB (RLIMIT_FSIZE) and must still accept the bank."""
    import resource
    import signal

    from scratchbank.application.bank_format.host_archive import HostArchive

    data = gz(_deep_unique(200))
    assert len(data) < 8_000
    out = Path(tempfile.mkdtemp(prefix="sb-attack-")) / "bank.tgz"

    def bank_time() -> object:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (32 << 20, 32 << 20))
        sink = HostArchive(out, gzipped_input=True, gzip_level=1, cap=1 << 28)
        sink.write(data)
        facts = sink.finish()
        return facts.refused or "accepted"

    try:
        answer = in_child(bank_time, timeout=120.0)
    finally:
        shutil.rmtree(out.parent)
    assert answer == {"result": repr("accepted")}, answer


# ---- from tests/contracts/test_bank_store_contract.py: The BankStore contract against every adapter, and each adapter's own edges.


@pytest.mark.s3
def test_T10_a_large_archive_streams_up_and_back(s3_endpoint: str, tmp_path: Path) -> None:
    """A large archive streams up and back: ``scratchbank.adapters.s3_bank.S3BankStore``."""
    store = S3BankStore(new_bucket(s3_endpoint), client=s3_client(s3_endpoint))
    src = tmp_path / "big.tgz"
    block = os.urandom(1 << 20)
    with open(src, "wb") as f:
        for _ in range(20):
            f.write(block)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    name = store.put("run-big", src, sha256=digest)
    out = tmp_path / "back.tgz"
    with open(out, "wb") as f:
        got = store.fetch("run-big", f, max_bytes=1 << 30, name=name)
    assert got.sha256 == digest and got.bytes == 20 << 20


# ---- from tests/contracts/test_sandbox_contract.py: The shipped contract suites and checkers, run against every adapter we ship: the Sandbox contract on the fake, local, Docker, Podman and the Kubernetes double (T2, T4, T14, T15, T19); ``check_bank_store`` on memory, filesystem and S3; ``check_timeline`` on memory and SQLite (PostgreSQL runs the class suite in test_timeline_stores).


def test_T15_tar_runs_untranslated_whatever_the_callers_locale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tar that would speak French is run with LC_ALL=C: its race lines stay readable.
    Proves ``scratchbank.application.ports.Sandbox.archive``."""
    shims = tmp_path / "shims"
    shims.mkdir()
    seen = tmp_path / "seen-locale"
    real_tar = "/bin/tar" if Path("/bin/tar").exists() else "/usr/bin/tar"
    shim = shims / "tar"
    shim.write_text(f'#!/bin/sh\necho "$LC_ALL|${{LANG:-}}" > {seen}\nexec {real_tar} "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{shims}:{os.environ['PATH']}")
    monkeypatch.setenv("LC_ALL", "fr_FR.UTF-8")
    monkeypatch.setenv("LANG", "fr_FR.UTF-8")
    with rig("local") as r:
        r.sh(f"mkdir -p {r.scratch} && echo x > {r.scratch}/f")
        assert not r.sandbox.archive(io.BytesIO(), compress=False, verify=False).empty
    assert seen.read_text().split("|")[0] == "C"


# ---- from tests/test_deadlines.py: Every call has a deadline (T8, T14, X5): a stalled transport fails in time, by name.


@pytest.mark.parametrize("engine", ["local", "docker-busybox", "podman-busybox", "k8s-double"])
def test_T8_X5_a_stalled_exec_or_stream_fails_in_time_on_every_transport(engine: str) -> None:
    """A stalled exec or stream fails in time on every transport: ``scratchbank.adapters.exec_pump.pump``."""
    with rig(engine) as r:
        times = check_sandbox_stalls(r.sandbox, seconds=STALL_SECONDS, grace=5.0)
    TIMES[engine] = times
    for what, took in times.items():
        if what != "stream in fails":
            assert took >= STALL_SECONDS * 0.9, f"{what} failed before its deadline: not a stall test"
    print(f"\nstall times {TIMES}")


def test_T8_T10_an_upload_that_stalls_mid_object_fails_in_time(
    through_proxy: tuple[S3BankStore, S3BankStore], tmp_path: Path
) -> None:
    """An upload that stalls mid object fails in time: ``scratchbank.adapters.s3_bank.S3BankStore.put``."""
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


def test_T7_T8_a_stuck_exec_under_the_shield_does_not_hold_the_teardown_for_ever() -> None:
    """A stuck exec under the shield does not hold the teardown for ever:
    ``scratchbank.application.teardown.bank_at_teardown``."""
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


def test_T8_pauses_double_and_are_capped() -> None:
    """Pauses double and are capped: ``scratchbank.application.retry.Pauses``."""
    pauses = iter(Pauses(1.0, 8.0))
    assert [next(pauses) for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_T8_retry_within_a_budget_tries_until_it_runs_out_then_raises_the_last_error() -> None:
    """Retry within a budget tries until it runs out then raises the last error:
    ``scratchbank.application.retry.retry_within``."""
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
    """Errors a retry cannot cure are raised at once: ``scratchbank.application.retry.retry_within``."""
    clock = ManualClock()

    def bug(deadline: Deadline) -> str:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        retry_within(Budget.start(clock, 30.0), bug, retry_on=(ExecFailed,))
    assert clock.slept == []


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
    call on the server, by name. Proves ``scratchbank.adapters.event_store.EventStoreTimeline``."""
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
    """Another process's write transaction holds the file: the busy timeout ends the append.
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline``."""
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


# ---- from tests/test_sandboxes.py: The sandbox adapters and their in-sandbox scripts, against real engines (T11-T18, X2).


def test_T11_sandboxes_read_as_process_isolated(kept_rig: Rig) -> None:
    """Sandboxes read as process isolated: ``scratchbank.application.ports.SandboxFacts``."""
    facts = kept_rig.sandbox.facts
    assert facts.process_isolated, facts.isolation
    assert not facts.host_backed


def test_T12_quiesce_freezes_a_writer_and_continue_lets_it_run_again(any_rig: Rig) -> None:
    """Quiesce freezes a writer and continue lets it run again:
    ``scratchbank.application.ports.Sandbox.quiesce``."""
    path = writer(any_rig)
    report = any_rig.sandbox.quiesce(budget_seconds=30, wait_seconds=2)
    try:
        assert report.quiesced, report
        assert report.stopped >= 1
        assert frozen(any_rig, path)
    finally:
        any_rig.sandbox.continue_processes()
    grows(any_rig, path)


def test_T12_a_process_started_after_the_first_stop_is_stopped_too(any_rig: Rig) -> None:
    """A loop that keeps forking new writers: every round stops what started since.
    Proves ``scratchbank.adapters.local_sandbox.LocalSandbox.spawn``."""
    r = any_rig
    r.sh(f"mkdir -p {r.scratch}")
    path = f"{r.scratch}/forks"
    r.spawn(f"while :; do (echo x >> {path}; sleep 0.2) & sleep 0.01; done")
    wait_until_written(r, path)
    report = r.sandbox.quiesce(budget_seconds=30, wait_seconds=2)
    try:
        assert report.quiesced, report
        assert running(r, path) == [], report
    finally:
        r.sandbox.continue_processes()


@pytest.mark.parametrize("engine", ["docker-busybox", "podman-busybox"])
def test_T12_host_pid_namespace_is_refused_before_any_signal(engine: str) -> None:
    """In a --pid=host container the script refuses; a canary on the VM is never stopped.

    The quiesce runs as nobody, and so does the canary, so that a broken guard could
    stop nothing but the canary.
     Proves ``scratchbank.application.ports.Sandbox.quiesce``."""
    canary = host_sleep(120)
    try:
        with rig(engine, pid_mode="host") as r:
            assert not r.sandbox.facts.process_isolated
            r.sandbox.admin_user = "65534"
            report = r.sandbox.quiesce(budget_seconds=5, wait_seconds=1)
            assert report.refused and not report.quiesced, report
            assert "initial PID namespace" in " ".join(report.reasons)
            state = Path(f"/proc/{canary.pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
            assert state != "T"
    finally:
        canary.kill()
        canary.wait()


@pytest.mark.parametrize("engine", CONTAINERS)
def test_T13_a_process_of_another_user_is_reported_unquiesced(engine: str) -> None:
    """A process of another user is reported unquiesced: ``scratchbank.application.ports.Sandbox.quiesce``."""
    with rig(engine) as r:
        path = writer(r)
        r.sandbox.admin_user = "65534"
        report = r.sandbox.quiesce(budget_seconds=10, wait_seconds=1)
        r.sandbox.admin_user = "0"
        r.sandbox.continue_processes()
        assert not report.quiesced and not report.refused, report
        assert any("another user" in why for why in report.reasons), report
        grows(r, path)


@pytest.mark.parametrize("engine", ["docker-busybox", "docker-gnu", "podman-gnu"])
def test_T13_a_writer_that_is_pid_1_means_unquiesced(engine: str) -> None:
    """PID 1 writes with builtins only (one that forks a ``sleep`` waits on it once the
    quiesce stopped it: then it is idle, and its counters say so, ADR 0008)."""
    spin = "i=0; while [ $i -lt 300 ]; do i=$((i + 1)); done"
    loop = f"mkdir -p /tmp/iterion-scratch; while :; do echo x >> /tmp/iterion-scratch/w; {spin}; done"
    with rig(engine, command=["sh", "-c", loop]) as r:
        wait_until_written(r, "/tmp/iterion-scratch/w")
        report = r.sandbox.quiesce(budget_seconds=10, wait_seconds=1)
        r.sandbox.continue_processes()
        assert not report.quiesced, report
        assert any("pid 1 (sh)" in why for why in report.reasons), report


def test_T13_a_proc_that_hides_other_users_processes_means_unquiesced() -> None:
    """/proc mounted hidepid: the script cannot check every process, and says so.
    Proves ``scratchbank.application.ports.Sandbox.quiesce``."""
    with rig("local") as r:
        writer(r)
        r.sh("mount -o remount,hidepid=2 /proc")
        report = r.sandbox.quiesce(budget_seconds=10, wait_seconds=1)
        r.sandbox.continue_processes()
        assert not report.quiesced and not report.refused, report
        assert any("hidepid" in why for why in report.reasons), report


def test_T13_a_multithreaded_writer_is_stopped_whole() -> None:
    """Every thread of a writer is checked, not just its main thread.
    Proves ``scratchbank.adapters.local_sandbox.LocalSandbox.spawn``."""
    with rig("local") as r:
        r.sh(f"mkdir -p {r.scratch}")
        path = f"{r.scratch}/threads"
        code = (
            "import threading,time\n"
            "def w():\n"
            f"    f=open('{path}','a')\n"
            "    while True: f.write('x'*4096); f.flush()\n"
            "[threading.Thread(target=w).start() for _ in range(3)]\n"
            "time.sleep(1000)\n"
        )
        Path(r.scratch, "w.py").write_text(code)
        r.spawn(f"python3 {r.scratch}/w.py")
        wait_until_written(r, path)  # python3 starts slowly on a loaded machine
        report = r.sandbox.quiesce(budget_seconds=10, wait_seconds=2)
        try:
            assert report.quiesced, report
            assert frozen(r, f"{r.scratch}/w.py")
        finally:
            r.sandbox.continue_processes()


def test_T14_the_watchdog_continues_when_the_banking_side_never_comes_back(any_rig: Rig) -> None:
    """The watchdog continues when the banking side never comes back:
    ``scratchbank.application.ports.Sandbox.quiesce``."""
    path = writer(any_rig)
    report = any_rig.sandbox.quiesce(budget_seconds=2, wait_seconds=1)
    assert report.quiesced, report
    assert frozen(any_rig, path)
    grows(any_rig, path)  # nobody says "cont": the watchdog's budget runs out, it continues them


def test_T17_T18_archive_through_a_link_and_an_empty_scratch(kept_rig: Rig) -> None:
    """Archive through a link and an empty scratch:
    ``scratchbank.application.bank_format.reader.TarReader``."""
    r = kept_rig
    real = f"{r.scratch}-real"
    r.sh(
        f"rm -rf {r.scratch} {real}; mkdir -p {real}/sub && echo data > {real}/sub/f && ln -s {real} {r.scratch}"
    )
    out = io.BytesIO()
    report = r.sandbox.archive(out, compress=False, verify=False)
    names = [m.path for m in _members(out.getvalue())]
    assert not report.empty and "sub/f" in names
    r.sh(f"rm -rf {r.scratch} {real}; mkdir -p {r.scratch}")
    assert r.sandbox.archive(io.BytesIO(), compress=False, verify=False).empty
    r.sh(f"rm -rf {r.scratch}")
    assert r.sandbox.archive(io.BytesIO(), compress=True, verify=False).empty


def test_T17_a_socket_in_the_scratch_is_neutral() -> None:
    """A socket in the scratch is neutral: ``scratchbank.application.ports.Sandbox.archive``."""
    import socket

    with rig("local") as r:
        r.sh(f"mkdir -p {r.scratch} && echo x > {r.scratch}/f")
        s = socket.socket(socket.AF_UNIX)
        s.bind(f"{r.scratch}/sock")
        try:
            report = r.sandbox.archive(io.BytesIO(), compress=False, verify=False)
            assert not report.empty and report.raced == ()
        finally:
            s.close()


def test_T16_a_writer_racing_an_unquiesced_tar_is_named(any_rig: Rig) -> None:
    """Without quiesce, a file growing while tar reads is named as raced on both tars.
    Proves ``scratchbank.adapters.local_sandbox.LocalSandbox.spawn``."""
    r = any_rig
    r.sh(f"mkdir -p {r.scratch} && dd if=/dev/zero of={r.scratch}/big bs=1M count=40 2>/dev/null")
    r.spawn(f"while :; do echo x >> {r.scratch}/big; done")
    raced: tuple[str, ...] = ()
    for _ in range(5):
        raced = r.sandbox.archive(io.BytesIO(), compress=False, verify=True).raced
        if raced:
            break
    assert "./big" in raced


def test_T19_a_sandbox_that_is_gone_is_named() -> None:
    """A sandbox that is gone is named: ``scratchbank.application.ports.Sandbox.archive``."""
    with rig("docker-busybox") as r:
        sandbox = r.sandbox
    with pytest.raises(SandboxGone):
        sandbox.archive(io.BytesIO(), compress=False, verify=False)


# ---- from tests/rules/test_T_engines.py: Teardown banking on real sandboxes: the quiesced bank is one exec (quiesce, archive and continue in bank.sh), and its processes run again whatever happens to it (T11, T14).


@pytest.mark.parametrize("engine", ONE_EXEC)
def test_T11_T14_a_quiesced_clean_bank_is_one_exec_and_leaves_processes_running(engine: str) -> None:
    """Quiesce, archive and continue in one exec; nothing is left stopped.
    Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    with counted(engine) as (r, execs):
        report, store = bank(r.sandbox)
        assert names(execs) == ["bank"]
        assert report.record.banked
        assert not report.record.unquiesced
        assert report.quiesce is not None
        assert report.quiesce.quiesced
        assert report.quiesce.stopped >= 1
        assert store.only("run-1") is not None
        assert stopped(r) == []


@pytest.mark.parametrize("engine", ["local", "docker-busybox"])
def test_T14_an_archive_failure_after_a_quiesce_still_gets_processes_continued(engine: str) -> None:
    """tar cannot enter the scratch after the quiesce stopped everything: the failure is
    recorded with the quiesce, and the host continues the processes (the script leaves
    them to it). Proves ``scratchbank.application.teardown.bank_at_teardown``."""
    with counted(engine) as (r, execs):
        r.sh(f"rm -rf {r.scratch} && echo x > {r.scratch}")
        execs.clear()  # the local rig's commands are execs too
        report, store = bank(r.sandbox, bank_tries=1)
        assert names(execs) == ["bank", "quiesce"]  # the one exec, then the host's continue
        assert report.quiesce is not None
        assert report.quiesce.quiesced
        assert report.record.files_unbanked
        assert "cannot" in report.record.reason
        assert store.stored == {}
        assert stopped(r) == []


@pytest.mark.parametrize("engine", ["local", "k8s-double"])
def test_T14_the_watchdog_continues_when_the_one_exec_is_cut_mid_archive(engine: str) -> None:
    """The bank exec ends mid-archive (its shell and tar killed while the stream is held)
    and nobody says "cont": the watchdog the exec left behind continues the processes once
    its budget runs out. (Not on Docker: an exec killed while its stream is held keeps
    the daemon's next exec waiting for that stream; there the watchdog is the standalone
    quiesce's, test_sandboxes' T14, and a cut exec runs to its end and continues them.)
    Proves ``scratchbank.domain.errors.StreamBroken``."""
    with counted(engine) as (r, _execs):
        r.sh(f"head -c 30000000 /dev/urandom > {r.scratch}/big")
        sink = Stalls()
        answers: list[object] = []

        def bank_pass() -> None:
            try:
                answers.append(
                    r.sandbox.quiesce_and_archive(sink, budget_seconds=10, wait_seconds=1, compress=False)
                )
            except BaseException as error:
                answers.append(error)

        call = threading.Thread(target=bank_pass, daemon=True)
        call.start()
        assert sink.started.wait(60), "the tar stream never began"
        r.sh(END_THE_EXEC)
        assert stopped(r) != []  # nobody continued them: the watchdog's budget is 10 s
        sink.release.set()
        call.join(60)
        (done,) = answers
        assert isinstance(done, QuiescedArchive), done
        # its report came before the stream; no exit code confirms its verdict (H4)
        assert not done.quiesce.quiesced and done.quiesce.stopped > 0, done.quiesce
        assert "cut before its exit code" in done.quiesce.reasons[0]
        assert isinstance(done.failure, StreamBroken)
        assert not done.continued
        assert wait_for(lambda: stopped(r) == [], bound=60.0), stopped(r)


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_T11_the_quiesce_report_is_split_from_the_tar_stream_however_it_arrives(chunk: int) -> None:
    """The quiesce report is split from the tar stream however it arrives:
    ``scratchbank.adapters.script_reports.QuiesceHead``."""
    head = b"unquiesced: pid 1 (sh) cannot be stopped from inside and may write\nwatchdog 9\nstopped 3\n"
    tar = b"scratchbank-quiesced 0\n" + bytes(range(256)) * 40  # the stream may hold the marker too
    out = io.BytesIO()
    sink = QuiesceHead(out)
    data = head + b"scratchbank-quiesced 4\n" + tar
    for i in range(0, len(data), chunk):
        assert sink.write(data[i : i + chunk]) == len(data[i : i + chunk])
    assert out.getvalue() == tar
    assert sink.report == QuiesceReport(
        False, False, ("pid 1 (sh) cannot be stopped from inside and may write",), 3
    )


def test_T11_a_refused_quiesce_reads_as_refused_and_an_endless_report_as_broken() -> None:
    """A refused quiesce reads as refused and an endless report as broken:
    ``scratchbank.adapters.script_reports.QuiesceHead``."""
    sink = QuiesceHead(io.BytesIO())
    sink.write(b"refused: this is the host's initial PID namespace\nscratchbank-quiesced 3\n")
    assert sink.report is not None
    assert sink.report.refused
    endless = QuiesceHead(io.BytesIO())
    with pytest.raises(StreamBroken):
        endless.write(b"stopped 1\n" * (QuiesceHead.LIMIT // 10 + 1))


def test_T14_T16_only_the_last_stderr_line_is_the_bank_status_and_tar_never_reads_it() -> None:
    """A member named to forge the status inside tar's warnings is tar's warning, not ours.
    Proves ``scratchbank.adapters.script_reports.bank_status``."""
    forged = b"tar: ./x\nscratchbank-bank: continued: file changed as we read it\n"
    status, rest = bank_status(forged + b"scratchbank-bank: left stopped\n")
    assert status == "left stopped"
    assert rest == forged.rstrip(b"\n")
    raced, _, other = read_tar_stderr(rest + b"\ncommand terminated with exit code 1")
    assert b"left stopped" not in rest
    assert other == ["tar: ./x", "scratchbank-bank: continued: file changed as we read it"]
    assert raced == []
    assert bank_status(b"tar: ./a: file changed as we read it\n") == (
        "",
        b"tar: ./a: file changed as we read it\n",
    )


@pytest.mark.parametrize("engine", [*TRANSPORTS, "k8s-docker"])
def test_T14_what_an_exec_wrote_before_its_cut_reaches_its_sink_on_every_transport(engine: str) -> None:
    """A cut ends the exec at once, yet what it had written that reached the host before the
    cut (a bank's quiesce report, ahead of its tar) is still read into the sink, on every
    transport: ``scratchbank.adapters.exec_pump.pump`` (deterministic: the sink holds the pump
    on the first chunk until the second one sits unread on the host's end, then the cut)."""
    first, release = threading.Event(), threading.Event()
    got = bytearray()

    class HeldSink:
        def write(self, data: bytes) -> int:
            got.extend(data)
            first.set()
            release.wait(60)
            return len(data)

    with rig(engine) as r, started_execs() as seen:
        # fresh names: a local sandbox's /tmp is the host's, kept from run to run
        tag = uuid.uuid4().hex[:12]
        go, written = f"/tmp/go-{tag}", f"/tmp/written-{tag}"
        source = (
            'printf first; while [ ! -e "$1" ]; do sleep 0.01; done; printf second; : > "$2"; exec sleep 1000'
        )
        cancel, raised = Cancel(), []

        def call() -> None:
            try:
                r.sandbox.call(
                    Exec(source, [go, written], stdout=HeldSink(), deadline=Deadline.after(120, cancel))
                )
            except BaseException as error:
                raised.append(error)

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        try:
            assert first.wait(60), "the exec never wrote"
            (ours,) = [started for what, started in seen if what.source == source]
            r.sh(f": > {go}")
            eventually(
                lambda: r.sh(f"test -e {written} && echo yes", check=False).strip() == "yes",
                timeout=60,
                what="the second write",
            )
            need = len(b"second") + FRAMING[type(ours).__name__]
            eventually(lambda: unread(ours) >= need, timeout=60, what="the second write, unread on the host")
            cancel.cut("the refresh failed (LEASE_LOST): the run context is cancelled (L5)")
            release.set()
            caller.join(60)  # a bound for the test: an uncut exec sleeps 1000 s
            assert not caller.is_alive(), "the cut did not end the call"
        finally:
            release.set()
            r.sh(f"rm -f {go} {written}", check=False)
    assert bytes(got) == b"firstsecond"
    assert len(raised) == 1 and isinstance(raised[0], StreamBroken), raised


def _vfork_wait(tmp_path: Path, parent: str, wchan: str, children: dict[str, str]) -> int:
    """quiesce.sh's vfork_wait on process 12 (its wchan ``wchan``, read as ``parent`` when
    read again) whose children have the states ``children``, /proc reads stubbed: 0 when it
    takes the parent for frozen."""
    proc = tmp_path / "12"
    (proc / "task" / "12").mkdir(parents=True)
    (proc / "wchan").write_text(wchan)
    (proc / "task" / "12" / "children").write_text(" ".join(children) + " ")
    table = "".join(f"/proc/{pid}) st_state={state} ;; " for pid, state in children.items())
    stubs = f"""
read_status() {{ st_state=""; case $1 in {table} "{proc}") st_state={parent} ;; esac; [ -n "$st_state" ]; }}
vfork_wait "{proc}" 12
"""
    done = subprocess.run(["sh", "-c", "SCRATCHBANK_LIBRARY=1\n" + QUIESCE + stubs], check=False, timeout=60)
    return done.returncode


def test_T13_a_vfork_parent_whose_child_already_exited_is_not_taken_for_frozen(tmp_path: Path) -> None:
    """The podman-gnu flake of test_T13_a_process_of_another_user_is_reported_unquiesced: a root
    shell read in D (its vfork, wchan unreadable to another user) whose child, by the time its
    children were read, had exec'd, slept and exited (Z): the vfork was over, the shell ran on,
    yet the scan counted it frozen and reported nothing running. Only a stopped child (T) keeps
    its vfork parent frozen. Proves ``scratchbank.application.ports.Sandbox.quiesce``."""
    assert _vfork_wait(tmp_path / "a", "D", "0", {"103": "Z"}) == 1
    assert _vfork_wait(tmp_path / "b", "D", "0", {"103": "X"}) == 1
    assert _vfork_wait(tmp_path / "c", "D", "0", {"103": "T"}) == 0  # stopped before its exec: frozen
    assert _vfork_wait(tmp_path / "d", "D", "0", {"99": "Z", "103": "T"}) == 0  # an old zombie beside it
    assert _vfork_wait(tmp_path / "e", "S", "0", {"103": "T"}) == 1  # read again: no longer in its vfork
    assert _vfork_wait(tmp_path / "f", "D", "0", {"103": "S"}) == 1


@pytest.mark.postgres
def test_T8_lost_appends_of_one_run_on_postgres_settle_each_on_its_retry(pg_database: str) -> None:
    """PostgreSQL: one lost append had committed, the next one of the run had not and another
    writer took its place; each retry lands once (nothing written twice, no conflict).
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline.append``."""
    from eventsourcing.persistence import OperationalError

    from scratchbank.domain.records import NodeFinished, RunStarted
    from scratchbank.testing.builders import node

    timeline, other = EventStoreTimeline(pg_database), EventStoreTimeline(pg_database)
    try:
        timeline.append("run-1", [started()])
        real = timeline._insert_events

        def lost(*, lands: bool) -> None:
            def insert(stored: object) -> None:
                timeline._insert_events = real
                if lands:
                    real(stored)
                raise OperationalError("server closed the connection unexpectedly")

            timeline._insert_events = insert

        for name, lands in (("n1", True), ("n2", False)):
            lost(lands=lands)
            with pytest.raises(TimelineWriteFailed):
                timeline.append("run-1", [node(name)])
        other.append("run-1", [RunStarted()], expected=2)
        assert timeline.append("run-1", [node("n2")]) == 4
        assert timeline.append("run-1", [node("n1")]) == 2
        kinds = [type(r) for r in other.read("run-1")]
        assert kinds == [RunStarted, NodeFinished, RunStarted, NodeFinished]
    finally:
        timeline.close()
        other.close()
