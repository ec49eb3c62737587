"""The HTTP API over a real socket (uvicorn on a loopback port): C9's refusal body."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.http_api import create_app
from scratchbank.adapters.memory import FakeSandbox
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.testing.builders import node, resumed, started, unbanked


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[str, EventStoreTimeline]]:
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/t.db")
    store = FilesystemBankStore(tmp_path / "banks")
    timeline.append("run-1", [started(), node("clone", "tool")])
    bank_at_teardown(
        "run-1", timeline=timeline, store=store, sandbox=FakeSandbox({"a": b"1"}), run_finished=False
    )
    server = uvicorn.Server(
        uvicorn.Config(create_app(timeline, store), host="127.0.0.1", port=0, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", timeline
    server.should_exit = True
    thread.join(5)
    timeline.close()


def call(url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_C9_refusal_body_with_hint_and_also_needs_force(api: tuple[str, EventStoreTimeline]) -> None:
    base, timeline = api
    timeline.append("run-1", [node("measure", "agent")])
    status, body = call(f"{base}/runs/run-1/resume", {"source_changed": True})
    assert status == 400
    assert body["error_code"] == "scratch_not_portable"
    assert body["also_needs_force"] is True and body["keep_force"] is False
    assert "add --force" in body["hint"] and body["hint"].startswith("relaunch the run fresh")


def test_C9_a_call_that_had_force_is_told_to_keep_it(api: tuple[str, EventStoreTimeline]) -> None:
    base, timeline = api
    timeline.append("run-1", [node("measure", "agent")])
    status, body = call(f"{base}/runs/run-1/resume", {"source_changed": True, "force": True})
    assert status == 400 and body["also_needs_force"] is False and body["keep_force"] is True
    assert "keep --force" in body["hint"]


def test_resume_restores_or_goes_on_and_status_reports(api: tuple[str, EventStoreTimeline]) -> None:
    base, timeline = api
    status, body = call(f"{base}/runs/run-1/status")
    assert status == 200 and body["state"]["bank"]["bytes"] > 0 and not body["state"]["stale"]
    timeline.append("run-1", [unbanked("tar failed")])
    status, body = call(f"{base}/runs/run-1/resume", {})
    assert status == 400 and body["error_code"] == "scratch_not_portable" and body["rule"] == "R1"
    status, body = call(f"{base}/runs/run-1/resume", {"accept_scratch_loss": True})
    assert status == 200 and body["proceeds"] and body["decision"]["rule"] == "R13"


def test_R10_the_surface_defers_while_the_latest_execution_may_bank(
    api: tuple[str, EventStoreTimeline],
) -> None:
    base, timeline = api
    timeline.append("run-1", [resumed()])
    status, body = call(f"{base}/runs/run-1/resume", {})
    assert status == 202 and body["rule"] == "R10"


def test_openapi_describes_resume_and_status(api: tuple[str, EventStoreTimeline]) -> None:
    base, _ = api
    status, spec = call(f"{base}/openapi.json")
    assert status == 200
    assert {"/runs/{run_id}/resume", "/runs/{run_id}/status"} <= set(spec["paths"])
