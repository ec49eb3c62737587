"""Shared fixtures: the real engines and servers ./dev test started, found by env vars.

Under CI (CI=true) a missing engine fails the test instead of skipping it.
"""

from __future__ import annotations

import os

import pytest
from engines import need


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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which real engines this run exercised (CI fails a test when one is missing)."""
    from engines import EXERCISED

    services = {
        "s3": "SCRATCHBANK_S3_ENDPOINT",
        "postgres": "SCRATCHBANK_POSTGRES_URL",
    }
    up = [name for name, var in services.items() if os.environ.get(var)]
    terminalreporter.write_line(
        f"engines exercised: {', '.join(sorted(EXERCISED)) or 'none'}; servers: {', '.join(up) or 'none'}"
    )
    from scratchbank.testing.explorer import EXPLORED, summary_line

    if EXPLORED:  # issue 18: the interleaving explorer's line, never captured
        terminalreporter.write_line(summary_line())
