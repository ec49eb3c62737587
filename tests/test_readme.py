"""The README's embedding example runs as written and says what it claims."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs_and_refuses_with_R2() -> None:
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert block, "README has a python example"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.group(1), "README.md", "exec"), {})
    assert out.getvalue().startswith("SCRATCH_NOT_PORTABLE R2 relaunch the run fresh")
