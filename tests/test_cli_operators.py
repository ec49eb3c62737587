"""The operators' CLI end to end: `status`, `resume` and `demo` as subprocesses, on the
embedded default (SQLite timeline, banks on disk)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.memory import FakeSandbox
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.testing.builders import node, started

EXE = Path(sys.executable).with_name("scratchbank")


def run(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SCRATCHBANK_HOME": str(home)}
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, env=env, check=False)


def parked_run(home: Path, *, stale: bool) -> None:
    timeline = EventStoreTimeline(f"sqlite:///{home}/timeline.db")
    timeline.append("run-9", [started(), node("clone", "tool")])
    bank_at_teardown(
        "run-9",
        timeline=timeline,
        store=FilesystemBankStore(home / "banks"),
        sandbox=FakeSandbox({"a.txt": b"kept"}),
        run_finished=False,
    )
    if stale:
        timeline.append("run-9", [node("measure", "agent")])
    timeline.close()


def test_status_shows_the_bank_its_age_staleness_and_what_a_resume_would_do(tmp_path: Path) -> None:
    parked_run(tmp_path, stale=True)
    done = run("status", "run-9", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "stale because of: measure" in done.stdout and "bank age:" in done.stdout
    assert "REFUSE SCRATCH_NOT_PORTABLE (R2)" in done.stdout
    data = json.loads(run("status", "run-9", "--json", home=tmp_path).stdout)
    assert data["state"]["stale"] and data["resume"]["code"] == "SCRATCH_NOT_PORTABLE"


def test_resume_refuses_with_the_hint_then_goes_on_with_the_consent(tmp_path: Path) -> None:
    parked_run(tmp_path, stale=True)
    done = run("resume", "run-9", "--json", home=tmp_path)
    assert done.returncode == 3
    out = json.loads(done.stdout)
    assert out["decision"]["code"] == "SCRATCH_NOT_PORTABLE" and not out["proceeds"]
    assert out["decision"]["hint"].startswith("relaunch the run fresh")
    done = run("resume", "run-9", "--accept-scratch-loss", "--json", home=tmp_path)
    out = json.loads(done.stdout)
    # no sandbox was given: the bank cannot be restored, and the loss was accepted (X4)
    assert out["proceeds"] and out["restore"]["rule"] == "X4"


def test_resume_of_an_unreadable_timeline_is_refused_without_a_code(tmp_path: Path) -> None:
    (tmp_path / "timeline.db").write_bytes(b"garbage" * 100)
    done = run("resume", "run-9", home=tmp_path)
    assert done.returncode != 0 and "TIMELINE_UNREADABLE" in done.stdout + done.stderr


def test_demo_tells_both_scenarios(tmp_path: Path) -> None:
    done = run("demo", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "sandbox 2 now holds: clone/README.md, verify.sh" in done.stdout
    assert "REFUSE SCRATCH_NOT_PORTABLE (R2)" in done.stdout
    assert "RESTORE (R7)" in done.stdout
