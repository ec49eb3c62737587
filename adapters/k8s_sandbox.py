"""Kubernetes pods as sandboxes: exec over the official client's websocket, with our own
frame loop.

The client's ``stream()`` helper keeps all output in memory and (37.x) reads large
output slowly; so this adapter opens the socket with
``kubernetes.stream.ws_client.create_websocket`` (auth, TLS and proxies come from the
normal client configuration) and runs its own loop: a writer thread sends stdin in
frames of at most 1 MiB on channel 0, the reader hands channels 1 and 2 straight to
their sinks, and channel 3's JSON Status gives the exit code. A connection that
closes with no status is NOT success (kubectl itself exits 0 there). The scripts frame
stdin by byte count, so an upload never depends on closing stdin (which v4 cannot do).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Sequence
from typing import Any, BinaryIO
from urllib.parse import urlencode

import attrs
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.stream.ws_client import V5_CHANNEL_PROTOCOL, create_websocket
from websocket import ABNF, WebSocketBadStatusException, WebSocketException

from scratchbank.application.cancellation import Deadline, deadline_of
from scratchbank.application.ports import ByteSink, SandboxFacts
from scratchbank.domain.errors import ExecFailed, SandboxGone, StreamBroken

from .scripted import EXEC_SECONDS, ExecResult, Output, ScriptedSandbox, command
from .watchdog import Feeder, Watchdog

FRAME = 1 << 20


@attrs.frozen
class ExecStatus:
    """What channel 3 said, or that it said nothing."""

    exit_code: int | None
    reason: str


def read_status(payload: bytes) -> ExecStatus:
    """Parse channel 3: Success, or Failure with NonZeroExitCode and the code in the causes."""
    try:
        status = json.loads(payload.decode("utf-8", "replace"))
    except ValueError:
        return ExecStatus(None, f"unparseable status {payload[:200]!r}")
    if status.get("status") == "Success":
        return ExecStatus(0, "Success")
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                try:
                    return ExecStatus(int(cause.get("message")), "NonZeroExitCode")
                except (TypeError, ValueError):
                    break
    return ExecStatus(None, str(status.get("message") or status.get("reason") or status))


def pod_facts(pod: Any, scratch: str, container: str | None) -> SandboxFacts:
    """A pod's containers are process-isolated; with shareProcessNamespace, PID 1 is the
    pause process and the quiesce stops the sidecars too. hostPath volumes over the
    scratch make it host-backed."""
    spec = pod.spec
    shared = bool(getattr(spec, "share_process_namespace", False))
    why = (
        "pod with shareProcessNamespace: PID 1 is pause; every container's processes are stopped"
        if shared
        else "pod: the container's own PID namespace"
    )
    host_paths = {v.name for v in (spec.volumes or []) if getattr(v, "host_path", None)}
    backed = False
    for c in spec.containers or []:
        if container and c.name != container:
            continue
        for m in c.volume_mounts or []:
            dest = m.mount_path.rstrip("/")
            if m.name in host_paths and (scratch == dest or scratch.startswith(dest + "/")):
                backed = True
    return SandboxFacts(scratch, backed, True, why, "kubernetes")


class KubernetesSandbox(ScriptedSandbox):
    def __init__(
        self,
        pod: str,
        *,
        namespace: str = "default",
        container: str | None = None,
        scratch: str = "/tmp/iterion-scratch",
        api_client: k8s.ApiClient | None = None,
        request_seconds: float = 30.0,
    ) -> None:
        self.api_client = api_client or k8s.ApiClient()
        self.pod, self.namespace, self.container = pod, namespace, container
        self.admin_user = None
        try:
            found = k8s.CoreV1Api(self.api_client).read_namespaced_pod(
                pod, namespace, _request_timeout=request_seconds
            )
        except ApiException as error:
            if error.status == 404:
                raise SandboxGone(f"no pod {namespace}/{pod}") from None
            raise ExecFailed(f"cannot read pod {namespace}/{pod}: {error.status} {error.reason}") from error
        except Exception as error:  # urllib3 connection errors, malformed answers
            raise ExecFailed(f"cannot read pod {namespace}/{pod}: {error}") from error
        self.facts = pod_facts(found, scratch, container)
        self.protocol = ""

    def _url(self, argv: Sequence[str], stdin: bool) -> str:
        config = self.api_client.configuration
        host = config.host.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        query: list[tuple[str, str]] = [("command", a) for a in argv]
        query += [("stdin", "true" if stdin else "false"), ("stdout", "true"), ("stderr", "true")]
        if self.container:
            query.append(("container", self.container))
        return f"{host}/api/v1/namespaces/{self.namespace}/pods/{self.pod}/exec?{urlencode(query)}"

    def _headers(self) -> dict[str, str]:
        """The bearer token (or any header auth) from the client's own configuration."""
        headers: dict[str, str] = {}
        for setting in self.api_client.configuration.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[str(setting["key"]).lower()] = str(setting["value"])
        return headers

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
        ws = self._open(command(source, args, token), stdin is not None)
        # create_websocket offers the protocols as a raw header, so websocket-client does
        # not record the one chosen: read it from the handshake's answer.
        answered = {k.lower(): v for k, v in (ws.getheaders() or {}).items()}
        self.protocol = str(answered.get("sec-websocket-protocol", "")).strip()
        output = Output(stdout)
        with Watchdog(deadline, lambda: _cut(ws)) as dog:
            v5 = self.protocol == V5_CHANNEL_PROTOCOL
            writer = _Writer(ws, stdin, v5, dog) if stdin is not None else None
            try:
                if writer is not None:
                    writer.start()
                status = _receive(ws, output, dog)
            finally:
                if writer is not None:  # the exec has ended: nobody reads what it has not sent
                    writer.stop(0.2)
                with contextlib.suppress(Exception):
                    ws.close(timeout=2)
                ws.shutdown()
        _raise_cut(dog, writer, streaming=stdin is not None or stdout is not None)
        if status is None:
            raise StreamBroken("the exec stream closed without a status (not a success)")
        if status.exit_code is None:
            raise ExecFailed(f"exec failed: {status.reason}")
        return output.result(status.exit_code)

    def _open(self, argv: list[str], stdin: bool) -> Any:
        """The exec websocket; gone vs failed by the handshake's status."""
        try:
            return create_websocket(  # type: ignore[no-untyped-call]
                self.api_client.configuration, self._url(argv, stdin), headers=self._headers()
            )
        except WebSocketBadStatusException as error:
            if error.status_code == 404:
                raise SandboxGone(f"pod {self.namespace}/{self.pod} is gone") from None
            if error.status_code in (401, 403):
                raise ExecFailed(f"exec forbidden ({error.status_code}): check the RBAC role") from None
            raise ExecFailed(f"exec handshake failed ({error.status_code})") from None
        except (OSError, WebSocketException) as error:
            raise ExecFailed(f"cannot open the exec stream: {error}") from error


def _cut(ws: Any) -> None:
    """Shut the websocket's socket down: a receive blocked on it returns at once (closing
    the file from another thread would not wake it)."""
    sock = ws.sock
    if sock is not None:
        sock.shutdown(socket.SHUT_RDWR)


def _receive(ws: Any, output: Output, dog: Watchdog) -> ExecStatus | None:
    """Hand channels 1 and 2 to their sinks until the close; channel 3's status, if any."""
    status: ExecStatus | None = None
    while True:
        try:
            opcode, data = ws.recv_data()
        except (OSError, WebSocketException, AttributeError) as error:
            if dog.fired:
                return status  # the deadline cut the socket: raised by name below
            raise StreamBroken(f"exec stream dropped: {error}") from error
        if opcode == ABNF.OPCODE_CLOSE:
            return status
        if opcode != ABNF.OPCODE_BINARY or not data:
            continue
        channel, payload = data[0], data[1:]
        if channel == 1:
            output.stdout(payload)
        elif channel == 2:
            output.stderr(payload)
        elif channel == 3:
            status = read_status(payload)


def _raise_cut(dog: Watchdog, writer: _Writer | None, *, streaming: bool) -> None:
    """The deadline cut the exec, or the stdin writer failed: say so by name (the writer's
    error was once stored and never read: a restore whose source failed hung)."""
    if dog.fired:
        why = "the exec did not end within its deadline: cut"
        raise StreamBroken(why) if streaming else ExecFailed(why)
    if writer is not None and writer.error is not None:
        raise StreamBroken(f"stdin stream broke: {writer.error!r}")


class _Writer(Feeder):
    """Sends stdin on channel 0 in frames of at most 1 MiB, then closes it (v5 only).

    A source that fails cuts the websocket, so the receive loop ends at once instead of
    waiting for a status the script will never send (it still waits for its bytes)."""

    def __init__(self, ws: Any, src: BinaryIO, can_close: bool, dog: Watchdog) -> None:
        super().__init__(src, dog)
        self.ws, self.can_close = ws, can_close
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while not self._halt.is_set() and (chunk := self._read()):
                self.ws.send_binary(b"\x00" + chunk)
            if self.can_close and not self._halt.is_set():
                self.ws.send_binary(b"\xff\x00")
        except BaseException:  # a send error is the reader's to see
            return

    def stop(self, wait: float) -> None:
        self._halt.set()
        self.join(timeout=wait)
