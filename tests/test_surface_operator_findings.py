"""Issue 20's wrong results 1-7, each through the installed command or the real HTTP server:
the named error, its exit status or HTTP status from the one table, its remedy in the
surface's words, and nothing changed on disk by a refusal."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from operator_rigs import EXE, RUN, TOKEN, cli, parked_run, served, tree_digest
from rigs.real_sandboxes import container_rig

from scratchbank.adapters import cli as cli_module
from scratchbank.adapters import config, error_table
from scratchbank.adapters.bootstrap import close, open_home
from scratchbank.adapters.http_api import ApiSettings
from scratchbank.domain import errors

AUTH = {"authorization": f"Bearer {TOKEN}"}


NO_PODMAN = {"SCRATCHBANK_PODMAN_URL": "", "CONTAINER_HOST": ""}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    parked_run(tmp_path / "home", stale=False)
    return tmp_path / "home"


# -- 1: podman:NAME never reaches Docker ---------------------------------------------------------
def test_finding1_podman_without_a_podman_url_is_CONFIG_INVALID_not_docker(home: Path) -> None:
    """A podman: spec with no Podman socket named is refused by name; Docker is never asked."""
    before = tree_digest(home)
    done = cli("resume", RUN, "--sandbox", "podman:some-box", home=home, **NO_PODMAN)
    assert done.returncode == 2, done.stderr
    assert "error: CONFIG_INVALID" in done.stderr and "SCRATCHBANK_PODMAN_URL" in done.stderr
    assert tree_digest(home) == before


def test_finding1_the_engine_url_of_each_spec() -> None:
    """Docker's URL may default (its local socket); Podman's must be named."""
    assert config.engine_url(podman=False, env={}) is None
    assert config.engine_url(podman=True, env={"CONTAINER_HOST": "unix:///p.sock"}) == "unix:///p.sock"
    with pytest.raises(errors.ConfigInvalid):
        config.engine_url(podman=True, env={"SCRATCHBANK_DOCKER_URL": "unix:///d.sock"})


# -- 2 and 3: remedies that fit the case ---------------------------------------------------------
def test_finding2_the_403_remedy_names_how_the_operator_allows_a_sandbox(home: Path) -> None:
    """SANDBOX_NOT_ALLOWED points at the server's allow-list, not at a GET /config that is not there."""
    service = open_home(home)
    try:
        with served(service, ApiSettings(TOKEN, sandboxes=("local:/srv/*",))) as url:
            got = httpx.post(f"{url}/runs/{RUN}/resume", json={"sandbox": "docker:x"}, headers=AUTH)
            assert "/config" not in httpx.get(f"{url}/openapi.json").text
    finally:
        close(service)
    body = got.json()
    assert got.status_code == 403 and body["error_code"] == "sandbox_not_allowed"
    assert "/config" not in body["remedy"] and "--allow-sandbox" in body["remedy"]


@pytest.mark.docker
def test_finding3_a_gone_container_on_resume_has_the_resume_remedy(home: Path, docker_url: str) -> None:
    """SANDBOX_GONE on a resume says to start the sandbox, not the teardown's 'nothing to do'."""
    before = tree_digest(home)
    done = cli("resume", RUN, "--sandbox", "docker:no-such-box-here", home=home)
    assert done.returncode == 5 and "error: SANDBOX_GONE" in done.stderr
    assert "nothing to do" not in done.stderr and "start the sandbox" in done.stderr
    assert tree_digest(home) == before


# -- 4: user mistakes are named, never "a bug" ---------------------------------------------------
@pytest.mark.parametrize(
    "env",
    [
        {"SCRATCHBANK_TIMELINE": "postgresql://app@[::1/db"},
        {"SCRATCHBANK_BANK": "s3://[::1/prefix"},
        {"SCRATCHBANK_QUEUE": "nats://[::1:4222"},
    ],
    ids=["timeline", "banks", "queue"],
)
def test_finding4_a_malformed_IPv6_URL_is_CONFIG_INVALID(home: Path, env: dict[str, str]) -> None:
    """urllib's 'Invalid IPv6 URL' is the user's mistake: CONFIG_INVALID, exit 2."""
    done = cli("status", RUN, home=home, **env)
    assert done.returncode == 2, done.stderr
    assert "CONFIG_INVALID" in done.stderr and "INTERNAL_ERROR" not in done.stderr


def test_finding4_a_home_this_user_cannot_read_is_CONFIG_INVALID(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A PermissionError under the home (as a user without access meets it) is named, exit 2."""
    real = Path.is_file

    def denied(path: Path) -> bool:
        if path.parent == home:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(Path, "is_file", denied)
    code = cli_module.main(["status", RUN, "--home", str(home)])
    err = capsys.readouterr().err
    assert code == 2 and "CONFIG_INVALID" in err and "Permission denied" in err, err
    assert "INTERNAL_ERROR" not in err


def test_finding4_a_reader_that_goes_away_is_not_a_bug(home: Path) -> None:
    """`status --json | head`: a reader gone before the output ends the command quietly (exit 0),
    never INTERNAL_ERROR nor Python's 'Exception ignored ... BrokenPipeError'."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRATCHBANK_")} | {
        "SCRATCHBANK_HOME": str(home)
    }
    reader_gone = subprocess.run(
        f"'{EXE}' status {RUN} --json | true; exit ${{PIPESTATUS[0]}}",  # the reader is gone at once
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert reader_gone.returncode == 0, reader_gone.stderr
    assert "INTERNAL_ERROR" not in reader_gone.stderr and "BrokenPipe" not in reader_gone.stderr


def test_finding4_open_home_on_a_file_is_CONFIG_INVALID(tmp_path: Path) -> None:
    """open_home('a-file') is a named error, not a raw FileExistsError; the file is untouched."""
    path = tmp_path / "a-file"
    path.write_text("mine")
    with pytest.raises(errors.ConfigInvalid):
        open_home(path)
    with pytest.raises(errors.ConfigInvalid):
        open_home(path / "below")
    assert path.read_text() == "mine"


# -- 5: with a queue, status and resume agree ----------------------------------------------------
def test_finding5_with_a_queue_status_does_not_ask_for_a_sandbox(home: Path) -> None:
    """With a queue the runner starts the sandbox: status says so, not '--sandbox is required'."""
    url = os.environ.get("SCRATCHBANK_NATS_URL")
    if not url:
        pytest.skip("no NATS server (SCRATCHBANK_NATS_URL)")
    done = cli("status", RUN, home=home, SCRATCHBANK_QUEUE=url)
    assert done.returncode == 0, done.stderr
    assert "--sandbox is required" not in done.stdout and "the runner restores" in done.stdout
    data = json.loads(cli("status", RUN, "--json", home=home, SCRATCHBANK_QUEUE=url).stdout)
    assert data["needs_target"] is False


# -- 6: every error on every surface through the one table ---------------------------------------
def test_finding6_explain_json_prints_the_error_on_stdout(tmp_path: Path) -> None:
    """explain --json on a bad file: the {error, error_code, remedy} JSON on stdout, exit 2."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    done = cli("explain", bad, "--json", home=None)
    assert done.returncode == 2
    assert json.loads(done.stdout)["error_code"] == "timeline_unreadable"


def test_finding6_an_unreachable_docker_engine_exits_5(home: Path) -> None:
    """Docker that does not answer is a sandbox failure (exit 5, as the table says), not bad input."""
    before = tree_digest(home)
    done = cli(
        "resume",
        RUN,
        "--sandbox",
        "docker:box",
        home=home,
        SCRATCHBANK_DOCKER_URL="unix:///nonexistent/docker.sock",
    )
    assert done.returncode == 5, done.stderr
    assert "error: EXEC_FAILED" in done.stderr and "remedy: start the Docker engine" in done.stderr
    assert tree_digest(home) == before


@pytest.mark.docker
def test_finding6_a_stopped_container_is_named_on_the_cli_and_over_http(home: Path, docker_url: str) -> None:
    """A stopped container: `error:`/`remedy:` lines, exit 5, the name the user gave; HTTP 409
    with {error, error_code, remedy}; nothing written either way."""
    with container_rig("docker-busybox") as rig:
        client = docker.DockerClient(base_url=docker_url)
        box = client.containers.get(rig.sandbox.container_id)
        box.stop(timeout=0)
        before = tree_digest(home)
        done = cli("resume", RUN, "--sandbox", f"docker:{box.name}", home=home)
        assert done.returncode == 5, done.stderr
        assert "error: SANDBOX_GONE" in done.stderr and "remedy: " in done.stderr
        assert box.name in done.stderr and rig.sandbox.container_id[:12] not in done.stderr
        service = open_home(home)
        try:
            with served(service, ApiSettings(TOKEN, sandboxes=("docker:*",))) as url:
                got = httpx.post(
                    f"{url}/runs/{RUN}/resume", json={"sandbox": f"docker:{box.name}"}, headers=AUTH
                )
        finally:
            close(service)
        client.close()
        assert got.status_code == 409
        assert {"error", "error_code", "remedy"} <= set(got.json()) and got.json()[
            "error_code"
        ] == "sandbox_gone"
        assert tree_digest(home) == before


def test_finding6_not_json_answers_what_the_table_and_the_openapi_say(home: Path) -> None:
    """A body that is not JSON: INVALID_REQUEST at the table's status, which the OpenAPI documents."""
    service = open_home(home)
    try:
        with served(service, ApiSettings(TOKEN)) as url:
            got = httpx.post(
                f"{url}/runs/{RUN}/resume",
                content=b"not json",
                headers=AUTH | {"content-type": "application/json"},
            )
            spec: dict[str, Any] = httpx.get(f"{url}/openapi.json").json()
    finally:
        close(service)
    status = error_table.http_status(errors.InvalidRequest("x"))
    assert got.status_code == status and got.json()["error_code"] == "invalid_request"
    responses = spec["paths"]["/runs/{run_id}/resume"]["post"]["responses"]
    assert "INVALID_REQUEST" in responses[str(status)]["description"]
    assert "not JSON" not in responses["400"]["description"]
    assert "not JSON" not in spec["info"]["description"]  # the API's own text claimed 400 for it


# -- 7: status says what a resume would really do ------------------------------------------------
def test_finding7_status_with_the_bank_missing_says_the_resume_would_be_refused(home: Path) -> None:
    """The gate says RESTORE, the store has no bank: status says X4's refusal and exits 3;
    with the loss accepted it says the run goes on without the scratch (exit 0)."""
    (home / "banks").rename(home / "banks-gone")
    done = cli("status", RUN, home=home)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "in the store: missing" in done.stdout
    assert "resume: REFUSE SCRATCH_NOT_PORTABLE (X4: the bank is gone or will not extract)" in done.stdout
    assert "resume: RESTORE (X1" not in done.stdout
    accepted = cli("status", RUN, "--accept-scratch-loss", "--json", home=home)
    assert accepted.returncode == 0
    data = json.loads(accepted.stdout)
    assert data["would"]["verdict"] == "go_on_without" and data["goes_on"] is True
    service = open_home(home)
    try:
        with served(service, ApiSettings(TOKEN)) as url:
            body = httpx.get(f"{url}/runs/{RUN}/status").json()
    finally:
        close(service)
    assert body["goes_on"] is False and body["would"]["rule"] == "X4"


# -- friction: cut echoes, global options anywhere, `with` -------------------------------------
def test_a_10000_character_run_id_is_echoed_cut(home: Path) -> None:
    """INVALID_RUN_ID names the id cut, with its length, not 10,000 characters back."""
    done = cli("status", "x" * 10_000, home=home)
    assert done.returncode == 2 and "INVALID_RUN_ID" in done.stderr
    assert len(done.stderr) < 2000 and "characters)" in done.stderr


def test_global_options_stand_before_or_after_the_command(home: Path, tmp_path: Path) -> None:
    """--home before the command and --log-format after it both work."""
    done = cli(
        "--home", home, "status", RUN, "--log-format", "json", "--log-level", "info", home=None, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert any(line.startswith("{") for line in done.stderr.splitlines())


def test_the_service_closes_with_with(tmp_path: Path) -> None:
    """`with open_home(...) as service:` closes the timeline on the way out."""
    closed: list[bool] = []
    with open_home(tmp_path / "h") as service:
        timeline: Any = service.timeline
        original = timeline.close
        timeline.close = lambda: (closed.append(True), original())
        service.timeline.read(RUN)
    assert closed == [True]


def test_sizes_are_in_human_units() -> None:
    """Sizes read 1.5 KiB / 3.0 MiB; a stage's plain line too (no raw byte counts, no '298GB/s')."""
    import io

    from scratchbank.adapters.present import human_bytes
    from scratchbank.adapters.terminal import StageProgress

    assert [human_bytes(n) for n in (10, 1536, 3 << 20, 5 << 30)] == [
        "10 bytes",
        "1.5 KiB",
        "3.0 MiB",
        "5.0 GiB",
    ]
    out = io.StringIO()
    progress = StageProgress(out)
    progress("fetch", 3 << 20, 3 << 20)
    assert out.getvalue() == "  fetch: 3.0 MiB\n"


def test_status_opens_the_timeline_read_only(tmp_path: Path) -> None:
    """`status` writes nothing to the timeline: not a snapshot of a long run, not a table, and
    the database file keeps its bytes (SQLite opened mode=ro)."""
    import hashlib
    import sqlite3
    from contextlib import closing

    from scratchbank.adapters.event_store import EventStoreTimeline
    from scratchbank.application.resume import SNAPSHOT_EVERY
    from scratchbank.testing.builders import node, started

    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/timeline.db")
    timeline.append(RUN, [started(), *(node(f"n{i}", "tool") for i in range(SNAPSHOT_EVERY))])
    timeline.close()
    db = tmp_path / "timeline.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()

    def snapshots() -> int:  # the appends save their own (ADR 0010); a read saves none
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as read:
            return int(read.execute("SELECT COUNT(*) FROM stored_snapshots").fetchone()[0])

    saved = snapshots()
    done = cli("status", RUN, home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert snapshots() == saved, "a read saved a snapshot"
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_status_leaves_no_sqlite_side_files_and_does_not_checkpoint(tmp_path: Path) -> None:
    """A read-only `status` creates no -wal/-shm (or -journal) beside the timeline, and the
    database file keeps its bytes and its mtime (no checkpoint)."""
    import hashlib

    from scratchbank.testing.builders import node

    parked_run(tmp_path, stale=False)
    service = open_home(tmp_path)  # a last append, left in the WAL as a writer leaves it
    try:
        service.timeline.append(RUN, [node("late", "tool")])
    finally:
        close(service)
    db = tmp_path / "timeline.db"

    def seen() -> tuple[list[str], str, int]:
        names = sorted(p.name for p in tmp_path.iterdir())
        return names, hashlib.sha256(db.read_bytes()).hexdigest(), db.stat().st_mtime_ns

    before = seen()
    assert not [n for n in before[0] if n.endswith(("-wal", "-shm", "-journal"))], before[0]
    done = cli("status", RUN, home=tmp_path)
    assert done.returncode == 3 and done.stdout.startswith(f"run {RUN}"), done.stderr  # R2: refused
    assert seen() == before
