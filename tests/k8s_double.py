"""A test double of the Kubernetes API server's pod endpoints, speaking the real exec
websocket channel protocol (v5.channel.k8s.io, or v4 only), with fault injection.

Its "pods" run commands for real: each pod is a LocalSandbox (a PID namespace of its
own, held open by a sleeping init); exec enters it with nsenter. It runs in a thread
on a loopback port, and logs every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
from aiohttp import WSMsgType, web

from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.scripted import TOKEN_VAR, Exec

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
    # -- the pod lifecycle (issue 23) --
    pod_start: str = "run"  # run | image_pull | unschedulable | evicted | pending
    rbac: frozenset[tuple[str, str]] | None = None  # (resource, verb) allowed; None: all
    stall_api: float = 0.0  # seconds every pod read, list, watch and exec handshake waits before answering
    hold_exec: str | None = None  # the first exec whose command holds this text waits for `release`
    held: threading.Event = attrs.Factory(threading.Event)
    release: threading.Event = attrs.Factory(threading.Event)


@attrs.define
class Pod:
    """A pod whose one container is a LocalSandbox namespace, or a Docker container."""

    name: str
    sandbox: LocalSandbox | None
    share_process_namespace: bool = False
    phase: str = "Running"
    container_id: str | None = None
    manifest: dict[str, Any] | None = None  # created through the API: the client's pod
    owned: bool = False  # the double started its container (and removes it)
    reason: str = ""
    message: str = ""
    waiting: str = ""  # the container's waiting reason (ErrImagePull...)
    unschedulable: bool = False

    def argv(self, command: list[str]) -> list[str]:
        if self.container_id is not None:
            return ["docker", "exec", "-i", self.container_id, *command]
        assert self.sandbox is not None
        script = command
        if script[:1] == ["env"] and len(script) > 1 and script[1].startswith(f"{TOKEN_VAR}="):
            script = script[2:]  # scripted.command's prefix
        if script[:2] == ["sh", "-c"]:
            return self.sandbox._argv(command)
        return self.sandbox._argv(Exec(" ".join(command)).argv)


class ApiDouble:
    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], Pod] = {}
        self.faults = Faults()
        self.log: list[str] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.watchers: list[tuple[str, dict[str, str], asyncio.Queue[tuple[str, dict[str, Any]]]]] = []
        self.rv = 1
        self.kubelets: set[asyncio.Future[None]] = set()
        self.closing = asyncio.Event()  # set when the double stops: a stalled answer ends then
        self.created: list[dict[str, Any]] = []  # every pod created through the API, as sent
        self.containers: list[str] = []  # every container a kubelet started, by id

    async def _stall(self) -> None:
        """The stall fault: answer nothing for ``stall_api`` seconds, or until the double
        stops (its cleanup waits for every handler)."""
        if self.faults.stall_api > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.closing.wait(), self.faults.stall_api)

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
                "verbs": ["get", "list", "watch", "create", "delete"],
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
        if pod.manifest is not None:
            return self._created_json(ns, pod)
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
        refused = self._rbac("pods", "get", ns)
        if refused is not None:
            return refused
        await self._stall()
        pod = self.pods.get((ns, name))
        return self._not_found(ns, name) if pod is None else web.json_response(self._pod_json(ns, pod))

    # -- exec -------------------------------------------------------------------------------
    async def exec(self, request: web.Request) -> web.StreamResponse:
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self.pods.get((ns, name))
        denied = self._forbidden(request) or self._rbac("pods/exec", "create", ns)
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
        await self._stall()  # the handshake answers nothing either
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        protocols = (V4,) if self.faults.v4_only else (V5, V4)
        ws = web.WebSocketResponse(protocols=protocols, max_msg_size=FRAME_LIMIT)
        if not any(p in offered for p in protocols):
            return web.Response(status=400, text="no supported channel protocol")
        await ws.prepare(request)
        if await self._hold(request.query.getall("command")):
            await ws.close()  # released: its runner was killed meanwhile; nothing runs
            return ws
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
                if not ws.closed:  # a client that cut the stream: its output is drained, dropped
                    with contextlib.suppress(ConnectionResetError):
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
        try:
            await asyncio.gather(pump(proc.stdout, 1), pump(proc.stderr, 2))
            if dropped:
                proc.kill()
            code = await proc.wait()
            feeder.cancel()
            with contextlib.suppress(ConnectionResetError):
                if not (dropped or self.faults.close_without_status):
                    await ws.send_bytes(b"\x03" + json.dumps(_status(code)).encode())
                await ws.close()
            return ws
        finally:
            feeder.cancel()
            _end(proc)

    # -- the pod lifecycle: create, list, watch, delete (issue 23) -------------------------
    def _rbac(self, resource: str, verb: str, ns: str) -> web.Response | None:
        """403 as the API server says it, for a (resource, verb) the role does not grant."""
        allowed = self.faults.rbac
        if allowed is None or (resource, verb) in allowed:
            return None
        kind, _, sub = resource.partition("/")
        what = f'{kind} "{sub}"' if sub else f'"{kind}"'
        message = (
            f'{kind}{"/" + sub if sub else ""} is forbidden: User "system:serviceaccount:{ns}:runner" '
            f'cannot {verb} resource {what} in API group "" in the namespace "{ns}"'
        )
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
        return web.json_response({**body, "reason": "Forbidden", "code": 403}, status=403)

    def _created_json(self, ns: str, pod: Pod) -> dict[str, Any]:
        """A pod created through the API: its manifest, with the status the kubelet gave it."""
        assert pod.manifest is not None
        out = json.loads(json.dumps(pod.manifest))
        out.update(kind="Pod", apiVersion="v1")
        meta = out.setdefault("metadata", {})
        meta.update(name=pod.name, namespace=ns, uid=f"uid-{pod.name}", resourceVersion=str(self.rv))
        containers = out.get("spec", {}).get("containers") or [{"name": "main", "image": "?"}]
        first = containers[0]
        status: dict[str, Any] = {"phase": pod.phase}
        if pod.reason:
            status.update(reason=pod.reason, message=pod.message)
        if pod.unschedulable:
            status["conditions"] = [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": pod.message}
            ]
        if pod.phase == "Running":
            state: dict[str, Any] = {"running": {"startedAt": "2026-12-01T00:00:00Z"}}
        elif pod.waiting:
            state = {"waiting": {"reason": pod.waiting, "message": pod.message}}
        else:
            state = {"waiting": {"reason": "ContainerCreating"}}
        if not pod.unschedulable:
            status["containerStatuses"] = [
                {
                    "name": first.get("name", "main"),
                    "ready": pod.phase == "Running",
                    "image": first.get("image", "?"),
                    "imageID": "",
                    "restartCount": 0,
                    "state": state,
                }
            ]
        out["status"] = status
        return out

    def _changed(self, kind: str, ns: str, pod: Pod) -> None:
        """Tell every watcher whose namespace and selectors match (on the double's loop)."""
        self.rv += 1
        body = self._pod_json(ns, pod)
        for wns, selector, queue in list(self.watchers):
            if wns == ns and _selected(body, selector):
                queue.put_nowait((kind, body))

    async def create_pod(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        refused = self._forbidden(request) or self._rbac("pods", "create", ns)
        if refused is not None:
            return refused
        manifest = await request.json()
        name = (manifest.get("metadata") or {}).get("name")
        if not name:
            return web.json_response({"kind": "Status", "code": 422, "message": "name required"}, status=422)
        if (ns, name) in self.pods:
            body = {"kind": "Status", "status": "Failure", "reason": "AlreadyExists", "code": 409}
            return web.json_response({**body, "message": f'pods "{name}" already exists'}, status=409)
        pod = Pod(name, None, phase="Pending", manifest=manifest, owned=True)
        self.created.append(manifest)
        pod.share_process_namespace = bool(manifest.get("spec", {}).get("shareProcessNamespace"))
        self.pods[(ns, name)] = pod
        self._changed("ADDED", ns, pod)
        task = asyncio.ensure_future(self._kubelet(ns, pod))
        self.kubelets.add(task)
        task.add_done_callback(self.kubelets.discard)
        return web.json_response(self._pod_json(ns, pod), status=201)

    async def _kubelet(self, ns: str, pod: Pod) -> None:
        """What a node makes of the pod: its container started in Docker, or a failure."""
        how = self.faults.pod_start
        if how == "pending":
            return
        if how == "unschedulable":
            pod.unschedulable, pod.message = True, "0/3 nodes are available: 3 Insufficient memory."
        elif how == "evicted":
            pod.phase, pod.reason = "Failed", "Evicted"
            pod.message = "The node was low on resource: memory."
        elif how == "image_pull":
            pod.waiting, pod.message = "ErrImagePull", "pull access denied for the image"
        else:
            await self._run_container(ns, pod)
        if self.pods.get((ns, pod.name)) is pod:
            self._changed("MODIFIED", ns, pod)

    async def _run_container(self, ns: str, pod: Pod) -> None:
        assert pod.manifest is not None
        spec = pod.manifest.get("spec", {})
        container = spec["containers"][0]
        command = [*(container.get("command") or []), *(container.get("args") or [])]
        user = (container.get("securityContext") or {}).get("runAsUser")
        argv = ["docker", "run", "-d", "--pull", "never", "--network", "none", "--label", "k8s-double=1"]
        argv += ["--user", str(user)] if user is not None else []
        proc = await asyncio.create_subprocess_exec(
            *argv,
            container.get("image", "?"),
            *command,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            pod.waiting, pod.message = "ErrImagePull", err.decode(errors="replace")[:300]
            return
        pod.container_id = out.decode().strip()
        self.containers.append(pod.container_id)
        if (ns, pod.name) not in self.pods or self.pods[(ns, pod.name)] is not pod:
            # deleted while its container started (a start given up at once): no one else
            # will remove it (_remove found no container yet)
            await (await asyncio.create_subprocess_exec("docker", "rm", "-f", pod.container_id)).wait()
            return
        if pod.phase == "Pending":
            pod.phase = "Running"

    async def list_pods(self, request: web.Request) -> web.StreamResponse:
        ns = request.match_info["ns"]
        watching = request.query.get("watch") in ("true", "1")
        refused = self._forbidden(request) or self._rbac("pods", "watch" if watching else "list", ns)
        if refused is not None:
            return refused
        await self._stall()
        selector = _selector(request.query.get("labelSelector", ""), request.query.get("fieldSelector", ""))
        items = [self._pod_json(ns, p) for (pns, _), p in sorted(self.pods.items()) if pns == ns]
        items = [i for i in items if _selected(i, selector)]
        if not watching:
            meta = {"resourceVersion": str(self.rv)}
            return web.json_response(
                {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items}
            )
        return await self._watch(request, ns, selector, items)

    async def _watch(
        self, request: web.Request, ns: str, selector: dict[str, str], items: list[dict[str, Any]]
    ) -> web.StreamResponse:
        """A watch without a resource version: ADDED for what is there, then each change."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        entry = (ns, selector, queue)
        self.watchers.append(entry)
        timeout = float(request.query.get("timeoutSeconds", "1800"))
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        try:
            for item in items:
                await response.write(json.dumps({"type": "ADDED", "object": item}).encode() + b"\n")
            while (left := end - loop.time()) > 0:
                try:
                    kind, body = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if kind == "END":
                    break
                await response.write(json.dumps({"type": kind, "object": body}).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.watchers.remove(entry)
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    async def delete_pod(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        refused = self._forbidden(request) or self._rbac("pods", "delete", ns)
        if refused is not None:
            return refused
        pod = self.pods.get((ns, name))
        if pod is None:
            return self._not_found(ns, name)
        body = self._pod_json(ns, pod)
        await self._remove(ns, pod)
        return web.json_response(body)

    async def _remove(self, ns: str, pod: Pod) -> None:
        self.pods.pop((ns, pod.name), None)
        if pod.owned and pod.container_id:
            proc = await asyncio.create_subprocess_exec(
                "docker",
                "rm",
                "-f",
                pod.container_id,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await proc.wait()
        self._changed("DELETED", ns, pod)

    async def _hold(self, command: list[str]) -> bool:
        """Faults.hold_exec: the first matching exec waits until ``release`` (True: it is
        dropped, its caller having been killed meanwhile) or 60 s (False: it runs)."""
        text = self.faults.hold_exec
        if text is None or not any(text in part for part in command):
            return False
        self.faults.hold_exec = None
        self.faults.held.set()
        return await asyncio.get_running_loop().run_in_executor(None, self.faults.release.wait, 60)

    # -- what a test does to a pod from outside (another thread) ----------------------------
    def _call(self, coro: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def delete_under(self, ns: str, name: str) -> None:
        """Someone else deletes the pod (an operator, a controller)."""

        async def go() -> None:
            await self._remove(ns, self.pods[(ns, name)])

        self._call(go())

    def evict(self, ns: str, name: str) -> None:
        """The node evicts the pod: phase Failed, reason Evicted, its container gone."""

        async def go() -> None:
            pod = self.pods[(ns, name)]
            pod.phase, pod.reason, pod.message = "Failed", "Evicted", "The node was low on resource: memory."
            if pod.container_id:
                cid, pod.container_id = pod.container_id, None
                await (await asyncio.create_subprocess_exec("docker", "rm", "-f", cid)).wait()
            self._changed("MODIFIED", ns, pod)

        self._call(go())

    def labelled(self, ns: str, label: str, value: str) -> list[Pod]:
        return [p for (pns, _), p in self.pods.items() if pns == ns and _labels(p).get(label) == value]

    def removable(self) -> list[str]:
        return [p.container_id for p in self.pods.values() if p.owned and p.container_id]

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
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self.list_pods)
        app.router.add_post("/api/v1/namespaces/{ns}/pods", self.create_pod)
        app.router.add_delete("/api/v1/namespaces/{ns}/pods/{name}", self.delete_pod)
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


def _labels(pod: Pod) -> dict[str, str]:
    return dict(((pod.manifest or {}).get("metadata") or {}).get("labels") or {})


def _selector(labels: str, fields: str) -> dict[str, str]:
    """Equality selectors only (``a=b,c=d``); field selectors on metadata.name as ``field:...``."""
    out: dict[str, str] = {}
    for part in filter(None, labels.split(",")):
        key, _, value = part.partition("=")
        out[key.strip()] = value.strip().lstrip("=")
    for part in filter(None, fields.split(",")):
        key, _, value = part.partition("=")
        out["field:" + key.strip()] = value.strip().lstrip("=")
    return out


def _selected(body: dict[str, Any], selector: dict[str, str]) -> bool:
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    for key, value in selector.items():
        if key == "field:metadata.name":
            if meta.get("name") != value:
                return False
        elif key.startswith("field:metadata.namespace"):
            if meta.get("namespace") != value:
                return False
        elif labels.get(key) != value:
            return False
    return True


async def _settled(kubelets: set[asyncio.Future[None]]) -> None:
    """Wait for the kubelets still starting a container (each ``docker run`` ends)."""
    if kubelets:
        await asyncio.wait(list(kubelets), timeout=110)


def _remove_containers(ids: list[str]) -> None:
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=60, check=False)


def _end(proc: asyncio.subprocess.Process) -> None:
    """Whatever way an exec's handler leaves (its output dropped, its client gone, cancelled),
    the process is killed if it still runs and its pipes are closed: none is left to the GC."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    transport = getattr(proc, "_transport", None)  # asyncio offers no public close
    if transport is not None:
        transport.close()


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

    double._loop = loop

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
        double.faults.release.set()
        # Every kubelet's `docker run` ended first: a pod created just before the end (a
        # start refused on a missing permission) got its container after the removal
        # below and was left running (one busybox container left by every suite run).
        asyncio.run_coroutine_threadsafe(_settled(double.kubelets), loop).result(120)
        # Pods first: an exec a client cut at its deadline still runs there, and the
        # server's cleanup waits for its handler to end.
        for pod in double.pods.values():
            if pod.sandbox is not None:
                pod.sandbox.destroy()
        _remove_containers(double.removable())
        loop.call_soon_threadsafe(double.closing.set)
        for _, _, queue in list(double.watchers):  # end the watches: the cleanup waits for them
            loop.call_soon_threadsafe(queue.put_nowait, ("END", {}))
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
