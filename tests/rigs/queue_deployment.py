"""A deployment of the runner behind the queue (NATS), its event log and the CLI's resume through it.

First written for tests/test_surface_queue.py: The operator surfaces publish resumes onto the
runner's queue (issue #13 item 1)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nats_server import NatsServer
from operator_rigs import EXE, cli
from runner_rigs import STORY, checksum, make_rig
from waiting import eventually

from scratchbank.adapters.bootstrap import close, open_home
from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.nats_queue import NatsConnection
from scratchbank.application.service import ScratchService
from scratchbank.domain.records import (
    Record,
)
from scratchbank.testing.builders import banked, node, resumed, started

WAIT = 120.0  # a bound on waiting for the runner, never an assertion about speed


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A nats-server, a home, and `scratchbank runner` on them: the operator's two commands."""
    base = tmp_path_factory.mktemp("queue")
    server = NatsServer(base / "nats")
    server.start()
    try:  # a setup that fails after the server started must not leave it running
        home = base / "var" / "scratchbank"
        close(open_home(home))
        workflow = base / "workflow.json"
        workflow.write_text(
            json.dumps([{"name": n.name, "kind": n.kind, "command": n.command} for n in STORY])
        )
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
    finally:
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
