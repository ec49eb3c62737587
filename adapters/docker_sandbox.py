"""Docker and Podman sandboxes, through the ``docker`` SDK (Podman via its compatible API).

Exec streams both ways over the hijacked exec socket: a writer thread sends stdin in
1 MiB chunks while the reader hands stdout frames straight to the destination, so
host memory does not grow with the archive. Process isolation is read once, when the
adapter attaches: the container's PID mode, and for Podman the configured default
(``pidns = "host"`` in containers.conf rules isolation out, T11).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import docker
import docker.errors
from docker.utils.socket import frames_iter

from scratchbank.application.cancellation import Deadline, deadline_of
from scratchbank.application.ports import ByteSink, SandboxFacts
from scratchbank.domain.errors import ExecFailed, OutputOverBound, SandboxGone, StreamBroken

from .scripted import EXEC_SECONDS, ExecResult, Output, ScriptedSandbox, command
from .watchdog import Feeder, Watchdog

CHUNK = 1 << 20


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
        self.client = client or docker.DockerClient(base_url=base_url, timeout=60)
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

    def run(
        self,
        source: str,
        args: Sequence[str],
        *,
        stdin: BinaryIO | None = None,
        stdout: ByteSink | None = None,
        user: str | None = None,
        deadline: Deadline | None = None,
        token: str | None = None,
    ) -> ExecResult:
        deadline = deadline_of(deadline, EXEC_SECONDS)
        exec_id, sock = self._start(command(source, args, token), stdin is not None, user)
        raw = getattr(sock, "_sock", sock)
        raw.settimeout(None)
        output = Output(stdout)
        with Watchdog(deadline, lambda: raw.shutdown(socket.SHUT_RDWR)) as dog:
            writer = _Writer(raw, stdin, dog) if stdin is not None else None
            try:
                if writer is not None:
                    writer.start()
                try:
                    _read_frames(sock, output)
                except StreamBroken as error:
                    if isinstance(error, OutputOverBound) or not self._exited_unread(exec_id, writer):
                        raise
                if writer is not None:
                    writer.exec_ended()
            finally:
                if writer is not None:  # one blocked on a stalled source is not waited for
                    done = dog.fired or writer.abandoned
                    writer.join(timeout=0.2 if done else max(1.0, deadline.left()))
                sock.close()
                raw.close()
        _raise_cut(dog, writer, streaming=stdin is not None or stdout is not None)
        return output.result(self._exit_code(exec_id))

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

    def _exited_unread(self, exec_id: str, writer: _Writer | None) -> bool:
        """Did the stream break because the command exited, refusing, before it read all
        of stdin? Podman then resets the connection while the host still sends: the exit
        status is the answer (a refusal), not a broken stream. Exit 0 with unread input
        stays a broken stream: its output cannot be trusted whole."""
        if writer is None or writer.sent_all or writer.error is not None:
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


def _read_frames(sock: Any, output: Output) -> None:
    try:
        for stream, data in frames_iter(sock, tty=False):
            if stream == 1:
                output.stdout(data)
            else:
                output.stderr(data)
    except OSError as error:
        raise StreamBroken(f"exec stream broke: {error}") from error


def _raise_cut(dog: Watchdog, writer: _Writer | None, *, streaming: bool) -> None:
    """The deadline cut the exec, or the stdin writer failed: say so by name."""
    if dog.fired:
        why = f"the exec did not end within its deadline ({dog.deadline.left():.0f} s left): cut"
        raise StreamBroken(why) if streaming else ExecFailed(why)
    if writer is not None and writer.error is not None:
        raise StreamBroken(f"stdin stream broke: {writer.error!r}")


class _Writer(Feeder):
    """Sends stdin in 1 MiB chunks. A source that fails cuts the exec (the reader must not
    wait for bytes that will never come); a peer that stopped reading early is not an error
    of ours (the script decides by its exit status)."""

    def __init__(self, raw: socket.socket, src: BinaryIO, dog: Watchdog) -> None:
        super().__init__(src, dog)
        self.raw = raw
        self._ended = threading.Event()
        self.sent_all = False  # the source ran dry and every byte was sent

    @property
    def abandoned(self) -> bool:
        return self._ended.is_set()

    def exec_ended(self) -> None:
        """The command exited (its output ended) before reading all of stdin, e.g. a
        restore refused early: nobody will read the rest. The engine keeps the hijacked
        socket open without reading it, so a send would block until the deadline: shut it."""
        if self.is_alive():
            self._ended.set()
            with contextlib.suppress(OSError):
                self.raw.shutdown(socket.SHUT_RDWR)

    def run(self) -> None:
        try:
            while chunk := self._read():
                self.raw.sendall(chunk)
            self.sent_all = True
            with contextlib.suppress(OSError):
                self.raw.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            return
        except BaseException as error:  # raised by the caller as StreamBroken
            if not self._ended.is_set():  # after the exec ended, unsent stdin is nobody's
                self.error = error
