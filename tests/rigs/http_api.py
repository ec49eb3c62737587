"""Helpers and fixtures of the tests first written in tests/test_http_api.py (The HTTP API over a real
loopback socket (uvicorn), called with httpx: C9's refusal body, the bearer token, the Host check,
the body limit, unknown fields, the sandbox allow-list, and an OpenAPI document that lists every
response (issue 12, findings 1, 2, 5).), shared by the rule tests filed by family in tests/rules/
and by the tests that stayed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from operator_rigs import TOKEN, parked_run, served

from scratchbank.adapters.bootstrap import close, open_home
from scratchbank.adapters.http_api import ApiSettings
from scratchbank.application.service import ScratchService

AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    parked_run(tmp_path / "home", stale=False)
    (tmp_path / "box").mkdir()
    return tmp_path / "home"


@pytest.fixture
def service(home: Path) -> Iterator[ScratchService]:
    service = open_home(home)
    yield service
    close(service)


@pytest.fixture
def api(service: ScratchService, home: Path) -> Iterator[httpx.Client]:
    settings = ApiSettings(TOKEN, sandboxes=(f"local:{home.parent}/box",))
    with served(service, settings) as base, httpx.Client(base_url=base, timeout=30) as client:
        yield client
