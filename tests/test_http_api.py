"""The HTTP API over a real loopback socket (uvicorn), called with httpx: C9's refusal body,
the bearer token, the Host check, the body limit, unknown fields, the sandbox allow-list,
and an OpenAPI document that lists every response (issue 12, findings 1, 2, 5)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from operator_rigs import RUN, TOKEN, tree_digest
from rigs.http_api import (
    AUTH,
    api,  # noqa: F401 - a fixture
    home,  # noqa: F401 - a fixture
    service,  # noqa: F401 - a fixture
)

from scratchbank.adapters.http_api import api_settings
from scratchbank.application.service import ScratchService
from scratchbank.domain.errors import ConfigInvalid
from scratchbank.testing.builders import node, unbanked


def test_a_resume_into_an_allowed_sandbox_restores(api: httpx.Client, home: Path) -> None:
    """A sandbox the server allows is a target: the bank is restored there."""
    got = api.post(f"/runs/{RUN}/resume", json={"sandbox": f"local:{home.parent}/box"}, headers=AUTH)
    assert got.status_code == 200, got.text
    assert got.json()["restore"]["restored"] is True
    assert (home.parent / "box" / "scratch" / "a.txt").read_bytes() == b"kept"


def test_an_unknown_run_is_404_RUN_NOT_FOUND_and_nothing_is_written(api: httpx.Client, home: Path) -> None:
    """Finding 2 over HTTP."""
    before = tree_digest(home)
    got = api.post("/runs/run-never-seen/resume", json={}, headers=AUTH)
    assert got.status_code == 404 and got.json()["error_code"] == "run_not_found"
    assert api.get("/runs/run-never-seen/status").status_code == 404
    assert tree_digest(home) == before


def test_status_reports_the_one_decision_and_the_store(api: httpx.Client, service: ScratchService) -> None:
    """Status over HTTP: the one decision (with the consents asked about) and the store check."""
    got = api.get(f"/runs/{RUN}/status")
    body = got.json()
    assert got.status_code == 200 and body["resume"]["verdict"] == "restore" and body["needs_target"]
    assert body["store"]["verdict"] == "matches"
    service.timeline.append(RUN, [node("measure", "agent")])
    assert api.get(f"/runs/{RUN}/status").json()["resume"]["code"] == "SCRATCH_NOT_PORTABLE"
    consented = api.get(f"/runs/{RUN}/status", params={"accept_scratch_loss": "true"}).json()
    assert consented["resume"]["verdict"] == "restore" and consented["resume"]["rule"] == "R7"
    service.timeline.append(RUN, [unbanked("tar failed")])
    got = api.post(f"/runs/{RUN}/resume", json={}, headers=AUTH)
    assert got.status_code == 400 and got.json()["rule"] == "R1"
    got = api.post(f"/runs/{RUN}/resume", json={"accept_scratch_loss": True}, headers=AUTH)
    assert got.status_code == 200 and got.json()["decision"]["rule"] == "R13"


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}, {"authorization": "Basic x"}])
def test_a_write_without_the_token_is_401_and_writes_nothing(
    api: httpx.Client, home: Path, headers: dict[str, str]
) -> None:
    """Finding 5: every call that writes needs the bearer token."""
    before = tree_digest(home)
    got = api.post(f"/runs/{RUN}/resume", json={"sandbox": f"local:{home.parent}/box"}, headers=headers)
    assert got.status_code == 401 and got.json()["error_code"] == "not_authorized"
    assert tree_digest(home) == before and not (home.parent / "box" / "scratch").exists()


def test_a_foreign_host_header_is_421(api: httpx.Client) -> None:
    """Finding 5: a DNS-rebinding page reaches the socket with its own Host; refused."""
    got = api.get(f"/runs/{RUN}/status", headers={"host": "evil.example:8080"})
    assert got.status_code == 421 and got.json()["error_code"] == "host_not_allowed"


def test_a_body_past_the_limit_is_413_without_being_read(api: httpx.Client) -> None:
    """Finding 5: a 50 MB body is refused from its declared length; a chunked one when it passes the limit."""
    got = api.post(f"/runs/{RUN}/resume", content=b"{" + b" " * (50 << 20) + b"}", headers=AUTH)
    assert got.status_code == 413 and got.json()["error_code"] == "body_too_large"

    def chunks() -> Iterator[bytes]:
        yield from (b" " * 8192 for _ in range(20))

    got = api.post(f"/runs/{RUN}/resume", content=chunks(), headers=AUTH)
    assert got.status_code == 413


def test_an_unknown_field_is_422_naming_it(api: httpx.Client, home: Path) -> None:
    """Finding 5: a misspelt acept_scratch_loss is refused, never ignored."""
    before = tree_digest(home)
    got = api.post(f"/runs/{RUN}/resume", json={"acept_scratch_loss": True}, headers=AUTH)
    assert got.status_code == 422 and got.json()["error_code"] == "invalid_request"
    assert "acept_scratch_loss" in got.json()["error"]
    assert tree_digest(home) == before


@pytest.mark.parametrize("spec", ["docker:anything", "local:/etc", "bogus", "local:/tmp/../etc"])
def test_a_sandbox_outside_the_servers_allow_list_is_403(api: httpx.Client, spec: str) -> None:
    """Finding 5: which sandboxes a caller may name is the server's configuration, not the body."""
    got = api.post(f"/runs/{RUN}/resume", json={"sandbox": spec}, headers=AUTH)
    assert got.status_code == 403 and got.json()["error_code"] == "sandbox_not_allowed"


def test_openapi_lists_every_response_with_its_schema(api: httpx.Client) -> None:
    """Finding 5: not only 200 and 422."""
    spec = api.get("/openapi.json").json()
    resume = spec["paths"]["/runs/{run_id}/resume"]["post"]
    assert {"200", "400", "401", "403", "404", "409", "413", "421", "422", "503"} <= set(resume["responses"])
    for code, response in resume["responses"].items():
        assert "schema" in response["content"]["application/json"], code
    assert "ResumeBody" in spec["components"]["schemas"]
    assert spec["components"]["schemas"]["ResumeBody"].get("additionalProperties") is False
    assert resume.get("security"), "the write declares its bearer scheme"


def test_the_server_refuses_to_listen_beyond_loopback_without_a_token() -> None:
    """Finding 5: no token, no open bind; a token file or env var allows it."""
    with pytest.raises(ConfigInvalid, match="without a token"):
        api_settings(host="0.0.0.0", env={})
    assert api_settings(host="0.0.0.0", env={"SCRATCHBANK_API_TOKEN": TOKEN}).token == TOKEN
    loopback = api_settings(host="127.0.0.1", env={})
    assert loopback.generated and len(loopback.token) >= 32
