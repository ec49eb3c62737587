"""The runner's settings as environment variables.

First written for tests/rules/test_P_engines.py: The runner configured by settings only (issue 23,
item 2): the same timeline, bank store and queue as `scratchbank serve` and `scratchbank mcp` read,
plus the runner's own; every bad value a named error naming its variable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "workflow.json").write_text(json.dumps([{"name": "a", "kind": "tool", "command": "true"}]))
    pod = {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"name": "sandbox", "image": "x"}]}}
    (tmp_path / "pod.json").write_text(json.dumps(pod))
    return {
        "SCRATCHBANK_QUEUE": "nats://127.0.0.1:4222",
        "SCRATCHBANK_TIMELINE": "postgresql://sb:secret@db:5432/sb",
        "SCRATCHBANK_BANK": "s3://banks/runs",
        "SCRATCHBANK_WORKFLOW": str(tmp_path / "workflow.json"),
        "SCRATCHBANK_SANDBOX_PROVIDER": "kubernetes",
        "SCRATCHBANK_POD_TEMPLATE": str(tmp_path / "pod.json"),
        "SCRATCHBANK_POD_NAMESPACE": "runs",
        "SCRATCHBANK_RUNNER_NAME": "runner-7",
    }
