"""The MCP server as a process driven by the SDK's client (stdio, streamable HTTP): the assistant's and
the human's stories.

First written for tests/rules/test_A_engines.py: The operator's MCP server as a real process
(`scratchbank mcp`), driven by the SDK's own client over stdio and over streamable HTTP: an
assistant-style caller that retries a refused resume with `force` only, then with a bare consent
(both refused, nothing changed), then with the consent naming the refusal (A19: it goes on); bad
arguments; the timeline resource; the runs needing an operator; and over HTTP the API's token, Host
and Origin checks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, types
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from operator_rigs import EXE, RUN, TOKEN, parked_run, tree_digest


def _env(home: Path, target: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SCRATCHBANK_")}
    return base | {
        "SCRATCHBANK_HOME": str(home),
        "SCRATCHBANK_API_SANDBOXES": f"local:{target}",
        "SCRATCHBANK_API_TOKEN": TOKEN,
    }


def _payload(result: Any) -> tuple[str, dict[str, Any]]:
    """(code, payload) of a tool error whose text is 'Error executing tool NAME: CODE: {json}'."""
    assert result.is_error, result
    text = result.content[0].text
    found = re.search(r"([A-Z][A-Z_]+): (\{.*\})\s*$", text, re.DOTALL)
    assert found, text
    return found.group(1), json.loads(found.group(2))


def _data(result: Any) -> Any:
    assert not result.is_error, result.content[0].text
    if result.structured_content is not None:
        content = result.structured_content
        return content.get("result", content) if set(content) == {"result"} else content
    return json.loads(result.content[0].text)


async def assistant_story(session: ClientSession, home: Path, target: Path) -> None:
    """force only -> refused; bare consent -> refused; another refusal's name -> refused; the
    named consent -> the run goes on. Nothing changes on disk until the last call."""
    tools = {tool.name for tool in (await session.list_tools()).tools}
    assert {"status", "explain", "resume", "runs_needing_operator"} <= tools
    status = _data(await session.call_tool("status", {"run": RUN}))
    name = status["consent_name"]
    assert status["resume"]["verdict"] == "refuse" and name and status["resume_would"] == "be refused"
    assert "--" not in status["resume"]["hint"]  # MCP words, not CLI flags
    waiting = _data(await session.call_tool("runs_needing_operator", {}))
    assert [entry["run"] for entry in waiting] == [RUN] and waiting[0]["consent_name"] == name
    before = tree_digest(home)
    sandbox = f"local:{target}"

    code, refused = _payload(
        await session.call_tool("resume", {"run": RUN, "sandbox": sandbox, "force": True})
    )
    assert code == "SCRATCH_NOT_PORTABLE" and refused["rule"] == "R2" and refused["kind"] == "refused"
    assert refused["causes"] and refused["hint"] and refused["consent_name"] == name
    assert refused["rule_says"].startswith("R2: ")

    bare = {"run": RUN, "sandbox": sandbox, "accept_scratch_loss": True, "force": True}
    code, refused = _payload(await session.call_tool("resume", bare))
    assert code == "SCRATCH_NOT_PORTABLE" and "bare" in refused["consent"]

    other = {"run": RUN, "sandbox": sandbox, "accept_scratch_loss": "scratch_not_portable/R1/000000000000"}
    code, refused = _payload(await session.call_tool("resume", other))
    assert code == "SCRATCH_NOT_PORTABLE" and "not this refusal" in refused["consent"]
    assert tree_digest(home) == before  # every refusal forsook nothing

    explained = _data(await session.call_tool("explain", {"run": RUN, "accept_scratch_loss": name}))
    assert explained["consent_counted"] is True and explained["resume"]["rule"] == "R7"

    named = {"run": RUN, "sandbox": sandbox, "accept_scratch_loss": name}
    done = _data(await session.call_tool("resume", named))
    assert done["proceeds"] is True and done["consent_counted"] is True
    assert (target / "scratch" / "a.txt").read_bytes() == b"kept"

    resource = await session.read_resource(f"scratchbank://runs/{RUN}/timeline")
    lines = [json.loads(line) for line in resource.contents[0].text.splitlines()]
    assert lines[0]["type"] == "run_started" and lines[-1]["type"] == "sandbox_scratch_restored"


async def bad_arguments(session: ClientSession, target: Path) -> None:
    """Wrong types, unknown runs, hostile ids and sandboxes off the allow-list: named tool errors."""
    typed = await session.call_tool("resume", {"run": 12, "force": "yes"})
    assert typed.is_error
    code, data = _payload(await session.call_tool("status", {"run": "../../etc"}))
    assert code == "INVALID_RUN_ID" and data["kind"] == "invalid_argument"
    code, data = _payload(await session.call_tool("status", {"run": "x" * 10_000}))
    assert code == "INVALID_RUN_ID" and len(data["error"]) < 500
    code, data = _payload(await session.call_tool("status", {"run": "never-seen"}))
    assert code == "RUN_NOT_FOUND" and data["kind"] == "not_found"
    code, data = _payload(await session.call_tool("resume", {"run": RUN, "sandbox": "docker:elsewhere"}))
    assert code == "SANDBOX_NOT_ALLOWED"


@pytest.fixture
def rig(tmp_path: Path) -> tuple[Path, Path]:
    home, target = tmp_path / "home", tmp_path / "box"
    parked_run(home, stale=True)
    target.mkdir()
    return home, target


@asynccontextmanager
async def http_session(
    url: str, token: str, human: Callable[..., Awaitable[types.ElicitResult]] | None = None
) -> AsyncIterator[ClientSession]:
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with (
        client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write, elicitation_callback=human) as session,
    ):
        await session.initialize()
        yield session


def _start_http(home: Path, target: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [str(EXE), "mcp", "--http", "--port", "0"],
        env=_env(home, target),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    line = ""
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+)/mcp", line)
        if found:
            return proc, found.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    proc.wait(30)
    proc.stderr.close()
    raise AssertionError(f"the MCP server did not start: {line!r}")


class Human:
    """A client's human answering the consent form: decline, cancel, then accept (its one choice)."""

    def __init__(self) -> None:
        self.answers = ["decline", "cancel", "accept"]
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, context: ClientRequestContext, request: Any) -> types.ElicitResult:
        self.asked.append((request.message, request.requested_schema))
        action = self.answers.pop(0)
        if action != "accept":
            return types.ElicitResult(action=action)
        choice = request.requested_schema["properties"]["accept_scratch_loss"]["enum"][0]
        return types.ElicitResult(action="accept", content={"accept_scratch_loss": choice})


async def elicitation_story(session: ClientSession, human: Human, home: Path, target: Path) -> None:
    """A decline and a cancel forsake nothing (the home's checksum holds); the acceptance, the
    refusal's own name, lets the run go on."""
    name = _data(await session.call_tool("status", {"run": RUN}))["consent_name"]
    before = tree_digest(home)
    resume = {"run": RUN, "sandbox": f"local:{target}"}
    for answer in ("decline", "cancel"):
        code, refused = _payload(await session.call_tool("resume", resume))
        assert code == "SCRATCH_NOT_PORTABLE" and answer in refused["consent"], refused
        assert tree_digest(home) == before, f"a {answer} forsook the scratch"
    assert not (target / "scratch").exists()
    done = _data(await session.call_tool("resume", resume))
    assert done["proceeds"] is True and done["consent_counted"] is True
    assert (target / "scratch" / "a.txt").read_bytes() == b"kept"
    assert tree_digest(home) != before
    assert len(human.asked) == 3
    message, schema = human.asked[0]
    assert "R2" in message and name in message
    assert schema["properties"]["accept_scratch_loss"]["enum"] == [name]
