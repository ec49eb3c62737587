"""Rigs for the operator surfaces: a home with a parked run, the CLI as a subprocess, the
HTTP API on a real loopback socket, and a checksum of everything a refusal must not touch."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import uvicorn
from waiting import eventually

from scratchbank.adapters.bootstrap import close, open_home
from scratchbank.adapters.http_api import ApiSettings, create_app
from scratchbank.adapters.memory import FakeSandbox
from scratchbank.application.service import ScratchService
from scratchbank.testing.builders import node, started

EXE = Path(sys.executable).with_name("scratchbank")
TOKEN = "t0ken-for-the-tests-0123456789"
RUN = "run-9"


def cli(
    *args: str | Path, home: Path | None, cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """The installed `scratchbank` command, with only the settings the test names."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SCRATCHBANK_") or k.endswith("_URL")}
    if home is not None:
        base["SCRATCHBANK_HOME"] = str(home)
    cmd = [str(EXE), *map(str, args)]
    return subprocess.run(
        cmd, capture_output=True, text=True, env=base | env, cwd=cwd, check=False, timeout=120
    )


def parked_run(home: Path, *, stale: bool, run_id: str = RUN) -> None:
    """A run that banked its scratch at teardown; ``stale``: a node finished after the bank."""
    service = open_home(home)
    try:
        service.timeline.append(run_id, [started(), node("clone", "tool")])
        service.bank_at_teardown(run_id, FakeSandbox({"a.txt": b"kept"}), run_finished=False)
        if stale:
            service.timeline.append(run_id, [node("measure", "agent")])
    finally:
        close(service)


def tree_digest(root: Path) -> str:
    """One digest of what is under ``root`` (a refusal changes nothing): every file's path and
    bytes, a SQLite database by its rows (its pages move when a reader checkpoints)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if not p.name.endswith(SQLITE_SIDE_FILES)):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        if path.suffix == ".db":
            digest.update(_rows(path))
        elif path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def _rows(path: Path) -> bytes:
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return "\n".join(db.iterdump()).encode()
    except sqlite3.DatabaseError:  # not a database: its bytes are what must not change
        return path.read_bytes()


@contextmanager
def served(service: ScratchService, api: ApiSettings) -> Iterator[str]:
    """The API on a real loopback socket (uvicorn, port chosen by the system)."""
    config = uvicorn.Config(create_app(service, api), host="127.0.0.1", port=0, log_level="critical")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    eventually(lambda: server.started, timeout=30, what="uvicorn starts", interval=0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
