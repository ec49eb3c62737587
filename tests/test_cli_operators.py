"""The operators' CLI end to end (subprocesses, the embedded default: SQLite, banks on disk).

Each of issue 12's findings 1-3 and 6 (the CLI's part) is a test here.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import subprocess
from pathlib import Path

from operator_rigs import EXE, RUN, cli, parked_run, tree_digest

from scratchbank.adapters.bootstrap import close, open_home
from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.present import status_text
from scratchbank.domain.records import ScratchBanked
from scratchbank.testing.builders import started
from scratchbank.testing.clocks import ManualClock


def test_an_unknown_run_is_RUN_NOT_FOUND_and_nothing_is_written(tmp_path: Path) -> None:
    """Finding 2: no phantom run; status and resume alike."""
    parked_run(tmp_path, stale=False)
    before = tree_digest(tmp_path)
    for command in ("resume", "status"):
        done = cli(command, "run-never-seen", home=tmp_path)
        assert done.returncode == 4, done.stderr
        assert "RUN_NOT_FOUND" in done.stderr and "Traceback" not in done.stderr
    assert tree_digest(tmp_path) == before


def test_read_only_commands_create_nothing_from_the_wrong_folder(tmp_path: Path) -> None:
    """Finding 2: `status` in a folder with no home is HOME_NOT_FOUND; no var/ is born."""
    done = cli("status", RUN, home=None, cwd=tmp_path)
    assert done.returncode == 4 and "HOME_NOT_FOUND" in done.stderr
    assert list(tmp_path.iterdir()) == []
    empty_home = tmp_path / "home"
    empty_home.mkdir()
    done = cli("status", RUN, home=empty_home)
    assert done.returncode == 4 and "HOME_NOT_FOUND" in done.stderr and "no timeline" in done.stderr
    assert list(empty_home.iterdir()) == []


def test_the_home_is_found_walking_up_and_printed(tmp_path: Path) -> None:
    """The home is explicit or found (var/scratchbank above the working directory), and said."""
    home = tmp_path / "var" / "scratchbank"
    parked_run(home, stale=False)
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    done = cli("status", RUN, home=None, cwd=deep)
    assert done.returncode == 0, done.stderr
    assert f"home {home} (found from {deep})" in done.stderr
    done = cli("status", RUN, "--home", str(home), home=None, cwd=deep)
    assert f"home {home} (--home)" in done.stderr


def test_status_says_exactly_what_resume_does(tmp_path: Path) -> None:
    """Finding 3: one function decides both; status's decision is resume's decision."""
    parked_run(tmp_path / "home", stale=False)
    home = tmp_path / "home"
    status = json.loads(cli("status", RUN, "--json", home=home).stdout)
    assert status["resume"]["verdict"] == "restore" and status["needs_target"] is True
    target = tmp_path / "box"
    target.mkdir()
    done = cli("resume", RUN, "--sandbox", f"local:{target}", "--json", home=home)
    assert json.loads(done.stdout)["decision"] == status["resume"]


def test_status_checks_the_bank_is_in_the_store_as_recorded(tmp_path: Path) -> None:
    """Finding 3: a deleted or replaced archive is reported, not the record alone."""
    parked_run(tmp_path, stale=False)
    status = json.loads(cli("status", RUN, "--json", home=tmp_path).stdout)
    assert status["store"]["verdict"] == "matches"
    assert status["store"]["sha256"] == status["state"]["bank"]["sha256"]
    # the teardown wrote `at` from its clock, so a real bank's age is known (finding 3)
    assert status["state"]["bank"]["written"] is not None and status["age_seconds"] >= 0
    archive = tmp_path / "banks" / "runs" / RUN / "banks" / f"{status['state']['bank']['sha256']}.tgz"
    archive.write_bytes(archive.read_bytes() + b"\0")
    assert json.loads(cli("status", RUN, "--json", home=tmp_path).stdout)["store"]["verdict"] == "differs"
    archive.unlink()
    done = cli("status", RUN, home=tmp_path)
    assert "in the store: missing" in done.stdout


def test_status_shows_the_banks_age_when_its_record_says_when(tmp_path: Path) -> None:
    """Finding 3: the age comes from the record's `at` and the service's clock (injected here:
    nothing in this test reads today's date)."""
    clock = ManualClock()
    at = clock.now()
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/timeline.db")
    record = ScratchBanked(banked=True, empty=False, unknown=False, bytes=10, sha256="0" * 64, at=at)
    timeline.append(RUN, [started(), record])
    timeline.close()
    clock.advance(86400 + 2 * 3600 + 3 * 60 + 4)
    service = open_home(tmp_path, clock=clock)
    try:
        report = service.status(RUN)
    finally:
        close(service)
    assert report.age_seconds == 86400 + 2 * 3600 + 3 * 60 + 4
    assert "  bank age: 1d02h03m04s" in status_text(report)
    # the installed command shows the record's own time and an age line (its clock is the real one)
    data = json.loads(cli("status", RUN, "--json", home=tmp_path).stdout)
    assert data["state"]["bank"]["written"] == at.isoformat() and data["store"]["verdict"] == "missing"
    assert "bank age: " in cli("status", RUN, home=tmp_path).stdout


def test_progress_prints_each_stage_once_as_plain_lines(tmp_path: Path) -> None:
    """Finding 6: --progress off a terminal: one plain line per stage, none twice."""
    parked_run(tmp_path / "home", stale=False)
    target = tmp_path / "box"
    target.mkdir()
    done = cli("resume", RUN, "--progress", "--sandbox", f"local:{target}", home=tmp_path / "home")
    assert done.returncode == 0, done.stderr
    sized = re.compile(r": [\d.]+ (bytes|KiB|MiB|GiB)$")  # human units (issue 20)
    stages = [line.split(":")[0].strip() for line in done.stderr.splitlines() if sized.search(line)]
    assert len(stages) >= 2 and len(set(stages)) == len(stages), stages  # the stages are the restore's


def test_version_and_json_log_lines(tmp_path: Path) -> None:
    """Finding 6: --version; stdlib logging with a JSON-lines option."""
    done = cli("--version", home=None)
    assert done.returncode == 0 and done.stdout.startswith("scratchbank 0.")
    parked_run(tmp_path, stale=False)
    done = cli("--log-format", "json", "--log-level", "info", "status", RUN, home=tmp_path)
    logs = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert logs and {"time", "level", "logger", "message"} <= set(logs[0])
    assert any("run-9: restore" in entry["message"] for entry in logs)


def test_resume_refuses_with_the_hint_then_goes_on_with_the_consent(tmp_path: Path) -> None:
    """R2 then R7 through the CLI: refused (exit 3) with the hint; restored with the consent."""
    parked_run(tmp_path / "home", stale=True)
    done = cli("resume", RUN, "--json", home=tmp_path / "home")
    assert done.returncode == 3
    out = json.loads(done.stdout)
    assert out["decision"]["code"] == "SCRATCH_NOT_PORTABLE" and not out["proceeds"]
    assert out["decision"]["hint"].startswith("relaunch the run fresh")


def test_an_engine_home_is_created_with_its_folders(tmp_path: Path) -> None:
    """Finding 6: the engine's EventStoreTimeline creates its folder (no "unable to open")."""
    service = open_home(tmp_path / "new" / "home")
    close(service)
    timeline = EventStoreTimeline(f"sqlite:///{tmp_path}/other/deeper/timeline.db")
    timeline.close()
    assert (tmp_path / "new" / "home" / "timeline.db").is_file()
    assert (tmp_path / "other" / "deeper" / "timeline.db").is_file()


def test_demo_tells_both_scenarios(tmp_path: Path) -> None:
    """`scratchbank demo` still dispatches to the runner's story."""
    done = cli("demo", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "SCRATCH_NOT_PORTABLE" in done.stdout  # the story itself is the runner's test


def test_the_default_scratch_path_carries_no_other_products_name() -> None:
    """Finding 7: the default scratch in a container is scratchbank's own."""
    from scratchbank.adapters import config

    assert config.DEFAULT_SCRATCH == "/tmp/scratchbank-scratch"
    assert "iterion" not in cli("resume", "--help", home=None).stdout


def test_progress_on_a_terminal_draws_a_bar_per_stage(tmp_path: Path) -> None:
    """Finding 6: --progress on a real pseudo-terminal (0x0 window, as `script` makes): a bar per stage."""
    parked_run(tmp_path / "home", stale=False)
    target = tmp_path / "box"
    target.mkdir()
    main, terminal = pty.openpty()
    argv = [
        str(EXE),
        "resume",
        RUN,
        "--progress",
        "--sandbox",
        f"local:{target}",
        "--home",
        str(tmp_path / "home"),
    ]
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=terminal, text=True, timeout=120, check=False)
    os.close(terminal)
    shown = b""
    with contextlib.suppress(OSError):  # EIO once the terminal's other end is closed and drained
        while chunk := os.read(main, 65536):
            shown += chunk
    os.close(main)
    assert done.returncode == 0, shown
    finished = re.findall(r"\r([^\r\n|]+?): 100%\|", shown.decode(errors="replace"))
    assert len(set(finished)) >= 2, shown  # a full bar for each of the restore's stages
