"""Helpers and fixtures of the tests first written in tests/test_hostile_sandbox.py (Issue 25: a
compromised sandbox can neither harm the host nor make a record lie.), shared by the rule tests
filed by family in tests/rules/ and by the tests that stayed."""

from __future__ import annotations

import array
import fcntl
import subprocess
import termios
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hostile import member, ustar
from waiting import eventually

from rigs.real_sandboxes import Rig, rig
from scratchbank.adapters.scripted import QUIESCE

#: the engines a restore or a transport bound applies to (the K8s double on its own namespace)
TRANSPORTS = ["local", "docker-busybox", "docker-gnu", "podman-busybox", "podman-gnu", "k8s-double"]


@pytest.fixture(params=TRANSPORTS)
def box(request: pytest.FixtureRequest) -> Iterator[Rig]:
    with rig(request.param) as r:
        yield r


def files(*names: str) -> bytes:
    return b"".join(ustar(member(n, size=3), b"abc") for n in names)


def _pid1_idle(counters: str) -> tuple[int, list[str], str]:
    """quiesce.sh's pid1_idle under a shell whose clock, pause and /proc reads are stubbed: the
    clock moves 0.05 s per read, PID 1's counters read ``counters`` (a ``$n`` is the read's
    number), its tasks sleep. (exit code, the waits asked for in hundredths, the report)."""
    stubs = f"""
t=1000 n=0
uptime_cs() {{ t=$((t + 5)); up_cs=$t; }}
pid1_writes() {{ n=$((n + 1)); p1_io="{counters}"; }}
read_status() {{ st_state=S st_name=init; }}
exec 3>&2
pause() {{ echo "pause $1" >&3; }}
pid1_writes; p1_before=$p1_io; p1_since=$t
round=0 reasons="" q_out=""
pid1_idle; rc=$?
printf '%s' "$q_out"
exit $rc
"""
    done = subprocess.run(
        ["sh", "-c", "SCRATCHBANK_LIBRARY=1\n" + QUIESCE + stubs],
        capture_output=True,
        text=True,
        timeout=60,
    )
    waits = [line.split()[1] for line in done.stderr.splitlines() if line.startswith("pause ")]
    return done.returncode, waits, done.stdout


def _wait_for(r: Rig, path: str) -> None:
    eventually(
        lambda: r.sh(f"test -s {path} && echo yes", check=False).strip() == "yes", what="the writer writes"
    )


@contextmanager
def started_execs() -> Iterator[list[tuple[Any, Any]]]:
    """Every exec a transport starts meanwhile, as (its ``Exec``, the pump's ``Started``)."""
    from scratchbank.adapters import docker_sandbox, exec_pump, k8s_sandbox, local_sandbox

    seen: list[tuple[Any, Any]] = []
    real = exec_pump.pump

    def spy(started: Any, what: Any, **how: Any) -> Any:
        seen.append((what, started))
        return real(started, what, **how)

    with pytest.MonkeyPatch.context() as patch:
        for module in (docker_sandbox, k8s_sandbox, local_sandbox):
            patch.setattr(module, "pump", spy)
        yield seen


#: what a transport adds around one chunk of output: Docker's frame header, a websocket's
#: header and channel byte (a server's frames are unmasked), nothing on a pipe
FRAMING = {"_LocalExec": 0, "_DockerExec": 8, "_PodExec": 3}


def unread(started: Any) -> int:
    """The bytes the host's end of a started exec holds, not yet read (FIONREAD on its
    pipes or its socket): what the exec wrote that has reached the host."""
    kind = type(started).__name__
    if kind == "_LocalExec":
        fds = list(started._open)
    elif kind == "_DockerExec":
        fds = [started.raw.fileno()]
    else:
        fds = [started.ws.sock.fileno()]
    total = 0
    for fd in fds:
        got = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, got)
        total += got[0]
    return total
