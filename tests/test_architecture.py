"""The architecture holds: the domain does no I/O, and no layer imports a higher one."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: What a pure module may import. Anything else (os, io, pathlib, subprocess, socket,
#: time, random, docker, boto3, eventsourcing, ...) fails the build.
PURE_MODULES = {
    "__future__",
    "typing",
    "collections",
    "collections.abc",
    "enum",
    "attrs",
    "datetime",
    "re",
    "functools",
    "itertools",
    "math",
    "types",
    "abc",
}
#: Names that read the clock, the environment, files or the console.
IMPURE_CALLS = {"open", "print", "input", "now", "utcnow", "today", "getenv", "time"}


def io_violations(source: str, filename: str = "<src>") -> list[str]:
    """Every import or call in ``source`` that a pure domain module must not make."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [f"{filename}: import {a.name}" for a in node.names if a.name not in PURE_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module not in PURE_MODULES:
                found.append(f"{filename}: from {node.module} import ...")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name in IMPURE_CALLS:
                found.append(f"{filename}:{node.lineno}: calls {name}()")
    return found


def test_domain_does_no_io() -> None:
    """Every module under domain/ imports only pure modules and calls no clock or file."""
    files = sorted((ROOT / "domain").glob("**/*.py"))
    assert files, "domain/ has no modules?"
    found = [v for f in files for v in io_violations(f.read_text(), f.name)]
    assert found == []


@pytest.mark.parametrize(
    "planted",
    [
        "import os",
        "from pathlib import Path",
        "import docker",
        "from eventsourcing.sqlite import SQLiteDatastore",
        "import boto3.session",
        "from datetime import datetime\nx = datetime.now()",
        "data = open('f').read()",
        "import time",
    ],
)
def test_the_purity_check_catches_planted_io(planted: str) -> None:
    assert io_violations(planted) != []


def test_layers_never_import_upward() -> None:
    """import-linter: adapters -> application -> domain, and the domain forbids I/O packages."""
    exe = Path(sys.executable).with_name("lint-imports")
    assert exe.exists(), "import-linter is a test dependency"
    done = subprocess.run([str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_the_bank_format_contract_names_every_use_case_module() -> None:
    """import-linter's bank-format contract forbids every application module outside the
    bank format, the ports and the cancellation model (a new use case is covered too)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in config if c.get("source_modules") == ["scratchbank.application.bank_format"]]
    allowed = {"__init__", "ports", "cancellation"}
    use_cases = {p.stem for p in (ROOT / "application").glob("*.py")} - allowed
    assert {f"scratchbank.application.{m}" for m in use_cases} <= set(contract["forbidden_modules"])


#: What writes a host directory's tree (adapters/host_directory.py): none of it is the
#: application's (issue 22: the host directory is a restore-target adapter).
HOST_DIRECTORY_IO = ("ctypes", "renameat2", "statvfs", "mountinfo", "dir_fd", "O_NOFOLLOW", "rmdir")


def host_directory_io(source: str, filename: str = "<src>") -> list[str]:
    """Every import of ctypes and every name of the host-directory writer in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            )
            found += [f"{filename}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] == "ctypes"]
            found += [f"{filename}:{node.lineno}: imports {n}" for n in names if n.endswith("host_directory")]
        elif isinstance(node, ast.Attribute | ast.Name | ast.keyword | ast.Constant):
            name = getattr(node, "attr", None) or getattr(node, "id", None) or getattr(node, "arg", None)
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                name = node.value
            if isinstance(name, str) and any(
                word == name or f"/{word}" in name for word in HOST_DIRECTORY_IO
            ):
                found.append(f"{filename}:{node.lineno}: {name}")
    return found


def test_the_application_does_no_host_directory_io() -> None:
    """The use cases hold the RestoreTarget port: no module under application/ imports
    ctypes or the adapter, nor creates a tree under directory fds (issue 22 item 1)."""
    files = sorted((ROOT / "application").glob("**/*.py"))
    found = [v for f in files for v in host_directory_io(f.read_text(), f.name)]
    assert found == []


@pytest.mark.parametrize(
    "planted",
    [
        "import ctypes",
        "from ctypes import CDLL",
        "from scratchbank.adapters.host_directory import HostDirectory",
        "from .host_directory import restore_into_host_directory",
        "libc.renameat2(1, b'a', 1, b'b', 2)",
        "os.mkdir(name, 0o700, dir_fd=fd)",
        "st = os.statvfs(probe)",
        "open('/proc/self/mountinfo')",
    ],
)
def test_the_host_directory_check_catches_planted_io(planted: str) -> None:
    assert host_directory_io(planted) != []


def test_installed_distribution_claims_only_scratchbank() -> None:
    """No generic top-level names (domain, adapters, application) leak into site-packages."""
    import importlib.util

    import scratchbank.domain

    assert scratchbank.domain.__name__ == "scratchbank.domain"
    for generic in ("domain", "adapters", "application"):
        spec = importlib.util.find_spec(generic)
        assert spec is None or ROOT / generic == Path(spec.origin or "").parent, generic
