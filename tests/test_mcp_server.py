"""The operator's MCP server as a real process (`scratchbank mcp`), driven by the SDK's own client
over stdio and over streamable HTTP: an assistant-style caller that retries a refused resume
with `force` only, then with a bare consent (both refused, nothing changed), then with the
consent naming the refusal (A19: it goes on); bad arguments; the timeline resource; the
runs needing an operator; and over HTTP the API's token, Host and Origin checks."""

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

import anyio
import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from operator_rigs import EXE, RUN, TOKEN, parked_run, tree_digest

from scratchbank.adapters.mcp_server import ask_seconds, consent_name, judge_consent
from scratchbank.domain import errors
from scratchbank.domain.fold import fold
from scratchbank.domain.resume_gate import ResumeRequest, decide_resume
from scratchbank.testing.builders import banked, node, started, unbanked

Script = Callable[[ClientSession], Awaitable[None]]


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


def test_A19_over_stdio_only_the_consent_naming_the_refusal_forsakes_the_scratch(
    rig: tuple[Path, Path],
) -> None:
    """The SDK's stdio client against `scratchbank mcp`: the assistant's story and bad arguments."""
    home, target = rig
    params = StdioServerParameters(command=str(EXE), args=["mcp"], env=_env(home, target))

    async def main() -> None:
        with anyio.fail_after(120):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                await bad_arguments(session, target)
                await assistant_story(session, home, target)

    anyio.run(main)


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


def test_A19_over_streamable_http_behind_the_apis_guards(rig: tuple[Path, Path]) -> None:
    """`scratchbank mcp --http`: no token 401, a foreign Host 421, a foreign Origin refused; with
    the token the SDK's HTTP client runs the assistant's story."""
    home, target = rig
    proc, base = _start_http(home, target)
    try:
        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        assert httpx.post(f"{base}/mcp", json=hello, timeout=30).status_code == 401
        foreign = {"authorization": f"Bearer {TOKEN}", "host": "evil.example"}
        assert httpx.post(f"{base}/mcp", json=hello, headers=foreign, timeout=30).status_code == 421
        origin = {"authorization": f"Bearer {TOKEN}", "origin": "http://evil.example"}
        assert httpx.post(f"{base}/mcp", json=hello, headers=origin, timeout=30).status_code in (403, 421)

        async def main() -> None:
            with anyio.fail_after(120):
                async with http_session(f"{base}/mcp", "not-the-token-at-all-0000"):
                    pass

        with pytest.raises(BaseException):  # noqa: B017 - the SDK wraps the 401 its own way
            anyio.run(main)

        async def story() -> None:
            with anyio.fail_after(120):
                async with http_session(f"{base}/mcp", TOKEN) as session:
                    await bad_arguments(session, target)
                    await assistant_story(session, home, target)

        anyio.run(story)
    finally:
        proc.terminate()
        proc.wait(30)
        assert proc.stderr is not None
        proc.stderr.close()


def test_A19_the_consent_name_is_the_refusals_own() -> None:
    """The name follows the refusal's rule and evidence; bare true and other names count for nothing."""
    r2 = decide_resume(fold([started(), node("a", "tool"), banked(), node("b", "tool")]), ResumeRequest())
    r1 = decide_resume(fold([started(), node("a", "tool"), unbanked()]), ResumeRequest())
    assert consent_name(r2) and consent_name(r1) and consent_name(r2) != consent_name(r1)
    assert judge_consent(r2, consent_name(r2), force=False).consents.accept_scratch_loss
    assert not judge_consent(r2, True, force=True).consents.accept_scratch_loss
    assert judge_consent(r2, True, force=True).consents.force  # force stays separate
    assert not judge_consent(r2, consent_name(r1), force=False).consents.accept_scratch_loss


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


def test_A19_over_stdio_the_human_asked_by_elicitation_gives_the_named_consent(
    rig: tuple[Path, Path],
) -> None:
    """A client that declared elicitation: a resume refused for the scratch asks its human; a
    decline (and a cancel) forsakes nothing (the home's checksum holds); an acceptance, which
    is the refusal's own name, lets the run go on."""
    home, target = rig
    params = StdioServerParameters(command=str(EXE), args=["mcp"], env=_env(home, target))
    human = Human()

    async def main() -> None:
        with anyio.fail_after(120):
            async with (
                stdio_client(params) as (read, write),
                ClientSession(read, write, elicitation_callback=human) as session,
            ):
                await session.initialize()
                await elicitation_story(session, human, home, target)

    anyio.run(main)


def test_A19_over_streamable_http_the_human_asked_by_elicitation_gives_the_named_consent(
    rig: tuple[Path, Path],
) -> None:
    """The same over `scratchbank mcp --http` (the SDK's HTTP client, with the token): the server
    has a channel to ask the human during the call, so a decline and a cancel forsake nothing
    and the acceptance lets the run go on."""
    home, target = rig
    proc, base = _start_http(home, target)
    human = Human()
    try:

        async def main() -> None:
            with anyio.fail_after(120):
                async with http_session(f"{base}/mcp", TOKEN, human) as session:
                    await elicitation_story(session, human, home, target)

        anyio.run(main)
    finally:
        proc.terminate()
        proc.wait(30)
        assert proc.stderr is not None
        proc.stderr.close()


def test_A19_a_human_who_never_answers_forsakes_nothing_past_the_deadline(rig: tuple[Path, Path]) -> None:
    """Elicitation is a call to another process with a deadline (SCRATCHBANK_MCP_ASK_SECONDS):
    a human who never answers gets the resume refused, and the home's checksum holds."""
    home, target = rig
    env = _env(home, target) | {"SCRATCHBANK_MCP_ASK_SECONDS": "1"}
    params = StdioServerParameters(command=str(EXE), args=["mcp"], env=env)
    asked: list[str] = []

    async def silent(context: ClientRequestContext, request: Any) -> types.ElicitResult:
        asked.append(request.message)
        await anyio.sleep_forever()
        raise AssertionError("never answered")

    async def main() -> None:
        with anyio.fail_after(120):
            async with (
                stdio_client(params) as (read, write),
                ClientSession(read, write, elicitation_callback=silent) as session,
            ):
                await session.initialize()
                before = tree_digest(home)
                resume = {"run": RUN, "sandbox": f"local:{target}"}
                code, refused = _payload(await session.call_tool("resume", resume))
                assert code == "SCRATCH_NOT_PORTABLE" and "did not answer" in refused["consent"], refused
                assert tree_digest(home) == before and not (target / "scratch").exists()

    anyio.run(main)
    assert len(asked) == 1


def test_A19_a_bad_ask_deadline_is_a_named_config_error() -> None:
    """SCRATCHBANK_MCP_ASK_SECONDS that is not a number of seconds in (0, 86400] is CONFIG_INVALID."""
    assert ask_seconds({}) == 300 and ask_seconds({"SCRATCHBANK_MCP_ASK_SECONDS": "2.5"}) == 2.5
    for bad in ("soon", "0", "-1", "nan", "1e9"):
        with pytest.raises(errors.ConfigInvalid, match="SCRATCHBANK_MCP_ASK_SECONDS"):
            ask_seconds({"SCRATCHBANK_MCP_ASK_SECONDS": bad})
