"""Tests read no wall clock: a time they need comes from an injected clock (ManualClock), so no
result depends on today's date (issue 20, finding 8: a test failed from 2026-12-01 on)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WALL_CLOCK = {("datetime", "now"), ("datetime", "utcnow"), ("date", "today"), ("time", "time")}
ALLOWED = {
    ROOT / "src" / "scratchbank" / "testing" / "clocks.py",
    # real runner processes stamp their records with their own clocks: "now" is theirs too
    ROOT / "tests" / "rigs" / "swept_cluster.py",
}


def _wall_clock_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if (name, node.func.attr) in WALL_CLOCK:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}.{node.func.attr}()")
    return found


def test_no_test_reads_the_wall_clock_outside_a_clock_module() -> None:
    """datetime.now / date.today / time.time appear in no test (time.monotonic for deadlines is fine)."""
    files = [p for folder in ("tests", "property_tests") for p in sorted((ROOT / folder).rglob("*.py"))]
    calls = [call for path in files if path not in ALLOWED for call in _wall_clock_calls(path)]
    assert not calls, "inject a clock (scratchbank.testing.clocks.ManualClock) instead of: " + ", ".join(
        calls
    )


def test_every_file_allowed_a_wall_clock_exists() -> None:
    """A renamed or removed clock module leaves no stale entry behind (a rename made the
    allowed file's new name a failure and its old one an entry for nothing)."""
    assert sorted(str(p.relative_to(ROOT)) for p in ALLOWED if not p.exists()) == []
