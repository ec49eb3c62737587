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
import ssl
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

import attrs
import certifi
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.stream.ws_client import V4_CHANNEL_PROTOCOL, V5_CHANNEL_PROTOCOL, websocket_proxycare
from websocket import ABNF, WebSocket, WebSocketBadStatusException, WebSocketException

from scratchbank.application.ports import SandboxFacts
from scratchbank.domain.errors import ConfigInvalid, ExecFailed, SandboxGone, StreamBroken

from .exec_output import ExecResult
from .exec_pump import STDERR, STDOUT, InputClosed, pump
from .scripted import Exec, ScriptedSandbox

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


def tried_once(api_client: k8s.ApiClient) -> k8s.ApiClient:
    """``api_client`` as a deadline needs it (P8): urllib3's pools retry a timed-out or refused
    request three times by default, so a call given ``_request_timeout=1`` could wait 4 s; here
    each call is tried once (a use case's retries are its own, within its budget). Changed in
    place, so an embedder's own client is bounded too."""
    api_client.configuration.retries = False
    manager = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
    if manager is not None and manager.connection_pool_kw.get("retries") is not False:
        manager.connection_pool_kw["retries"] = False
        manager.clear()  # pools made before this keep their own retries
    return api_client


def kubernetes_client() -> k8s.ApiClient:
    """An API client from KUBECONFIG (or ~/.kube/config), else the in-cluster service account,
    each call tried once (``tried_once``); ConfigInvalid when neither is there."""
    from kubernetes import config as kube_config

    configuration = k8s.Configuration()
    try:
        kube_config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except Exception:  # no kubeconfig here: maybe we run in a pod
        try:
            kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except Exception as error:
            raise ConfigInvalid(f"no Kubernetes configuration (KUBECONFIG or in-cluster): {error}") from None
    return tried_once(k8s.ApiClient(configuration))


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
        self.api_client = tried_once(api_client or k8s.ApiClient())
        self.pod, self.namespace, self.container = pod, namespace, container
        self.request_seconds = request_seconds
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

    def execute(self, exec_: Exec) -> ExecResult:
        ws = self._open(exec_.argv, exec_.stdin is not None)
        # create_websocket offers the protocols as a raw header, so websocket-client does
        # not record the one chosen: read it from the handshake's answer.
        answered = {k.lower(): v for k, v in (ws.getheaders() or {}).items()}
        self.protocol = str(answered.get("sec-websocket-protocol", "")).strip()
        v5 = self.protocol == V5_CHANNEL_PROTOCOL
        running = _PodExec(ws, wants_input=exec_.stdin is not None, v5=v5)
        return pump(running, exec_, name="k8s-exec")

    def _open(self, argv: list[str], stdin: bool) -> Any:
        """The exec websocket; gone vs failed by the handshake's status."""
        try:
            return _websocket(
                self.api_client.configuration, self._url(argv, stdin), self._headers(), self.request_seconds
            )
        except WebSocketBadStatusException as error:
            if error.status_code == 404:
                raise SandboxGone(f"pod {self.namespace}/{self.pod} is gone") from None
            if error.status_code in (401, 403):
                raise ExecFailed(f"exec forbidden ({error.status_code}): check the RBAC role") from None
            raise ExecFailed(f"exec handshake failed ({error.status_code})") from None
        except (OSError, WebSocketException) as error:
            raise ExecFailed(f"cannot open the exec stream: {error}") from error


def _websocket(configuration: Any, url: str, headers: dict[str, str], seconds: float) -> Any:
    """``kubernetes.stream.ws_client.create_websocket`` with a deadline on its connect and
    handshake (P8; found by attack: the library's has none, so an API server that accepts
    and never answers held an exec for ever). The library's own options otherwise; once
    open, the stream blocks as before (the exec pump's deadlines and ``_cut`` end it)."""
    header = []
    if "authorization" in headers:
        header.append(f"authorization: {headers['authorization']}")
    header.append(f"sec-websocket-protocol: {V5_CHANNEL_PROTOCOL},{V4_CHANNEL_PROTOCOL}")
    ssl_opts: dict[str, Any]
    if url.startswith("wss://") and configuration.verify_ssl:
        ssl_opts = {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": configuration.ssl_ca_cert or certifi.where()}
        if configuration.assert_hostname is not None:
            ssl_opts["check_hostname"] = configuration.assert_hostname
    else:
        ssl_opts = {"cert_reqs": ssl.CERT_NONE}
    if configuration.cert_file:
        ssl_opts["certfile"] = configuration.cert_file
    if configuration.key_file:
        ssl_opts["keyfile"] = configuration.key_file
    if configuration.tls_server_name:
        ssl_opts["server_hostname"] = configuration.tls_server_name
    ws = WebSocket(sslopt=ssl_opts, skip_utf8_validation=False)
    options: dict[str, Any] = {"header": header}
    if configuration.proxy or configuration.proxy_headers:
        options = websocket_proxycare(options, configuration, url, headers)  # type: ignore[no-untyped-call]
    ws.connect(url, timeout=seconds, **options)  # type: ignore[no-untyped-call]
    ws.settimeout(None)  # the open stream blocks as the library's did
    return ws


def _cut(ws: Any) -> None:
    """Shut the websocket's socket down: a receive blocked on it returns at once (closing
    the file from another thread would not wake it)."""
    sock = ws.sock
    if sock is not None:
        sock.shutdown(socket.SHUT_RDWR)


class _PodExec:
    """One exec over the websocket, as the exec pump drives it (exec_pump.py): stdin in
    frames of at most 1 MiB on channel 0 (closed with a v5 close frame), channels 1 and 2
    handed out as they come, channel 3's status kept for ``exit_code``. A connection that
    closes with no status is NOT success (kubectl itself exits 0 there)."""

    def __init__(self, ws: Any, *, wants_input: bool, v5: bool) -> None:
        self.ws, self.wants_input, self.v5 = ws, wants_input, v5
        self.status: ExecStatus | None = None
        self._cut = False
        self._stopped = threading.Event()

    def send(self, chunk: bytes) -> None:
        if self._stopped.is_set():
            raise InputClosed("the exec ended")
        try:
            for at in range(0, len(chunk), FRAME):
                self.ws.send_binary(b"\x00" + chunk[at : at + FRAME])
        except (OSError, WebSocketException, AttributeError) as error:
            raise InputClosed(str(error)) from error

    def close_input(self) -> None:
        if self.v5 and not self._stopped.is_set():
            try:
                self.ws.send_binary(b"\xff\x00")
            except (OSError, WebSocketException, AttributeError) as error:
                raise InputClosed(str(error)) from error

    def stop_input(self) -> None:
        self._stopped.set()

    def receive(self) -> tuple[int, bytes] | None:
        while True:
            try:
                opcode, data = self.ws.recv_data()
            except (OSError, WebSocketException, AttributeError) as error:
                if self._cut:
                    return None  # the pump names the cut
                raise StreamBroken(f"exec stream dropped: {error}") from error
            if opcode == ABNF.OPCODE_CLOSE:
                return None
            if opcode != ABNF.OPCODE_BINARY or not data:
                continue
            channel, payload = data[0], data[1:]
            if channel in (STDOUT, STDERR):
                return channel, payload
            if channel == 3:
                self.status = read_status(payload)

    def cut(self) -> None:
        self._cut = True
        _cut(self.ws)

    def exit_code(self) -> int:
        if self.status is None:
            raise StreamBroken("the exec stream closed without a status (not a success)")
        if self.status.exit_code is None:
            raise ExecFailed(f"exec failed: {self.status.reason}")
        return self.status.exit_code

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close(timeout=2)
        with contextlib.suppress(Exception):
            self.ws.shutdown()
