"""Real sandboxes for the integration tests: local (unshare), Docker and Podman, on a
BusyBox image and a GNU image. Each rig gives the sandbox adapter plus a way to run and
spawn workload commands in it, the way an engine's nodes would."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import attrs
import pytest
from engines import EXERCISED, need

from scratchbank.adapters.docker_sandbox import DockerSandbox, buffered_reader, docker_frames, engine_client
from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.scripted import ScriptedSandbox

SCRATCH = "/tmp/iterion-scratch"
ENGINES = [
    "local",
    "docker-busybox",
    "docker-gnu",
    "podman-busybox",
    "podman-gnu",
    "k8s-double",
    "k8s-docker",
]
CONTAINERS = ["docker-busybox", "docker-gnu", "podman-busybox", "podman-gnu"]


@attrs.define
class Rig:
    name: str
    sandbox: ScriptedSandbox
    sh: Callable[..., str]
    spawn: Callable[..., None]
    scratch: str

    @property
    def userland(self) -> str:
        return "gnu" if self.name.endswith("gnu") else "busybox"

    def beside(self, seconds: int = 60) -> str:
        """How many ``.scratchbank-staged*`` entries sit beside the scratch, once the old
        trees a commit removes in the background are gone (waited for up to ``seconds``;
        one still there after that counts)."""
        parent = f"$(dirname {self.scratch})"
        self.sh(
            f"i=0; while ls -a {parent} | grep -q 'scratchbank-staged.*[.]old$' && [ $i -lt {seconds * 10} ]; "
            "do sleep 0.1; i=$((i + 1)); done",
            check=False,
        )
        return self.sh(f"ls -a {parent} | grep -c scratchbank-staged || true", check=False).strip()


def engine_url(kind: str) -> str:
    var = {"docker": "SCRATCHBANK_DOCKER_URL", "podman": "SCRATCHBANK_PODMAN_URL"}[kind]
    return need(var, f"the {kind} engine")


@contextmanager
def _container(name: str, *, pool: int | None = None, **run: Any) -> Iterator[tuple[Any, Any]]:
    """A container of the engine and image ``name`` names (``docker-busybox``...) and its
    client, removed at the end. ``pool``: the client keeps at most that many idle API
    connections (the adapter's own client keeps ``IDLE_POOLS``; docker-py's keeps a pool
    per URL, up to 25 of up to 10)."""
    kind, flavour = name.split("-")
    client = engine_client(engine_url(kind), timeout=120, pools=pool) if pool else _shared_client(kind)
    image = f"scratchbank-{flavour}:test" if kind == "docker" else f"localhost/scratchbank-{flavour}:test"
    command = run.pop("command", ["sleep", "1000000"])
    box = client.containers.run(
        image, command, detach=True, network_mode="none", name=f"sb-{uuid.uuid4().hex[:10]}", **run
    )
    try:
        yield box, client
    finally:
        box.remove(force=True)
        if pool:
            client.close()


#: One engine client per engine in a test process, for the containers of tests that count no
#: connections (``pool`` None): docker-py asks the engine its version whenever a client is made,
#: and Podman's ``/version`` takes ~0.6 s of its CPU; a fresh container needs no fresh client.
_CLIENTS: dict[str, Any] = {}


def _shared_client(kind: str) -> Any:
    url = engine_url(kind)
    if url not in _CLIENTS:
        _CLIENTS[url] = engine_client(url, timeout=120)
    return _CLIENTS[url]


def _exec_output(client: Any, container_id: str, argv: list[str], user: str) -> tuple[int, bytes]:
    """A command's exit code and its stdout and stderr together, as docker-py's ``exec_run``
    gives them, but read through the engine answer's buffered reader
    (``docker_frames``): ``exec_run`` reads the raw socket and lost a short command's
    output that came with the answer's headers (an empty output, exit 0, under load)."""
    api = client.api
    exec_id = api.exec_create(container_id, argv, stdout=True, stderr=True, user=user)["Id"]
    sock = api.exec_start(exec_id, socket=True)
    try:
        reader = buffered_reader(sock)
        assert reader is not None, "docker-py kept no response on the exec's socket"
        out = b"".join(data for _, data in docker_frames(reader))
    finally:
        sock._response.close()
    code = api.exec_inspect(exec_id).get("ExitCode")
    return (-1 if code is None else int(code)), out


def _rig_in(name: str, box: Any, client: Any) -> Rig:
    """A rig over a running container: a sandbox adapter of its own (no state of an earlier
    rig's adapter), commands run in it."""
    kind = name.split("-")[0]
    sandbox = DockerSandbox(box.id, scratch=SCRATCH, podman=kind == "podman", client=client)

    def sh(cmd: str, user: str = "0", check: bool = True) -> str:
        code, out = _exec_output(client, box.id, ["sh", "-c", cmd], user)
        text = out.decode(errors="replace")
        if check and code != 0:
            raise AssertionError(f"{cmd!r} exited {code}: {text}")
        return text

    def spawn(cmd: str, user: str = "0") -> None:
        box.exec_run(["sh", "-c", cmd], user=user, detach=True)

    EXERCISED.add(kind)
    return Rig(name, sandbox, sh, spawn, SCRATCH)


@contextmanager
def container_rig(name: str, **run: Any) -> Iterator[Rig]:
    with _container(name, **run) as (box, client):
        yield _rig_in(name, box, client)


#: How a kept container is made fresh for its next test: every process but its PID 1 (and
#: this shell) killed, and its /tmp emptied (the image's /tmp is empty): the scratch, all
#: staged beside it and every in-sandbox script's work files live there. Prints what /tmp
#: still holds (nothing, or the reset failed).
RESET = "kill -9 -1 2>/dev/null; rm -rf /tmp/* /tmp/.[!.]* /tmp/..?* 2>/dev/null; ls -A /tmp"


class KeptContainers:
    """One container per engine and image for a module's tests that need only a fresh
    scratch in a running container (restores, archives, facts), each handed out reset
    (``RESET``) with an adapter of its own: a container start is seconds of the engine's
    CPU. A test that breaks its container (kills, quiesce, floods, its own options) takes
    a fresh one (``rig``)."""

    def __init__(self, stack: ExitStack) -> None:
        self._stack = stack
        self._boxes: dict[str, tuple[Any, Any]] = {}

    @contextmanager
    def rig(self, name: str) -> Iterator[Rig]:
        """A reset container rig for ``name`` (one of CONTAINERS); others are fresh."""
        if name not in CONTAINERS:
            with rig(name) as r:
                yield r
            return
        if name not in self._boxes:
            self._boxes[name] = self._stack.enter_context(_container(name))
        made = _rig_in(name, *self._boxes[name])
        left = made.sh(RESET, check=False).strip()
        assert not left, f"{name}: the kept container's /tmp still holds {left!r} after its reset"
        yield made


@pytest.fixture(scope="module")
def kept_containers() -> Iterator[KeptContainers]:
    """The module's kept containers (``KeptContainers``), removed once its tests ran."""
    with ExitStack() as stack:
        yield KeptContainers(stack)


@contextmanager
def local_rig() -> Iterator[Rig]:
    sandbox = LocalSandbox()
    scratch = sandbox.facts.scratch

    def sh(cmd: str, user: str = "0", check: bool = True) -> str:
        done = sandbox.run(cmd, [])
        if check and done.exit_code != 0:
            raise AssertionError(f"{cmd!r} exited {done.exit_code}: {done.err}")
        return done.stdout.decode(errors="replace")

    def spawn(cmd: str, user: str = "0") -> None:
        sandbox.spawn(cmd)

    EXERCISED.add("local")
    try:
        yield Rig("local", sandbox, sh, spawn, scratch)
    finally:
        sandbox.destroy()


@contextmanager
def k8s_rig(backend: str) -> Iterator[Rig]:
    """A pod of the API double, driven through the Kubernetes adapter. Its container is a
    fresh PID namespace (``unshare``) or a Docker container; workload commands go
    straight into the pod."""
    from k8s_double import running_double

    with running_double() as double:
        if backend == "docker":
            with container_rig("docker-busybox") as inner:
                container_id = inner.sandbox.container_id  # type: ignore[attr-defined]
                double.add_pod("ns1", "pod-1", container_id=container_id)
                with _k8s_adapter(double, SCRATCH) as sandbox:
                    EXERCISED.add("kubernetes (API double, docker pods)")
                    yield Rig("k8s-docker", sandbox, inner.sh, inner.spawn, SCRATCH)
            return
        local = double.add_pod("ns1", "pod-1").sandbox
        assert local is not None

        def sh(cmd: str, user: str = "0", check: bool = True) -> str:
            done = local.run(cmd, [])
            if check and done.exit_code != 0:
                raise AssertionError(f"{cmd!r} exited {done.exit_code}: {done.err}")
            return done.stdout.decode(errors="replace")

        def spawn(cmd: str, user: str = "0") -> None:
            local.spawn(cmd)

        with _k8s_adapter(double, local.facts.scratch) as sandbox:
            EXERCISED.add("kubernetes (API double)")
            yield Rig("k8s-double", sandbox, sh, spawn, local.facts.scratch)


@contextmanager
def _k8s_adapter(double: Any, scratch: str) -> Iterator[ScriptedSandbox]:
    from kubernetes import client as k8s

    from scratchbank.adapters.k8s_sandbox import KubernetesSandbox

    config = k8s.Configuration()
    config.host = double.url
    api = k8s.ApiClient(config)
    try:
        yield KubernetesSandbox("pod-1", namespace="ns1", scratch=scratch, api_client=api)
    finally:
        api.close()


@contextmanager
def rig(name: str, **run: Any) -> Iterator[Rig]:
    if name == "local":
        with local_rig() as r:
            yield r
    elif name == "k8s-double":
        with k8s_rig("unshare") as r:
            yield r
    elif name == "k8s-docker":
        with k8s_rig("docker") as r:
            yield r
    else:
        with container_rig(name, **run) as r:
            yield r


def host_sleep(seconds: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", str(seconds)])
