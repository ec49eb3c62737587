"""Shared fixtures: the real engines and servers ./dev test started, found by env vars.

Under CI (CI=true) a missing engine fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engines import need


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder in memory (/dev/shm) where there is one, else the test's own: the SQLite
    file and the bank store stay real files, without a disk's fsyncs."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    made = Path(tempfile.mkdtemp(prefix="explorer-", dir=shm))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_endpoint() -> str:
    return need("SCRATCHBANK_S3_ENDPOINT", "the S3 server")


@pytest.fixture(scope="session")
def postgres_url() -> str:
    return need("SCRATCHBANK_POSTGRES_URL", "PostgreSQL")


@pytest.fixture(scope="session")
def docker_url() -> str:
    return need("SCRATCHBANK_DOCKER_URL", "the Docker engine")


@pytest.fixture(scope="session")
def podman_url() -> str:
    return need("SCRATCHBANK_PODMAN_URL", "the Podman service")


#: what the workers of a parallel run (pytest-xdist) exercised, sent back as they end
_FROM_WORKERS: dict[str, list[Any]] = {"exercised": [], "explored": []}


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A worker of a parallel run sends the controller what it exercised and explored."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is None:
        return
    from engines import EXERCISED

    from scratchbank.testing.explorer import EXPLORED

    workeroutput["exercised"] = sorted(EXERCISED)
    workeroutput["explored"] = [
        {
            k: getattr(e, k)
            for k in ("name", "depth", "actors", "schedules", "violations", "seconds", "counted")
        }
        for e in EXPLORED
    ]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    out = getattr(node, "workeroutput", {})
    _FROM_WORKERS["exercised"] += out.get("exercised", [])
    _FROM_WORKERS["explored"] += out.get("explored", [])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which real engines this run exercised (CI fails a test when one is missing)."""
    from engines import EXERCISED

    from scratchbank.testing.explorer import EXPLORED, Exploration, summary_line

    exercised = set(EXERCISED) | set(_FROM_WORKERS["exercised"])
    explored = list(EXPLORED) + [Exploration(**e) for e in _FROM_WORKERS["explored"]]
    services = {
        "s3": "SCRATCHBANK_S3_ENDPOINT",
        "postgres": "SCRATCHBANK_POSTGRES_URL",
    }
    up = [name for name, var in services.items() if os.environ.get(var)]
    terminalreporter.write_line(
        f"engines exercised: {', '.join(sorted(exercised)) or 'none'}; servers: {', '.join(up) or 'none'}"
    )
    if explored:  # issue 18: the interleaving explorer's line, never captured
        terminalreporter.write_line(summary_line(explored))
