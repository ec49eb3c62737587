"""The operator surfaces publish resumes onto the runner's queue (issue #13 item 1).

A real nats-server (JetStream) of this module's own, a SQLite home, and a detached
runner started with `scratchbank runner` (local sandboxes, banks on disk): the CLI and
the HTTP API judge as a surface (R9, R10), write `attempt_queued` and publish; the
runner claims, restores, and the run goes on; a refusal of the engine is written to
the run's log (R12) and `status` shows it with the hint of remedy() (C10); a runner in
the surface's own process makes the surface wait for its verdict (R11).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats_server import NatsServer
from operator_rigs import EXE, TOKEN, cli, served
from runner_rigs import STORY, checksum, make_rig
from waiting import eventually

from scratchbank.adapters.bootstrap import bootstrap, close, open_home
from scratchbank.adapters.config import settings_from
from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.http_api import ApiSettings
from scratchbank.adapters.nats_queue import NatsConnection
from scratchbank.application.service import ScratchService
from scratchbank.domain.admission import Consents
from scratchbank.domain.records import (
    AttemptQueued,
    NodeFinished,
    Record,
    ResumeRefused,
    ScratchRestored,
)
from scratchbank.domain.remedy import remedy
from scratchbank.domain.resume_gate import ResumeRequest, Verdict
from scratchbank.testing.builders import banked, node, resumed, started

WAIT = 120.0  # a bound on waiting for the runner, never an assertion about speed


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A nats-server, a home, and `scratchbank runner` on them: the operator's two commands."""
    base = tmp_path_factory.mktemp("queue")
    server = NatsServer(base / "nats")
    server.start()
    home = base / "var" / "scratchbank"
    close(open_home(home))
    workflow = base / "workflow.json"
    workflow.write_text(json.dumps([{"name": n.name, "kind": n.kind, "command": n.command} for n in STORY]))
    log = base / "runner.log"
    env = {"SCRATCHBANK_HOME": str(home), "SCRATCHBANK_QUEUE": server.url}

    err = open(base / "runner.err", "wb")  # a file, never an unread pipe the runner could fill
    runner = subprocess.Popen(
        [str(EXE), "runner", "--workflow", str(workflow), "--log-file", str(log), "--holder", "runner-q"],
        env=os.environ | env,
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    try:
        _wait_for(log, lambda e: e.get("event") == "ready")
        yield {"home": home, "url": server.url, "log": log}
    finally:
        runner.terminate()
        runner.wait(30)
        err.close()
        server.stop()


def _events(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def _wait_for(log: Path, match: Any) -> dict[str, Any]:
    found: list[dict[str, Any]] = eventually(
        lambda: [e for e in _events(log) if match(e)],
        timeout=WAIT,
        what="the runner logs what was waited for",
        detail=lambda: _events(log)[-5:],
    )
    return found[-1]


def _handled(d: dict[str, Any], run: str, attempt: str) -> dict[str, Any]:
    return _wait_for(d["log"], lambda e: e.get("event") == "handled" and e["attempt"] == attempt)


def _records(home: Path, run: str) -> list[Record]:
    timeline = EventStoreTimeline(f"sqlite://{home}/timeline.db")
    try:
        return timeline.read(run)
    finally:
        timeline.close()


def _append(home: Path, run: str, records: list[Record]) -> None:
    service = open_home(home)
    try:
        service.timeline.append(run, records)
    finally:
        close(service)


def _published(url: str) -> int:
    """How many deliveries the stream holds (a refusal must publish none)."""
    conn = NatsConnection(url)
    try:
        return int(conn.call(conn.js.stream_info("SB_RESUMES")).state.messages)
    finally:
        conn.close()


def _checksum(home: Path, run: str) -> str:
    timeline = EventStoreTimeline(f"sqlite://{home}/timeline.db")
    try:
        return checksum(timeline, run)
    finally:
        timeline.close()


def _resume(d: dict[str, Any], run: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return cli("resume", run, "--json", *flags, home=d["home"], SCRATCHBANK_QUEUE=d["url"])


def _run() -> str:
    return f"run-{uuid.uuid4().hex[:10]}"


#: Surface defers (the latest execution wrote no teardown record yet: R10), then the
#: engine refuses R2: an agent finished after the bank.
ENGINE_REFUSES = [started(), node("clone", "tool"), banked(), resumed("a0"), node("measure", "agent")]
#: Refused by the surface from a record the latest execution wrote (R2, R10).
SURFACE_REFUSES = [started(), node("clone", "tool"), banked(), node("measure", "agent")]


def test_R10_cli_resume_publishes_and_a_runner_process_carries_the_run_on(deployment: dict[str, Any]) -> None:
    """`scratchbank resume` with a queue: queued, claimed by `scratchbank runner`, run to its
    gate and banked; resumed again: a new sandbox, the scratch restored, the run goes on."""
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


def test_C10_the_logged_hint_is_remedy_of_the_engine_decision(deployment: dict[str, Any]) -> None:
    """The hint the runner wrote is remedy() of the decision the engine makes, word for word."""
    d, run = deployment, _run()
    _append(d["home"], run, list(ENGINE_REFUSES))
    out = _resume(d, run)
    assert out.returncode == 0, out.stderr
    _handled(d, run, json.loads(out.stdout)["attempt"])
    service = open_home(d["home"])
    try:
        decision = service.assess(run).decision
    finally:
        close(service)
    assert decision.verdict is Verdict.REFUSE
    hints = [r.hint for r in _records(d["home"], run) if isinstance(r, ResumeRefused)]
    assert hints == [remedy(decision)]


def test_R10_a_surface_never_publishes_a_resume_it_refuses(deployment: dict[str, Any]) -> None:
    """Refused from the latest execution's own record: exit 3 / 400 with the hint; the
    timeline unchanged (checksum) and nothing published on the stream."""
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
    the surface judges the scratch too and names its loss first; nothing is queued."""
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


def test_unknown_run_is_run_not_found_and_nothing_is_published(deployment: dict[str, Any]) -> None:
    d, run = deployment, _run()
    published = _published(d["url"])
    out = _resume(d, run)
    assert out.returncode == 4 and "RUN_NOT_FOUND" in out.stderr
    service = bootstrap(settings_from({"SCRATCHBANK_HOME": str(d["home"]), "SCRATCHBANK_QUEUE": d["url"]}))
    try:
        with served(service, ApiSettings(TOKEN)) as base:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            answer = httpx.post(f"{base}/runs/{run}/resume", json={}, headers=headers, timeout=60)
    finally:
        close(service)
    assert answer.status_code == 404 and answer.json()["error_code"] == "run_not_found"
    assert list(_records(d["home"], run)) == []
    assert _published(d["url"]) == published


@pytest.mark.parametrize("url", ["http://x:4222", "nats://", "nats://h:notaport", "nats://h:99999"])
def test_a_bad_queue_url_is_config_invalid(tmp_path: Path, url: str) -> None:
    close(open_home(tmp_path / "home"))
    out = cli("resume", "run-1", home=tmp_path / "home", SCRATCHBANK_QUEUE=url)
    assert out.returncode == 2 and "CONFIG_INVALID" in out.stderr and "Traceback" not in out.stderr


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[ScratchService]:
    """A runner in the surface's own process (in-process queue and lease): R11 applies."""
    timeline = EventStoreTimeline(f"sqlite://{tmp_path}/timeline.db")
    rig = make_rig(tmp_path, timeline)
    stop = threading.Event()
    thread = threading.Thread(target=rig.runner().serve, args=(stop,), daemon=True)
    thread.start()
    try:
        yield ScratchService(timeline, rig.store, queue=rig.queue, verdicts=rig.verdicts)
    finally:
        stop.set()
        thread.join(30)
        timeline.close()


def test_R11_an_in_process_resume_hears_the_engine_refusal_as_its_own(embedded: ScratchService) -> None:
    run = _run()
    embedded.timeline.append(run, list(ENGINE_REFUSES))
    out = embedded.queue_resume(run)
    assert out.heard and out.refused and out.attempt is not None
    assert (out.decision.code, out.decision.rule) == ("SCRATCH_NOT_PORTABLE", "R2")


def test_R11_an_in_process_resume_hears_the_engine_go_on(embedded: ScratchService) -> None:
    run = _run()
    embedded.timeline.append(run, list(ENGINE_REFUSES))
    out = embedded.queue_resume(run, ResumeRequest(consents=Consents(accept_scratch_loss=True)))
    assert out.heard and not out.refused, out.decision.explanation
    queued = [r for r in embedded.timeline.read(run) if isinstance(r, AttemptQueued)]
    assert [(q.attempt, q.accept_scratch_loss) for q in queued] == [(out.attempt, True)]


def test_C2_http_resume_carries_this_calls_consent_to_the_runner_and_the_run_goes_on(
    deployment: dict[str, Any],
) -> None:
    """POST /resume with accept_scratch_loss over a queue: 202; the delivery carries the
    consent (C2, C3), the detached runner claims and the run goes on on the bank as it was."""
    d, run = deployment, _run()
    _append(d["home"], run, list(ENGINE_REFUSES))
    service = bootstrap(settings_from({"SCRATCHBANK_HOME": str(d["home"]), "SCRATCHBANK_QUEUE": d["url"]}))
    try:
        with served(service, ApiSettings(TOKEN)) as base:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            body = {"accept_scratch_loss": True}
            answer = httpx.post(f"{base}/runs/{run}/resume", json=body, headers=headers, timeout=60)
    finally:
        close(service)
    assert answer.status_code == 202, answer.text
    attempt = answer.json()["attempt"]
    assert _handled(d, run, attempt)["handled"] == "ran"
    records = _records(d["home"], run)
    assert not [r for r in records if isinstance(r, ResumeRefused)]
    queued = [r for r in records if isinstance(r, AttemptQueued)]
    assert [(q.attempt, q.accept_scratch_loss) for q in queued] == [(attempt, True)]


def test_an_unreachable_queue_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    """QUEUE_UNAVAILABLE (exit 5), no traceback, the timeline as it was."""
    home = tmp_path / "home"
    _append(home, "run-1", [started()])
    before = _checksum(home, "run-1")
    out = cli("resume", "run-1", home=home, SCRATCHBANK_QUEUE="nats://127.0.0.1:1")
    assert out.returncode == 5 and "error: QUEUE_UNAVAILABLE" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert _checksum(home, "run-1") == before
