"""Docker and Podman sandboxes, through the ``docker`` SDK (Podman via its compatible API).

Exec streams both ways over the hijacked exec socket: a writer thread sends stdin in
1 MiB chunks while the reader hands stdout frames straight to the destination, so
host memory does not grow with the archive. Process isolation is read once, when the
adapter attaches: the container's PID mode, and for Podman the configured default
(``pidns = "host"`` in containers.conf rules isolation out, T11).

The output is read through the HTTP response's buffered reader, never the raw socket
beside it: the engine may send the first frames (a short command's whole output) with its
response's headers, and the reader parsing those headers holds them in its buffer; read
from the raw socket, they were lost (an exec exiting 0 with its output gone: Podman 9 of
300 short execs on a loaded machine, ``docker_frames``).
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.utils.socket import frames_iter

from scratchbank.application.ports import SandboxFacts
from scratchbank.domain.errors import ExecFailed, SandboxGone, StreamBroken

from .exec_output import ExecResult
from .exec_pump import STDERR, STDOUT, InputClosed, pump
from .scripted import Exec, ScriptedSandbox

#: The most one read of an exec's output asks for.
READ_BYTES = 1 << 20

#: the engine client's URL pools a sandbox keeps (each holds at most one idle connection here)
IDLE_POOLS = 4


def engine_client(base_url: str | None, *, timeout: int, pools: int = IDLE_POOLS) -> docker.DockerClient:
    """A Docker/Podman API client that keeps ``pools`` URL pools at most (H7): sequential
    calls leave about one idle connection in each.

    docker-py keeps a connection pool per URL, up to 25, and an exec's URLs are its own: a
    sandbox held ~11 idle sockets after 20 execs, and 200 sandboxes in one process pass a
    descriptor limit of 1,024. Its ``num_pools`` is ignored for every URL but ssh:// (an
    operator-precedence slip in ``APIClient.__init__``), so the adapter's pool container is
    replaced by one of ``pools`` entries; the least recently used pool is closed."""
    from urllib3._collections import RecentlyUsedContainer

    client = docker.DockerClient(base_url=base_url, timeout=timeout)
    adapter = getattr(client.api, "_custom_adapter", None)
    if adapter is not None and isinstance(getattr(adapter, "pools", None), RecentlyUsedContainer):
        adapter.pools = RecentlyUsedContainer(pools, dispose_func=lambda pool: pool.close())
    return client


def buffered_reader(sock: Any) -> io.BufferedReader | None:
    """The buffered reader the engine's response was parsed from (docker-py keeps the
    response on the socket it hands back), or None when the SDK kept none."""
    fp = getattr(getattr(getattr(getattr(sock, "_response", None), "raw", None), "_fp", None), "fp", None)
    return fp if isinstance(fp, io.BufferedReader) else None


def docker_frames(reader: io.BufferedReader) -> Iterator[tuple[int, bytes]]:
    """The engine's multiplexed stream (each frame: its stream's number, three zero bytes
    and its length, big-endian), as (stream, bytes) while they arrive, read through
    ``reader`` so that what it already holds comes first. Ends at the end of the stream
    (a frame cut short ends it too, as the SDK's own reader does)."""
    while True:
        header = b""
        while len(header) < 8:
            got = reader.read1(8 - len(header))
            if not got:
                return
            header += got
        stream, left = struct.unpack(">BxxxL", header)
        while left > 0:
            data = reader.read1(min(left, READ_BYTES))
            if not data:
                return
            left -= len(data)
            yield stream, data


def podman_default_pidns(env: dict[str, str] | None = None) -> str:
    """Podman's configured default PID namespace ("" when none is set)."""
    env = dict(os.environ) if env is None else env
    candidates = [
        env.get("CONTAINERS_CONF", ""),
        "/etc/containers/containers.conf",
        "/usr/share/containers/containers.conf",
    ]
    for path in filter(None, candidates):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() == "pidns":
                return value.strip().strip('"').strip("'")
    return ""


def isolation_of(attrs: dict[str, Any], *, podman: bool, podman_pidns: str = "") -> tuple[bool, str]:
    """Is the container's PID namespace its own? (T11) From its inspect attributes."""
    mode = (attrs.get("HostConfig") or {}).get("PidMode") or ""
    if mode == "host":
        return False, "the container shares the host's PID namespace (PID mode host)"
    if podman and mode in ("", "private") and podman_pidns == "host":
        return False, "Podman's default pidns = \"host\" shares the host's PID namespace"
    if mode.startswith("container:"):
        return True, f"PID namespace shared with {mode} (its processes are stopped too)"
    return True, "own PID namespace"


def host_backed(attrs: dict[str, Any], scratch: str) -> bool:
    """Is the scratch (or a folder above it) bound to a host directory?"""
    for mount in attrs.get("Mounts") or []:
        dest = str(mount.get("Destination", "")).rstrip("/")
        if mount.get("Type") == "bind" and (scratch == dest or scratch.startswith(dest + "/")):
            return True
    return False


class DockerSandbox(ScriptedSandbox):
    def __init__(
        self,
        container: str,
        *,
        scratch: str,
        base_url: str | None = None,
        podman: bool = False,
        admin_user: str | None = "0",
        client: docker.DockerClient | None = None,
    ) -> None:
        self.client = client or engine_client(base_url, timeout=60)
        self.podman = podman
        self.admin_user = admin_user
        try:
            found = self.client.containers.get(container)
        except docker.errors.NotFound:
            raise SandboxGone(f"no container {container}") from None
        except docker.errors.DockerException as error:
            raise ExecFailed(f"cannot inspect {container}: {error}") from error
        self.container_id = found.id
        attrs = found.attrs
        isolated, why = isolation_of(
            attrs, podman=podman, podman_pidns=podman_default_pidns() if podman else ""
        )
        self.default_user = (attrs.get("Config") or {}).get("User") or None
        self.facts = SandboxFacts(
            scratch=scratch,
            host_backed=host_backed(attrs, scratch),
            process_isolated=isolated,
            isolation=why,
            engine="podman" if podman else "docker",
        )

    def execute(self, exec_: Exec) -> ExecResult:
        exec_id, sock = self._start(exec_.argv, exec_.stdin is not None, exec_.user)
        raw = getattr(sock, "_sock", sock)
        raw.settimeout(None)
        running = _DockerExec(self, exec_id, sock, raw, wants_input=exec_.stdin is not None)
        return pump(running, exec_, name="docker-exec")

    def _start(self, cmd: list[str], stdin: bool, user: str | None) -> tuple[str, Any]:
        """Create and start the exec; translate the engine's answers (gone vs failed)."""
        api = self.client.api
        try:
            exec_id = api.exec_create(
                self.container_id,
                cmd,
                stdin=stdin,
                stdout=True,
                stderr=True,
                user=user or self.default_user or "",
            )["Id"]
            return exec_id, api.exec_start(exec_id, socket=True)
        except docker.errors.NotFound:
            raise SandboxGone(f"container {self.container_id[:12]} is gone") from None
        except docker.errors.APIError as error:
            # Docker answers 409 for a stopped container, Podman 500 ("container state
            # improper"): ask the engine whether the container still runs.
            if error.status_code == 409 or not self._running():
                raise SandboxGone(f"container {self.container_id[:12]} is not running") from None
            raise ExecFailed(f"exec in {self.container_id[:12]}: {error}") from error
        except docker.errors.DockerException as error:
            raise ExecFailed(f"exec in {self.container_id[:12]}: {error}") from error

    def _running(self) -> bool:
        """Does the container still run? (False when it is gone; True when the engine
        cannot tell, so that an engine outage stays an ExecFailed, retried.)"""
        try:
            state = self.client.api.inspect_container(self.container_id).get("State") or {}
        except docker.errors.NotFound:
            return False
        except docker.errors.DockerException:
            return True
        return bool(state.get("Running", True))

    def _exited_unread(self, exec_id: str, running: _DockerExec) -> bool:
        """Did the stream break because the command exited, refusing, before it read all
        of stdin? Podman then resets the connection while the host still sends: the exit
        status is the answer (a refusal), not a broken stream. Exit 0 with unread input
        stays a broken stream: its output cannot be trusted whole. "Sent all" is not "read
        all": the host may have put all of stdin into the socket before the command exited
        without reading it, so a reset then is the same refusal (found by CI under load)."""
        if not running.wants_input:
            return False
        try:
            state = self.client.api.exec_inspect(exec_id)
        except docker.errors.DockerException:
            return False
        return not state.get("Running", True) and state.get("ExitCode") not in (None, 0)

    def _exit_code(self, exec_id: str) -> int:
        try:
            code = self.client.api.exec_inspect(exec_id).get("ExitCode")
        except docker.errors.DockerException as error:
            raise ExecFailed(f"cannot read the exit code: {error}") from error
        if code is None:
            raise StreamBroken("the exec ended without an exit code")
        return int(code)


class _DockerExec:
    """One exec over the hijacked socket, as the exec pump drives it (exec_pump.py):
    stdin sent in 1 MiB chunks, stdout and stderr read frame by frame, cut by shutting
    the socket down (a blocked read or send returns at once)."""

    def __init__(
        self, sandbox: DockerSandbox, exec_id: str, sock: Any, raw: socket.socket, *, wants_input: bool
    ) -> None:
        self.sandbox, self.exec_id, self.sock, self.raw = sandbox, exec_id, sock, raw
        self.wants_input = wants_input
        self.sent_all = False  # every byte of stdin was sent
        reader = buffered_reader(sock)
        self._frames = docker_frames(reader) if reader is not None else frames_iter(sock, tty=False)

    def send(self, chunk: bytes) -> None:
        try:
            self.raw.sendall(chunk)
        except OSError as error:
            raise InputClosed(str(error)) from error

    def close_input(self) -> None:
        self.sent_all = True
        with contextlib.suppress(OSError):
            self.raw.shutdown(socket.SHUT_WR)

    def stop_input(self) -> None:
        """The output ended before stdin was all read (a restore refused early): the
        engine keeps the socket open without reading it, so a send would block: shut it."""
        if not self.sent_all:
            self.cut()

    def receive(self) -> tuple[int, bytes] | None:
        try:
            got = next(self._frames, None)
        except OSError as error:
            # Podman resets the connection when the command exited, refusing, before it
            # read all of stdin: the exit status is the answer, not a broken stream.
            if self.sandbox._exited_unread(self.exec_id, self):
                return None
            raise StreamBroken(f"exec stream broke: {error}") from error
        if got is None:
            return None
        stream, data = got
        return (STDOUT if stream == 1 else STDERR), data

    def cut(self) -> None:
        self.raw.shutdown(socket.SHUT_RDWR)

    def exit_code(self) -> int:
        return self.sandbox._exit_code(self.exec_id)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError):
            self.raw.close()
