"""The installed ``scratchbank`` command run as a process.

First written for tests/test_cli_explain.py: `scratchbank explain TIMELINE.jsonl`: the decision with
its rule and events, or a named error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXE = Path(sys.executable).with_name("scratchbank")


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EXE), *map(str, args)], capture_output=True, text=True, check=False)
