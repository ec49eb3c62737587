"""The core install alone: the wheel built from this tree, installed in a clean venv with no
extra, runs the demo and the README's first example; an adapter whose extra is missing is a
named error with the exact pip command (issue 20, extras)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTRAS_ONLY = ("docker", "kubernetes", "boto3", "fastapi", "uvicorn", "nats-py", "mcp", "psycopg")


def _run(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, env=env, timeout=900, check=False
    )
    assert done.returncode == 0, f"{cmd}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean venv holding the core wheel and its dependencies only."""
    base = tmp_path_factory.mktemp("core")
    wheels = base / "wheels"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheels, ROOT)
    (wheel,) = wheels.glob("scratchbank-*.whl")
    env_dir = base / "venv"
    # No pip of its own (ensurepip cost ~7 CPU-seconds): this interpreter's pip installs into it.
    venv.create(env_dir, with_pip=False, clear=True)
    _pip(env_dir, "install", "-q", wheel)
    return env_dir


def _pip(env_dir: Path, *args: str | Path) -> str:
    """This interpreter's pip acting on the clean venv (`pip --python`)."""
    return _run(sys.executable, "-m", "pip", "--python", env_dir / "bin" / "python", *args)


def _clean_env(home: Path) -> dict[str, str]:
    keep = {
        k: v for k, v in os.environ.items() if not k.startswith(("SCRATCHBANK_", "PYTHON", "VIRTUAL_ENV"))
    }
    return keep | {"HOME": str(home)}


def test_the_core_install_pulls_no_extra(core: Path) -> None:
    """None of the extras' clients comes with the core install."""
    listed = _pip(core, "list", "--format=freeze").lower()
    names = {line.split("==")[0] for line in listed.splitlines()}
    assert not names & set(EXTRAS_ONLY), names & set(EXTRAS_ONLY)
    assert "scratchbank" in names and len(names) < 25, sorted(names)


def test_the_core_install_runs_the_demo(core: Path, tmp_path: Path) -> None:
    """`scratchbank demo` on the core install: every part, the run ids and how to inspect them."""
    out = _run(core / "bin" / "scratchbank", "demo", cwd=tmp_path, env=_clean_env(tmp_path))
    assert "== 3." in out and "scratchbank --home" in out and "run-1.fix" in out
    rule = _run(core / "bin" / "scratchbank", "rules", "R2", cwd=tmp_path, env=_clean_env(tmp_path))
    assert rule.startswith("R2: a node ran after the bank")  # the reference ships in the wheel


def test_the_core_install_runs_the_readmes_first_example(core: Path, tmp_path: Path) -> None:
    """The README's first Python example, as written, on the core install."""
    block = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block is not None
    script = tmp_path / "example.py"
    script.write_text(block.group(1))
    out = _run(core / "bin" / "python", script, cwd=tmp_path, env=_clean_env(tmp_path))
    assert out.startswith("SCRATCH_NOT_PORTABLE R2")


def test_a_missing_extra_is_named_with_its_pip_command(core: Path, tmp_path: Path) -> None:
    """docker:NAME without the [docker] extra: CONFIG_INVALID and `pip install 'scratchbank[docker]'`."""
    env = _clean_env(tmp_path) | {"SCRATCHBANK_HOME": str(tmp_path)}
    (tmp_path / "timeline.db").touch()
    done = subprocess.run(
        [str(core / "bin" / "scratchbank"), "resume", "run-1", "--sandbox", "docker:box"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "CONFIG_INVALID" in done.stderr and "pip install 'scratchbank[docker]'" in done.stderr
    serve = subprocess.run(
        [str(core / "bin" / "scratchbank"), "mcp"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert serve.returncode == 2 and "pip install 'scratchbank[mcp]'" in serve.stderr, serve.stderr
