"""The README's Docker quickstart, run as written against the real Docker engine: start a
container, write scratch, bank at teardown, remove it, resume into a new one (finding 6)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from engines import EXERCISED

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart_blocks() -> list[tuple[str, str]]:
    """The (language, code) blocks marked ``<!-- quickstart N -->``, in order."""
    found = re.findall(r"<!-- quickstart (\d+) -->\n```(\w+)\n(.*?)```", README.read_text(), re.S)
    return [(lang, code) for _, lang, code in sorted(found, key=lambda f: int(f[0]))]


def test_the_readme_has_the_three_quickstart_steps() -> None:
    """The quickstart is three marked blocks: shell, Python, shell."""
    assert [lang for lang, _ in quickstart_blocks()] == ["sh", "python", "sh"]


@pytest.mark.docker
def test_the_docker_quickstart_runs_as_written(tmp_path: Path, docker_url: str) -> None:
    """Finding 6: the quickstart, as written, against the real Docker engine."""
    suffix = uuid.uuid4().hex[:8]
    env = {k: v for k, v in os.environ.items() if k != "SCRATCHBANK_HOME"}
    env |= {"DOCKER_HOST": docker_url, "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"}
    outputs = []
    try:
        for lang, code in quickstart_blocks():
            code = code.replace("sb-first", f"sb-first-{suffix}").replace("sb-second", f"sb-second-{suffix}")
            argv = ["sh", "-ec", code] if lang == "sh" else [sys.executable, "-c", code]
            done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, (code, done.stdout, done.stderr)
            outputs.append(done.stdout)
    finally:
        for name in (f"sb-first-{suffix}", f"sb-second-{suffix}"):
            subprocess.run(["docker", "rm", "-f", name], env=env, capture_output=True, check=False)
    EXERCISED.add("docker")
    assert outputs[1].startswith("banked: True")
    assert "RESTORE" in outputs[2] and "restore: restored" in outputs[2]
    assert "\nhalf-done work\n" in outputs[2]
