"""Every bad input of issue 12 (finding 4), through the CLI (a subprocess) and the real HTTP
server (uvicorn on a socket, httpx): a named error with code and remedy, the documented exit
code or status, no traceback, no secret echoed, and nothing changed on disk."""

from __future__ import annotations

import json
import socket
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from operator_rigs import RUN, TOKEN, cli, parked_run, served, tree_digest

from scratchbank.adapters.bootstrap import close, open_home
from scratchbank.adapters.http_api import ApiSettings

SECRET = "s3cr3t-Pa55word"
DEEP = "[" * 100_000 + "]" * 100_000
HUGE = '{"type": "sandbox_scratch_banked", "bytes": ' + "9" * 5000 + "}"
AUTH = {"authorization": f"Bearer {TOKEN}"}

#: (name, argv, env, error code, exit code). Exit codes as documented in adapters/cli.py.
CLI_CASES: list[tuple[str, list[str], dict[str, str], str, int]] = [
    (
        "garbage SCRATCHBANK_TIMELINE",
        ["status", RUN],
        {"SCRATCHBANK_TIMELINE": "garbage"},
        "CONFIG_INVALID",
        2,
    ),
    (
        "http SCRATCHBANK_TIMELINE",
        ["status", RUN],
        {"SCRATCHBANK_TIMELINE": "http://x/y"},
        "CONFIG_INVALID",
        2,
    ),
    ("empty sqlite URL", ["status", RUN], {"SCRATCHBANK_TIMELINE": "sqlite:///"}, "CONFIG_INVALID", 2),
    ("garbage SCRATCHBANK_BANK", ["status", RUN], {"SCRATCHBANK_BANK": "garbage"}, "CONFIG_INVALID", 2),
    ("bucketless S3 URL", ["status", RUN], {"SCRATCHBANK_BANK": "s3://"}, "CONFIG_INVALID", 2),
    ("SCRATCHBANK_HOME=/dev/null", ["status", RUN], {"SCRATCHBANK_HOME": "/dev/null"}, "CONFIG_INVALID", 2),
    (
        "unreachable PostgreSQL",
        ["status", RUN],
        {"SCRATCHBANK_TIMELINE": f"postgresql://app:{SECRET}@127.0.0.1:1/db"},
        "TIMELINE_UNREADABLE",
        5,
    ),
    (
        "local sandbox that is no folder",
        ["resume", RUN, "--sandbox", "local:/nonexistent/x"],
        {},
        "CONFIG_INVALID",
        2,
    ),
    ("relative local sandbox", ["resume", RUN, "--sandbox", "local:rel"], {}, "CONFIG_INVALID", 2),
    ("bogus sandbox", ["resume", RUN, "--sandbox", "bogus"], {}, "CONFIG_INVALID", 2),
    ("local sandbox with ..", ["resume", RUN, "--sandbox", "local:/tmp/../etc"], {}, "CONFIG_INVALID", 2),
    ("k8s sandbox without a pod", ["resume", RUN, "--sandbox", "k8s:ns"], {}, "CONFIG_INVALID", 2),
    ("serve --port 99999", ["serve", "--port", "99999"], {}, "CONFIG_INVALID", 2),
    ("serve beyond loopback without a token", ["serve", "--host", "0.0.0.0"], {}, "CONFIG_INVALID", 2),
    ("unknown flag", ["status", RUN, "--frobnicate"], {}, "CONFIG_INVALID", 2),
    ("run id ..", ["status", ".."], {}, "INVALID_RUN_ID", 2),
    ("run id a;b", ["resume", "a;b"], {}, "INVALID_RUN_ID", 2),
    ("run id a b", ["status", "a b"], {}, "INVALID_RUN_ID", 2),
    ("run id of 5,000 characters", ["resume", "x" * 5000], {}, "INVALID_RUN_ID", 2),
    ("unknown run", ["resume", "run-never-seen"], {}, "RUN_NOT_FOUND", 4),
]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    parked_run(tmp_path / "home", stale=True)
    return tmp_path / "home"


def assert_named(stderr: str, code: str) -> None:
    assert f"error: {code}: " in stderr and "remedy: " in stderr, stderr
    assert "Traceback" not in stderr and SECRET not in stderr


@pytest.mark.parametrize(
    ("name", "argv", "env", "code", "exit_code"), CLI_CASES, ids=[c[0] for c in CLI_CASES]
)
def test_every_bad_cli_input_is_named_with_its_exit_code_and_changes_nothing(
    home: Path, name: str, argv: list[str], env: dict[str, str], code: str, exit_code: int
) -> None:
    """Finding 4: each bad input through the CLI, named, with its documented exit code."""
    before = tree_digest(home.parent)
    done = cli(*argv, home=home, **env)
    assert done.returncode == exit_code, (name, done.stdout, done.stderr)
    assert_named(done.stderr, code)
    assert SECRET not in done.stdout
    assert tree_digest(home.parent) == before


@pytest.mark.parametrize(("name", "line"), [("deeply nested JSON", DEEP), ("a huge integer", HUGE)])
def test_explain_on_hostile_json_names_the_line(tmp_path: Path, name: str, line: str) -> None:
    """Finding 4: `explain` on deeply nested JSON or a huge integer names the line, exit 2."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"type": "run_started"}\n' + line + "\n")
    done = cli("explain", path, home=None)
    assert done.returncode == 2, (name, done.stderr)
    assert_named(done.stderr, "TIMELINE_UNREADABLE")
    assert "line 2: " in done.stderr and done.stdout == ""


def test_json_output_carries_the_error_as_data(home: Path) -> None:
    """With --json an error is data on stdout too: error, error_code, remedy."""
    done = cli("resume", "run-never-seen", "--json", home=home)
    data = json.loads(done.stdout)
    assert set(data) == {"error", "error_code", "remedy"} and data["error_code"] == "run_not_found"
    assert "run-never-seen" in data["error"] and data["remedy"]


safe_argv_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=300,
).filter(lambda s: not s.startswith("-"))


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(run_id=safe_argv_text)
def test_generated_run_ids_through_the_cli_are_named_never_a_traceback(tmp_path: Path, run_id: str) -> None:
    """Generated run ids through the CLI: a named error (2 or 4), never a traceback."""
    done = cli("status", run_id, "--home", str(tmp_path), home=None)
    assert done.returncode in (2, 4), done.stderr
    assert "Traceback" not in done.stderr and "error: " in done.stderr


# -- the real HTTP server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, Path]]:
    home = tmp_path_factory.mktemp("api") / "home"
    parked_run(home, stale=True)
    service = open_home(home)
    settings_ = ApiSettings(TOKEN, sandboxes=("local:/nonexistent/*", "local:/usr/*", "docker:*"))
    with served(service, settings_) as base, httpx.Client(base_url=base, timeout=60) as client:
        yield client, home
    close(service)


#: (name, method, raw path, body, status, error code). Statuses as documented in adapters/http_api.py.
HTTP_CASES: list[tuple[str, str, str, Any, int, str]] = [
    ("run id %2e%2e", "POST", "/runs/%2e%2e/resume", {}, 400, "invalid_run_id"),
    ("run id a;b", "POST", "/runs/a;b/resume", {}, 400, "invalid_run_id"),
    ("run id a b", "GET", "/runs/a%20b/status", None, 400, "invalid_run_id"),
    ("run id of 5,000 characters", "POST", "/runs/" + "x" * 5000 + "/resume", {}, 400, "invalid_run_id"),
    ("bogus sandbox", "POST", f"/runs/{RUN}/resume", {"sandbox": "bogus"}, 403, "sandbox_not_allowed"),
    (
        "allowed but absent local",
        "POST",
        f"/runs/{RUN}/resume",
        {"sandbox": "local:/nonexistent/a"},
        400,
        "config_invalid",
    ),
    (
        "allowed pattern, walking out with ..",
        "POST",
        f"/runs/{RUN}/resume",
        {"sandbox": "local:/usr/../etc"},
        400,
        "config_invalid",
    ),
    ("sandbox not a string", "POST", f"/runs/{RUN}/resume", {"sandbox": 7}, 422, "invalid_request"),
    ("consent as a string", "POST", f"/runs/{RUN}/resume", {"force": "yes"}, 422, "invalid_request"),
    ("misspelt field", "POST", f"/runs/{RUN}/resume", {"acept_scratch_loss": True}, 422, "invalid_request"),
    ("body not an object", "POST", f"/runs/{RUN}/resume", [1, 2], 422, "invalid_request"),
    ("unknown run", "POST", "/runs/run-never-seen/resume", {}, 404, "run_not_found"),
    ("no such route", "GET", "/nothing", None, 404, "not_found"),
]


@pytest.mark.parametrize(
    ("name", "method", "path", "body", "status", "code"), HTTP_CASES, ids=[c[0] for c in HTTP_CASES]
)
def test_every_bad_http_input_is_named_with_its_status_and_changes_nothing(
    server: tuple[httpx.Client, Path], name: str, method: str, path: str, body: Any, status: int, code: str
) -> None:
    """Finding 4: each bad input through the real server, named, with its documented status."""
    client, home = server
    before = tree_digest(home)
    got = client.request(method, httpx.URL(str(client.base_url).rstrip("/") + path), json=body, headers=AUTH)
    assert got.status_code == status, (name, got.text)
    assert got.json()["error_code"] == code and got.json()["remedy"]
    assert tree_digest(home) == before


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("deeply nested JSON", DEEP.encode()[:60000]),
        ("huge integer", b'{"force": ' + b"9" * 5000 + b"}"),
        ("not JSON", b"{nope"),
    ],
)
def test_hostile_bodies_are_named_not_500(server: tuple[httpx.Client, Path], name: str, raw: bytes) -> None:
    """Finding 4: hostile bodies are named errors, never a 500."""
    client, _ = server
    got = client.post(f"/runs/{RUN}/resume", content=raw, headers=AUTH | {"content-type": "application/json"})
    assert got.status_code in (400, 422), (name, got.text)
    assert got.json()["error_code"] == "invalid_request"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)
bodies = st.dictionaries(
    st.sampled_from(["force", "accept_scratch_loss", "source_changed", "sandbox", "scratch", "x"])
    | st.text(max_size=8),
    json_values,
    max_size=4,
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(run_id=st.text(min_size=0, max_size=200), body=bodies)
def test_generated_run_ids_and_bodies_are_named_never_500_and_write_nothing(
    server: tuple[httpx.Client, Path], run_id: str, body: dict[str, Any]
) -> None:
    """Generated run ids and bodies through the real server: named, never 500, nothing written."""
    client, home = server
    before = tree_digest(home)
    base = str(client.base_url).rstrip("/")
    path = f"/runs/{quote(run_id, safe='')}/resume"
    got = client.post(httpx.URL(base + path), json=body, headers=AUTH)
    assert got.status_code in (400, 403, 404, 409, 422), got.text
    assert got.json()["error_code"] and got.json()["remedy"]
    status = client.get(httpx.URL(base + f"/runs/{quote(run_id, safe='')}/status"))
    assert status.status_code in (200, 400, 404), status.text
    assert tree_digest(home) == before


def test_printable_run_ids_are_checked_by_the_domain_alone() -> None:
    """The allowed alphabet the CLI and the API rely on (letters, digits, '.', '_', '-')."""
    from scratchbank.domain.errors import InvalidRunId
    from scratchbank.domain.runs import check_run_id

    for ch in set(string.printable) - set(string.ascii_letters + string.digits + "._-"):
        with pytest.raises(InvalidRunId):
            check_run_id(f"a{ch}b")


def test_serve_on_a_port_in_use_is_named(home: Path) -> None:
    """`serve` binds its socket itself: a port in use is CONFIG_INVALID naming why, exit 2."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        done = cli("serve", "--port", str(held.getsockname()[1]), home=home)
    assert done.returncode == 2
    assert_named(done.stderr, "CONFIG_INVALID")
    assert "Address already in use" in done.stderr
