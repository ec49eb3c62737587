"""A nats-server of a test's own (JetStream on, files in a directory), to stop and restart."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from pathlib import Path

import pytest
from waiting import eventually


def nats_binary() -> str:
    found = shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None
    )
    if found:
        return found
    message = "nats-server is not installed: ./dev test installs it (apt-get install nats-server)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """``start``, ``stop`` (SIGTERM, then wait) and ``start`` again on the same port and store."""

    def __init__(self, store: Path) -> None:
        self.binary, self.port, self.store = nats_binary(), free_port(), store
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [self.binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.store)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        eventually(self.answers, timeout=10, what="nats-server starts")

    def answers(self) -> bool:
        """Whether the server takes a connection now."""
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def namespace() -> str:
    """Stream, consumer and bucket names of one test, on a shared server."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def nats_url() -> str:
    """The shared server ./dev test (scripts/services.sh) started."""
    from engines import need

    return need("SCRATCHBANK_NATS_URL", "the NATS server (JetStream)")
