"""The README's embedding example and the package's docstring example run as written."""

from __future__ import annotations

import contextlib
import doctest
import io
import re
from pathlib import Path

import scratchbank

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs_and_refuses_with_R2() -> None:
    """The README's first example runs as written and refuses with R2."""
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert block, "README has a python example"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.group(1), "README.md", "exec"), {})
    assert out.getvalue().startswith("SCRATCH_NOT_PORTABLE R2 relaunch the run fresh")


def test_the_package_docstring_example_runs_as_a_doctest() -> None:
    """Finding 6: bank_at_teardown, resume and the adapters are exported; the cycle runs."""
    flags = doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL
    result = doctest.testmod(scratchbank, optionflags=flags, globs=dict(vars(scratchbank)))
    assert result.attempted >= 8 and result.failed == 0


def test_everything_the_docstring_promises_is_exported() -> None:
    """Finding 6: the use cases and adapters are exported; the bank stores have docstrings."""
    for name in ("bank_at_teardown", "resume", "bootstrap", "open_home", "ScratchService", "Target",
                 "EventStoreTimeline", "FilesystemBankStore", "S3BankStore", "DockerSandbox",
                 "KubernetesSandbox", "LocalSandbox", "InMemoryBankStore", "NoRestoreTarget"):  # fmt: skip
        assert name in scratchbank.__all__ and getattr(scratchbank, name) is not None, name
    assert scratchbank.FilesystemBankStore.__doc__ and scratchbank.S3BankStore.__doc__
