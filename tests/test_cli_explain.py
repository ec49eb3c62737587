"""`scratchbank explain TIMELINE.jsonl`: the decision with its rule and events, or a named error."""

from __future__ import annotations

import json
from pathlib import Path

from rigs.cli_process import run

from scratchbank.adapters.jsonl import write_timeline_file
from scratchbank.domain.records import UnknownRecord
from scratchbank.testing.builders import banked, node, resumed, started, unbanked


def test_explain_prints_the_refusal_with_rule_events_and_hint(tmp_path: Path) -> None:
    """explain prints the refusal with its rule, its events by line and the hint."""
    path = tmp_path / "t.jsonl"
    write_timeline_file(path, [started(), banked(), UnknownRecord(type="llm_usage"), node("measure")])
    done = run("explain", path)
    assert done.returncode == 0, done.stderr
    assert "REFUSE SCRATCH_NOT_PORTABLE (R2: a node ran after the bank)" in done.stdout
    assert "line 2 sandbox_scratch_banked, line 4 node_finished" in done.stdout
    assert "hint: relaunch the run fresh" in done.stdout
    assert "1 of types not read here, passed over" in done.stdout


def test_explain_json_carries_the_same_decision(tmp_path: Path) -> None:
    """explain --json carries the same decision as data."""
    path = tmp_path / "t.jsonl"
    write_timeline_file(path, [started(), unbanked("tar failed")])
    done = run("explain", path, "--json", "--source-changed")
    out = json.loads(done.stdout)
    assert out["resume"]["code"] == "SCRATCH_NOT_PORTABLE"
    assert out["resume"]["also_needs_force"] is True
    assert out["state"]["unbanked"] == {"at": "line 2", "reason": "tar failed"}
    done = run("explain", path, "--json", "--accept-scratch-loss")
    assert json.loads(done.stdout)["resume"]["verdict"] == "go_on_without"


def test_explain_surface_defers_while_the_latest_execution_may_bank(tmp_path: Path) -> None:
    """explain --surface shows R10's deferral."""
    path = tmp_path / "t.jsonl"
    write_timeline_file(path, [started(), banked(), node("a"), resumed()])
    assert "DEFER TO ENGINE (R10: " in run("explain", path, "--surface").stdout
