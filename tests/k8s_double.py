"""A test double of the Kubernetes API server's pod endpoints, speaking the real exec
websocket channel protocol (v5.channel.k8s.io, or v4 only), with fault injection.

Its "pods" run commands for real: each pod is a LocalSandbox (a PID namespace of its
own, held open by a sleeping init); exec enters it with nsenter. It runs in a thread
on a loopback port, and logs every request.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
from aiohttp import WSMsgType, web

from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.scripted import TOKEN_VAR

V5, V4 = "v5.channel.k8s.io", "v4.channel.k8s.io"
FRAME_LIMIT = 32 << 20


@attrs.define
class Faults:
    v4_only: bool = False
    drop_after_bytes: int | None = None  # close the stream after this much stdout
    close_without_status: bool = False
    internal_error: bool = False
    token: str | None = None  # when set, exec and GET need "Authorization: Bearer <token>"
    slow_reader: float = 0.0  # seconds to wait before each stdin frame is taken


@attrs.define
class Pod:
    """A pod whose one container is a LocalSandbox namespace, or a Docker container."""

    name: str
    sandbox: LocalSandbox | None
    share_process_namespace: bool = False
    phase: str = "Running"
    container_id: str | None = None

    def argv(self, command: list[str]) -> list[str]:
        if self.container_id is not None:
            return ["docker", "exec", "-i", self.container_id, *command]
        assert self.sandbox is not None
        token = None
        if command[:1] == ["env"] and len(command) > 1 and command[1].startswith(f"{TOKEN_VAR}="):
            token, command = command[1].split("=", 1)[1], command[2:]  # scripted.command's prefix
        if command[:2] == ["sh", "-c"]:
            return self.sandbox._argv(command[2], command[4:], token)
        return self.sandbox._argv(" ".join(command), [])


class ApiDouble:
    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], Pod] = {}
        self.faults = Faults()
        self.log: list[str] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- discovery and pods ---------------------------------------------------------------
    async def version(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"major": "1", "minor": "32", "gitVersion": "v1.32.0", "platform": "linux/amd64"}
        )

    async def api(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        )

    async def apis(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})

    async def api_v1(self, request: web.Request) -> web.Response:
        resources = [
            {
                "name": "pods",
                "singularName": "pod",
                "namespaced": True,
                "kind": "Pod",
                "verbs": ["get", "list", "create", "delete"],
                "shortNames": ["po"],
            },
            {
                "name": "pods/exec",
                "singularName": "",
                "namespaced": True,
                "kind": "PodExecOptions",
                "verbs": ["create", "get"],
            },
        ]
        return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources})

    def _pod_json(self, ns: str, pod: Pod) -> dict[str, Any]:
        return {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {"name": pod.name, "namespace": ns, "uid": f"uid-{pod.name}"},
            "spec": {
                "containers": [{"name": "main", "image": "busybox"}],
                "shareProcessNamespace": pod.share_process_namespace,
            },
            "status": {
                "phase": pod.phase,
                "containerStatuses": [
                    {
                        "name": "main",
                        "ready": True,
                        "image": "busybox",
                        "imageID": "busybox@sha256:0",
                        "restartCount": 0,
                        "state": {"running": {}},
                    }
                ],
            },
        }

    def _not_found(self, ns: str, name: str) -> web.Response:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "NotFound",
            "message": f'pods "{name}" not found',
            "code": 404,
            "details": {"name": name, "kind": "pods"},
        }
        return web.json_response(body, status=404)

    def _forbidden(self, request: web.Request) -> web.Response | None:
        token = self.faults.token
        if token is None or request.headers.get("Authorization") == f"Bearer {token}":
            return None
        return web.json_response(
            {
                "kind": "Status",
                "status": "Failure",
                "code": 401,
                "reason": "Unauthorized",
                "message": "Unauthorized",
            },
            status=401,
        )

    async def get_pod(self, request: web.Request) -> web.Response:
        denied = self._forbidden(request)
        if denied is not None:
            return denied
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self.pods.get((ns, name))
        return self._not_found(ns, name) if pod is None else web.json_response(self._pod_json(ns, pod))

    # -- exec -------------------------------------------------------------------------------
    async def exec(self, request: web.Request) -> web.StreamResponse:
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self.pods.get((ns, name))
        denied = self._forbidden(request)
        if denied is not None:
            return denied
        if self.faults.internal_error:
            return web.json_response(
                {"kind": "Status", "status": "Failure", "code": 500, "message": "internal error"}, status=500
            )
        if pod is None:
            return self._not_found(ns, name)
        if pod.phase != "Running":
            return web.json_response(
                {"kind": "Status", "status": "Failure", "code": 400, "message": "container not running"},
                status=400,
            )
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        protocols = (V4,) if self.faults.v4_only else (V5, V4)
        ws = web.WebSocketResponse(protocols=protocols, max_msg_size=FRAME_LIMIT)
        if not any(p in offered for p in protocols):
            return web.Response(status=400, text="no supported channel protocol")
        await ws.prepare(request)
        argv = pod.argv(request.query.getall("command"))
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        sent = 0
        dropped = False

        async def pump(stream: asyncio.StreamReader, channel: int) -> None:
            nonlocal sent, dropped
            while chunk := await stream.read(1 << 16):
                if channel == 1 and self.faults.drop_after_bytes is not None:
                    room = self.faults.drop_after_bytes - sent
                    if room <= 0:
                        dropped = True
                        return
                    chunk = chunk[:room]
                if not ws.closed:
                    await ws.send_bytes(bytes([channel]) + chunk)
                if channel == 1:
                    sent += len(chunk)

        async def feed() -> None:
            assert proc.stdin is not None
            async for msg in ws:
                if msg.type != WSMsgType.BINARY or not msg.data:
                    continue
                if self.faults.slow_reader:
                    await asyncio.sleep(self.faults.slow_reader)
                channel, data = msg.data[0], msg.data[1:]
                if channel == 0:
                    try:
                        proc.stdin.write(data)
                        await proc.stdin.drain()
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                elif channel == 255 and ws.ws_protocol == V5:
                    proc.stdin.close()

        feeder = asyncio.ensure_future(feed())
        assert proc.stdout is not None and proc.stderr is not None
        await asyncio.gather(pump(proc.stdout, 1), pump(proc.stderr, 2))
        if dropped:
            proc.kill()
        code = await proc.wait()
        feeder.cancel()
        if not (dropped or self.faults.close_without_status):
            await ws.send_bytes(b"\x03" + json.dumps(_status(code)).encode())
        await ws.close()
        return ws

    @web.middleware
    async def logger(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.log.append(f"{request.method} {request.path}")
        response: web.StreamResponse = await handler(request)
        return response

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.logger])
        app.router.add_get("/version", self.version)
        app.router.add_get("/api", self.api)
        app.router.add_get("/apis", self.apis)
        app.router.add_get("/api/v1", self.api_v1)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self.get_pod)
        app.router.add_route("*", "/api/v1/namespaces/{ns}/pods/{name}/exec", self.exec)
        return app

    # -- running it -------------------------------------------------------------------------
    def add_pod(
        self, ns: str, name: str, *, share_process_namespace: bool = False, container_id: str | None = None
    ) -> Pod:
        sandbox = None if container_id else LocalSandbox()
        pod = Pod(name, sandbox, share_process_namespace, container_id=container_id)
        self.pods[(ns, name)] = pod
        return pod

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _status(code: int) -> dict[str, Any]:
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    if code < 0:  # the runtime reports a signal death as 128 + the signal
        code = 128 - code
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: error executing command [...], exit code {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


@contextmanager
def running_double() -> Iterator[ApiDouble]:
    double = ApiDouble()
    started = threading.Event()
    loop = asyncio.new_event_loop()
    # The API server (Go net/http) takes request lines up to its 1 MiB header limit; the
    # scripts travel in the exec URL's command parameters.
    runner = web.AppRunner(double.app(), max_line_size=1 << 20, max_field_size=1 << 20)

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        server = site._server
        assert server is not None and server.sockets
        double.port = server.sockets[0].getsockname()[1]
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield double
    finally:
        # Pods first: an exec a client cut at its deadline still runs there, and the
        # server's cleanup waits for its handler to end.
        for pod in double.pods.values():
            if pod.sandbox is not None:
                pod.sandbox.destroy()
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
