"""Rules P: deploying: the runner, its settings, its image and its Kubernetes pods (ADR 0012). The pure
tier's tests of P10 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rigs.checkpoint_stamps import URLS

from scratchbank.domain.errors import ConfigInvalid

# ---- from tests/test_rules_checkpoints.py: Checkpoint stamps (ADR 0013): staleness read from the checkpoint itself (N1, N2, K1-K5).


@pytest.mark.parametrize("value", ["0", "65", "five", "-1", "1.5", "\u0663", "5 checkpoints"])
def test_P10_K8_a_bad_retention_setting_is_named(value: str) -> None:
    """SCRATCHBANK_RETAIN outside 1-64, or not a whole number: ConfigInvalid naming it and its range."""
    from scratchbank.adapters.config import settings_from

    with pytest.raises(ConfigInvalid, match=r"SCRATCHBANK_RETAIN=.*from 1 to 64") as caught:
        settings_from({**URLS, "SCRATCHBANK_RETAIN": value})
    assert "SCRATCHBANK_RETAIN" in caught.value.remedy


def test_P10_K8_the_cli_names_a_bad_retention_setting_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`scratchbank status` with SCRATCHBANK_RETAIN=65: exit 2, CONFIG_INVALID naming it; nothing opened.
    Proves ``scratchbank.adapters.cli.main``."""
    from scratchbank.adapters.cli import main

    monkeypatch.setenv("SCRATCHBANK_HOME", str(tmp_path))
    monkeypatch.setenv("SCRATCHBANK_RETAIN", "65")
    assert main(["status", "run-1"]) == 2
    err = capsys.readouterr().err
    assert "CONFIG_INVALID" in err and "SCRATCHBANK_RETAIN" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no timeline was created
