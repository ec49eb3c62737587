"""Rules R: the resume gate: refuse or go on, before anything moves. The engines tier's tests of R9,
R10, R11, R12, R15 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from operator_rigs import RUN, TOKEN, cli, served
from rigs.queue_deployment import (
    ENGINE_REFUSES,
    SURFACE_REFUSES,
    _append,
    _checksum,
    _handled,
    _published,
    _records,
    _resume,
    _run,
    deployment,  # noqa: F401 - a fixture
    embedded,  # noqa: F401 - a fixture
)

from scratchbank.adapters.bootstrap import bootstrap, close
from scratchbank.adapters.config import settings_from
from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.http_api import ApiSettings
from scratchbank.application.service import ScratchService
from scratchbank.domain.admission import Consents
from scratchbank.domain.errors import TimelineUnreadable, TimelineWriteFailed
from scratchbank.domain.records import AttemptQueued, NodeFinished, ResumeRefused, ScratchRestored
from scratchbank.domain.resume_gate import ResumeRequest
from scratchbank.testing.builders import banked, started

# ---- from tests/test_surface_operator_findings.py: Issue 20's wrong results 1-7, each through the installed command or the real HTTP server: the named error, its exit status or HTTP status from the one table, its remedy in the surface's words, and nothing changed on disk by a refusal.


def test_R15_a_quiet_read_sees_a_writer_that_came_after_it_opened(tmp_path: Path) -> None:
    """The read-only timeline opened on a quiet file (immutable, no side files) reads the plain
    way once a writer holds the file: it sees the writer's records, still in the WAL.
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline``."""
    from scratchbank.adapters.event_store import EventStoreTimeline
    from scratchbank.testing.builders import node, started

    url = f"sqlite:///{tmp_path}/timeline.db"
    first = EventStoreTimeline(url)
    first.append(RUN, [started()])
    first.close()
    reader = EventStoreTimeline(url, read_only=True)
    try:
        assert len(reader.read(RUN)) == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == ["timeline.db"]
        writer = EventStoreTimeline(url)
        try:
            writer.append(RUN, [node("late", "tool")])  # in the WAL: the writer holds the file
            assert len(reader.read(RUN)) == 2
        finally:
            writer.close()
    finally:
        reader.close()


# ---- from tests/test_surface_queue.py: The operator surfaces publish resumes onto the runner's queue (issue #13 item 1).


def test_R10_cli_resume_publishes_and_a_runner_process_carries_the_run_on(deployment: dict[str, Any]) -> None:
    """`scratchbank resume` with a queue: queued, claimed by `scratchbank runner`, run to its
    gate and banked; resumed again: a new sandbox, the scratch restored, the run goes on.
    Proves ``scratchbank.adapters.bootstrap.open_home``."""
    d, run = deployment, _run()
    _append(d["home"], run, [started()])
    first = _resume(d, run)
    assert first.returncode == 0, first.stderr
    attempt = json.loads(first.stdout)["attempt"]
    assert json.loads(first.stdout)["queued"] is True
    assert _handled(d, run, attempt)["handled"] == "ran"
    queued = [r for r in _records(d["home"], run) if isinstance(r, AttemptQueued)]
    assert [q.attempt for q in queued] == [attempt]
    second = _resume(d, run)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["decision"]["verdict"] == "restore"
    assert _handled(d, run, json.loads(second.stdout)["attempt"])["handled"] == "ran"
    records = _records(d["home"], run)
    assert any(isinstance(r, ScratchRestored) and r.restored for r in records)
    measure = [r for r in records if isinstance(r, NodeFinished) and r.node == "measure"]
    assert measure and measure[0].succeeded


def test_R12_http_resume_is_queued_202_and_the_runner_logs_the_refusal_that_status_shows(
    deployment: dict[str, Any],
) -> None:
    """POST /resume over a queue answers 202 with the attempt; the detached runner refuses
    (R2) and writes it to the run's log; `status` (CLI and HTTP) shows it with remedy()'s hint."""
    d, run = deployment, _run()
    _append(d["home"], run, list(ENGINE_REFUSES))
    service = bootstrap(settings_from({"SCRATCHBANK_HOME": str(d["home"]), "SCRATCHBANK_QUEUE": d["url"]}))
    try:
        with served(service, ApiSettings(TOKEN)) as base:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            answer = httpx.post(f"{base}/runs/{run}/resume", json={}, headers=headers, timeout=60)
            assert answer.status_code == 202, answer.text
            attempt = answer.json()["attempt"]
            assert _handled(d, run, attempt)["handled"] == "refused"
            status = httpx.get(f"{base}/runs/{run}/status", timeout=60).json()
    finally:
        close(service)
    refusals = [r for r in _records(d["home"], run) if isinstance(r, ResumeRefused)]
    assert [(r.code, r.rule, r.attempt) for r in refusals] == [("SCRATCH_NOT_PORTABLE", "R2", attempt)]
    assert status["refusal"] == {
        "code": "SCRATCH_NOT_PORTABLE",
        "rule": "R2",
        "hint": refusals[0].hint,
        "attempt": attempt,
    }
    assert "--accept-scratch-loss" in refusals[0].hint
    shown = cli("status", run, home=d["home"], SCRATCHBANK_QUEUE=d["url"])
    assert f"hint: {refusals[0].hint}" in shown.stdout, shown.stdout


def test_R10_a_surface_never_publishes_a_resume_it_refuses(deployment: dict[str, Any]) -> None:
    """Refused from the latest execution's own record: exit 3 / 400 with the hint; the
    timeline unchanged (checksum) and nothing published on the stream.
    Proves ``scratchbank.adapters.bootstrap.bootstrap``."""
    d, run = deployment, _run()
    _append(d["home"], run, list(SURFACE_REFUSES))
    before, published = _checksum(d["home"], run), _published(d["url"])
    out = _resume(d, run)
    assert out.returncode == 3, out.stderr
    body = json.loads(out.stdout)
    assert (body["queued"], body["attempt"], body["decision"]["code"]) == (
        False,
        None,
        "SCRATCH_NOT_PORTABLE",
    )
    service = bootstrap(settings_from({"SCRATCHBANK_HOME": str(d["home"]), "SCRATCHBANK_QUEUE": d["url"]}))
    try:
        with served(service, ApiSettings(TOKEN)) as base:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            answer = httpx.post(f"{base}/runs/{run}/resume", json={}, headers=headers, timeout=60)
    finally:
        close(service)
    assert answer.status_code == 400
    assert answer.json()["error_code"] == "scratch_not_portable"
    assert '"accept_scratch_loss": true' in answer.json()["hint"]  # the API's words, not the CLI's
    assert _checksum(d["home"], run) == before
    assert _published(d["url"]) == published


def test_R9_a_surface_refusing_for_a_force_reason_judges_the_scratch_first(
    deployment: dict[str, Any],
) -> None:
    """A changed source while the latest execution may still be banking (it would defer):
    the surface judges the scratch too and names its loss first; nothing is queued.
    Proves ``scratchbank.adapters.bootstrap.open_home``."""
    d, run = deployment, _run()
    _append(d["home"], run, list(ENGINE_REFUSES))
    before, published = _checksum(d["home"], run), _published(d["url"])
    out = _resume(d, run, "--source-changed")
    assert out.returncode == 3, out.stderr
    decision = json.loads(out.stdout)["decision"]
    assert decision["code"] == "SCRATCH_NOT_PORTABLE"
    assert "--force" in decision["hint"] and "--accept-scratch-loss" in decision["hint"]
    assert _checksum(d["home"], run) == before
    assert _published(d["url"]) == published


def test_R11_an_in_process_resume_hears_the_engine_refusal_as_its_own(embedded: ScratchService) -> None:
    """An in process resume hears the engine refusal as its own:
    ``scratchbank.application.service.ScratchService.queue_resume``."""
    run = _run()
    embedded.timeline.append(run, list(ENGINE_REFUSES))
    out = embedded.queue_resume(run)
    assert out.heard and out.refused and out.attempt is not None
    assert (out.decision.code, out.decision.rule) == ("SCRATCH_NOT_PORTABLE", "R2")


def test_R11_an_in_process_resume_hears_the_engine_go_on(embedded: ScratchService) -> None:
    """An in process resume hears the engine go on:
    ``scratchbank.application.service.ScratchService.queue_resume``."""
    run = _run()
    embedded.timeline.append(run, list(ENGINE_REFUSES))
    out = embedded.queue_resume(run, ResumeRequest(consents=Consents(accept_scratch_loss=True)))
    assert out.heard and not out.refused, out.decision.explanation
    queued = [r for r in embedded.timeline.read(run) if isinstance(r, AttemptQueued)]
    assert [(q.attempt, q.accept_scratch_loss) for q in queued] == [(out.attempt, True)]


# ---- from tests/contracts/test_timeline_contract.py: The Timeline contract against every adapter: in memory, SQLite, a real PostgreSQL.


def test_R15_a_corrupt_stored_record_makes_the_timeline_unreadable(tmp_path: Path) -> None:
    """A corrupt stored record makes the timeline unreadable:
    ``scratchbank.adapters.event_store.EventStoreTimeline``."""
    url = f"sqlite:///{tmp_path}/t.db"
    EventStoreTimeline(url).append("run-1", [started(), banked()])
    with sqlite3.connect(tmp_path / "t.db") as db:
        names = [r[0] for r in db.execute("select name from sqlite_master where type='table'")]
        (table,) = [n for n in names if "snapshot" not in n]
        db.execute(f"update {table} set state = ? where originator_version = 2", (b"{broken",))
    with pytest.raises(TimelineUnreadable, match="record 2: not JSON"):
        EventStoreTimeline(url).read("run-1")


def test_R15_a_store_that_cannot_be_read_raises_never_reads_empty(tmp_path: Path) -> None:
    """A store that cannot be read raises never reads empty:
    ``scratchbank.adapters.event_store.EventStoreTimeline``."""
    path = tmp_path / "t.db"
    timeline = EventStoreTimeline(f"sqlite:///{path}")
    timeline.append("run-1", [started()])
    timeline.close()
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(TimelineUnreadable):
        EventStoreTimeline(f"sqlite:///{path}").read("run-1")


@pytest.mark.postgres
def test_R15_unreachable_postgres_is_unreadable_and_writes_fail_by_name(postgres_url: str) -> None:
    """Unreachable postgres is unreadable and writes fail by name:
    ``scratchbank.adapters.event_store.EventStoreTimeline``."""
    dead = "postgresql://postgres@127.0.0.1:9/postgres"
    with pytest.raises((TimelineUnreadable, TimelineWriteFailed)):
        EventStoreTimeline(dead, call_seconds=1).read("run-1")  # the store is opened first


@pytest.mark.postgres
def test_R15_a_postgres_timeline_that_cannot_open_leaves_no_pool_trying_behind(postgres_url: str) -> None:
    """R15: a timeline whose store cannot be opened is refused by name and leaves nothing
    running: its connection pool, made before the first connection failed, is closed (it went
    on trying to connect in four threads of its own until collected, and then, collected by one
    of them, failed to join itself: an error in whichever test ran next).
    Proves ``scratchbank.adapters.event_store.EventStoreTimeline``."""
    import threading

    dead = "postgresql://postgres@127.0.0.1:9/postgres"
    before = set(threading.enumerate())
    with pytest.raises(TimelineUnreadable, match="cannot open the timeline store"):
        EventStoreTimeline(dead, call_seconds=1)
    left = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("pool-")]
    assert left == []
