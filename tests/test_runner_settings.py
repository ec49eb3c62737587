"""The runner configured by settings only (issue 23, item 2): the same timeline, bank store
and queue as `scratchbank serve` and `scratchbank mcp` read, plus the runner's own; every
bad value a named error naming its variable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scratchbank.adapters.config import settings_from
from scratchbank.adapters.runner_process import configure, parse
from scratchbank.adapters.runner_settings import runner_config
from scratchbank.domain.errors import ConfigInvalid


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


def test_P9_the_runner_reads_the_surfaces_settings_and_its_own(env: dict[str, str]) -> None:
    """Timeline, bank and queue are exactly what serve/mcp read from the same environment."""
    cfg = runner_config(env)
    assert cfg.settings == settings_from(env)
    assert (cfg.provider, cfg.pod_namespace, cfg.holder) == ("kubernetes", "runs", "runner-7")
    assert cfg.pod_template is not None and cfg.pod_template["spec"]["containers"][0]["name"] == "sandbox"
    assert "secret" not in cfg.describe()  # the password never shows


def test_P9_flags_win_over_the_environment(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's flags (for a person at a shell) override the environment (a Deployment)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = configure(parse(["--holder", "h2", "--bank", "file:///tmp/banks", "--lapse", "9"]))
    assert (cfg.holder, cfg.settings.bank_url, cfg.lapse) == ("h2", "file:///tmp/banks", 9.0)
    assert cfg.settings.timeline_url == env["SCRATCHBANK_TIMELINE"]


@pytest.mark.parametrize(
    ("var", "value", "named"),
    [
        ("SCRATCHBANK_QUEUE", "", "SCRATCHBANK_QUEUE"),
        ("SCRATCHBANK_QUEUE", "http://x", "queue URL"),
        ("SCRATCHBANK_SANDBOX_PROVIDER", "lambda", "SCRATCHBANK_SANDBOX_PROVIDER"),
        ("SCRATCHBANK_POD_TEMPLATE", "", "SCRATCHBANK_POD_TEMPLATE"),
        ("SCRATCHBANK_POD_TEMPLATE", "/nonexistent/pod.yaml", "SCRATCHBANK_POD_TEMPLATE"),
        ("SCRATCHBANK_POD_CONTAINER", "nope", "no container 'nope'"),
        ("SCRATCHBANK_POD_START_SECONDS", "-1", "SCRATCHBANK_POD_START_SECONDS"),
        ("SCRATCHBANK_LEASE_LAPSE", "soon", "SCRATCHBANK_LEASE_LAPSE"),
        ("SCRATCHBANK_WORKFLOW", "/nonexistent.json", "SCRATCHBANK_WORKFLOW"),
    ],
)
def test_P10_every_bad_setting_is_named(env: dict[str, str], var: str, value: str, named: str) -> None:
    """ConfigInvalid naming the variable (or the form it takes), before anything is opened."""
    env[var] = value
    with pytest.raises(ConfigInvalid, match=named):
        runner_config(env)


def test_P10_a_template_that_is_not_a_pod_is_named(env: dict[str, str], tmp_path: Path) -> None:
    """A Deployment, a list, or YAML that does not parse: each ConfigInvalid."""
    for text in ("kind: Deployment\nspec: {containers: [{name: a}]}\n", "- a\n- b\n", "a: [b\n"):
        (tmp_path / "pod.yaml").write_text(text)
        env["SCRATCHBANK_POD_TEMPLATE"] = str(tmp_path / "pod.yaml")
        with pytest.raises(ConfigInvalid, match=r"SCRATCHBANK_POD_TEMPLATE|not a Pod"):
            runner_config(env)


def test_P11_docker_and_local_providers_by_settings(env: dict[str, str], tmp_path: Path) -> None:
    """docker needs its image (and takes the engine's URL); local needs a folder."""
    env["SCRATCHBANK_SANDBOX_PROVIDER"] = "docker"
    with pytest.raises(ConfigInvalid, match="SCRATCHBANK_SANDBOX_IMAGE"):
        runner_config(env)
    env["SCRATCHBANK_SANDBOX_IMAGE"] = "sandbox:1"
    cfg = runner_config(env)
    assert (cfg.image, cfg.engine_url) == ("sandbox:1", "unix:///var/run/docker.sock")
    env["SCRATCHBANK_SANDBOX_PROVIDER"] = "local"
    env["SCRATCHBANK_SANDBOXES"] = str(tmp_path / "boxes")
    assert runner_config(env).sandboxes == tmp_path / "boxes"


def test_P10_the_runner_process_names_a_bad_setting_without_a_traceback(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 and one line naming the error; the password in a URL masked."""
    from scratchbank.adapters.runner_process import main

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SCRATCHBANK_SANDBOX_PROVIDER", "lambda")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: CONFIG_INVALID:") and "Traceback" not in err and "secret" not in err
