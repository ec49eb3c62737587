"""The runner's settings, all from the environment (a Deployment's env and ConfigMap), and
the runner they wire.

The timeline, bank store and queue come from the very settings ``scratchbank serve`` and
``scratchbank mcp`` read (``config.settings_from``: SCRATCHBANK_TIMELINE, SCRATCHBANK_BANK,
SCRATCHBANK_QUEUE, SCRATCHBANK_HOME, SCRATCHBANK_RETAIN: the checkpoints' banks a run keeps,
K8); the runner adds only what a runner has:

=============================== =========================================================
SCRATCHBANK_WORKFLOW            the reference engine's workflow (a JSON file)
SCRATCHBANK_SANDBOX_PROVIDER    local (default) | docker | podman | kubernetes
SCRATCHBANK_SANDBOXES           local: the folder of the sandboxes (HOME/sandboxes)
SCRATCHBANK_SANDBOX_IMAGE       docker, podman: the sandbox image
SCRATCHBANK_DOCKER_URL          docker: the engine (unix:///var/run/docker.sock)
SCRATCHBANK_PODMAN_URL          podman: the API socket (else CONTAINER_HOST)
SCRATCHBANK_POD_TEMPLATE        kubernetes: a Pod manifest (YAML or JSON file)
SCRATCHBANK_POD_NAMESPACE       kubernetes: where the pods go (in-cluster: the runner's own)
SCRATCHBANK_POD_CONTAINER       kubernetes: the sandbox container (default: the first)
SCRATCHBANK_POD_START_SECONDS   kubernetes: the deadline for a pod to run (120)
KUBECONFIG                      kubernetes: a kubeconfig; else the in-cluster service account
SCRATCHBANK_SCRATCH             the scratch path in a container or pod
SCRATCHBANK_RUNNER_NAME         this runner's name on the lease (default: the host name,
                                which is the pod's name under a Deployment)
SCRATCHBANK_QUEUE_NAMESPACE     stream, consumer and lease bucket names (sb)
SCRATCHBANK_LEASE_INTERVAL      seconds between lease refreshes (30)
SCRATCHBANK_LEASE_LAPSE         seconds a lease outlives its last refresh (60)
SCRATCHBANK_ACK_WAIT            seconds before an unacked delivery comes again (240)
SCRATCHBANK_SWEEP_EVERY         seconds between orphan sweeps (60; 0: never)
SCRATCHBANK_SWEEP_CUTOFF        age past which a queued, unclaimed run is swept (L4's)
SCRATCHBANK_RUNNER_LOG          one JSON line per delivery to this file (else stdout)
=============================== =========================================================

Every bad or missing value is ConfigInvalid naming the variable; nothing is opened until
all of them read well.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from scratchbank.application.ports import SandboxProvider
from scratchbank.domain.errors import ConfigInvalid

from .config import DEFAULT_SCRATCH, Settings, settings_from
from .sandbox_provider import KINDS

PROVIDERS = tuple(KINDS)
#: Every variable a runner reads (the surfaces' own: config.settings_from).
VARIABLES = (
    "SCRATCHBANK_HOME",
    "SCRATCHBANK_TIMELINE",
    "SCRATCHBANK_BANK",
    "SCRATCHBANK_QUEUE",
    "SCRATCHBANK_SCRATCH",
    "SCRATCHBANK_RETAIN",
    "SCRATCHBANK_WORKFLOW",
    "SCRATCHBANK_SANDBOX_PROVIDER",
    "SCRATCHBANK_SANDBOXES",
    "SCRATCHBANK_SANDBOX_IMAGE",
    "SCRATCHBANK_DOCKER_URL",
    "SCRATCHBANK_PODMAN_URL",
    "SCRATCHBANK_POD_TEMPLATE",
    "SCRATCHBANK_POD_NAMESPACE",
    "SCRATCHBANK_POD_CONTAINER",
    "SCRATCHBANK_POD_START_SECONDS",
    "SCRATCHBANK_RUNNER_NAME",
    "SCRATCHBANK_QUEUE_NAMESPACE",
    "SCRATCHBANK_LEASE_INTERVAL",
    "SCRATCHBANK_LEASE_LAPSE",
    "SCRATCHBANK_ACK_WAIT",
    "SCRATCHBANK_SWEEP_EVERY",
    "SCRATCHBANK_SWEEP_CUTOFF",
    "SCRATCHBANK_RUNNER_LOG",
    "KUBECONFIG",
    "AWS_ENDPOINT_URL",
)
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@attrs.frozen
class RunnerConfig:
    """Everything a runner process needs, read and checked."""

    settings: Settings
    queue_url: str
    workflow: Path
    provider: str = "local"
    holder: str = "runner"
    queue_namespace: str = "sb"
    sandboxes: Path | None = None
    image: str | None = None
    engine_url: str | None = None
    pod_template: Mapping[str, Any] | None = attrs.field(default=None, eq=False)
    pod_namespace: str = "default"
    pod_container: str | None = None
    pod_start_seconds: float = 120.0
    interval: float = 30.0
    lapse: float = 60.0
    ack_wait: float = 240.0
    sweep_every: float = 60.0
    sweep_cutoff: float | None = None
    log: Path | None = None

    def describe(self) -> str:
        where = {
            "local": f"local sandboxes in {self.sandboxes}",
            "docker": f"Docker containers from {self.image}",
            "podman": f"Podman containers from {self.image}",
            "kubernetes": f"pods in namespace {self.pod_namespace}",
        }[self.provider]
        return f"runner {self.holder}: {self.settings.describe()}; {where}"


def _seconds(env: Mapping[str, str], var: str, default: float, *, zero: bool = False) -> float:
    raw = env.get(var)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value > 0 or (zero and value == 0)) or value == float("inf"):
        raise ConfigInvalid(f"{var}={raw[:40]!r} is not a positive number of seconds")
    return value


def load_template(path: Path) -> dict[str, Any]:
    """A Pod manifest from a YAML or JSON file (ConfigInvalid when unreadable or not a Pod)."""
    import yaml  # type: ignore[import-untyped]

    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigInvalid(f"SCRATCHBANK_POD_TEMPLATE: cannot read {path}: {error.strerror}") from None
    try:
        loaded = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        raise ConfigInvalid(
            f"SCRATCHBANK_POD_TEMPLATE: {path} is not YAML/JSON: {str(error)[:200]}"
        ) from None
    if not isinstance(loaded, dict):
        raise ConfigInvalid(f"SCRATCHBANK_POD_TEMPLATE: {path} holds no mapping (a Pod manifest)")
    from .k8s_provider import check_template

    check_template(loaded, None)
    return loaded


def runner_config(env: Mapping[str, str] | None = None, **given: Any) -> RunnerConfig:
    """The runner's settings from ``env``; ``given`` (flags) win over it where not None."""
    env = dict(os.environ if env is None else env)
    for key, var in (
        ("queue", "SCRATCHBANK_QUEUE"),
        ("timeline", "SCRATCHBANK_TIMELINE"),
        ("bank", "SCRATCHBANK_BANK"),
        ("workflow", "SCRATCHBANK_WORKFLOW"),
        ("sandboxes", "SCRATCHBANK_SANDBOXES"),
        ("holder", "SCRATCHBANK_RUNNER_NAME"),
        ("namespace", "SCRATCHBANK_QUEUE_NAMESPACE"),
        ("interval", "SCRATCHBANK_LEASE_INTERVAL"),
        ("lapse", "SCRATCHBANK_LEASE_LAPSE"),
        ("ack_wait", "SCRATCHBANK_ACK_WAIT"),
        ("sweep_every", "SCRATCHBANK_SWEEP_EVERY"),
        ("sweep_cutoff", "SCRATCHBANK_SWEEP_CUTOFF"),
        ("log", "SCRATCHBANK_RUNNER_LOG"),
    ):
        if given.get(key) is not None:
            env[var] = str(given[key])
    settings = settings_from(env)
    if not settings.queue_url:
        raise ConfigInvalid("a runner needs a queue: SCRATCHBANK_QUEUE=nats://HOST:PORT")
    workflow = env.get("SCRATCHBANK_WORKFLOW")
    try:
        readable = bool(workflow) and Path(str(workflow)).is_file() and os.access(str(workflow), os.R_OK)
    except OSError:  # a folder this user may not enter
        readable = False
    if not readable:
        raise ConfigInvalid(
            f"SCRATCHBANK_WORKFLOW: no readable workflow file {workflow!r} (a JSON list of nodes)"
        )
    provider = env.get("SCRATCHBANK_SANDBOX_PROVIDER") or "local"
    if provider not in PROVIDERS:
        raise ConfigInvalid(
            f"SCRATCHBANK_SANDBOX_PROVIDER={provider[:40]!r} is not one of {', '.join(PROVIDERS)}"
        )
    more: dict[str, Any] = {}
    if provider == "local":
        base = env.get("SCRATCHBANK_SANDBOXES") or (
            str(settings.home.path / "sandboxes") if settings.home else ""
        )
        if not base:
            raise ConfigInvalid("SCRATCHBANK_SANDBOXES: no folder for local sandboxes (and no home)")
        more["sandboxes"] = Path(base)
    elif provider in ("docker", "podman"):
        more["image"] = env.get("SCRATCHBANK_SANDBOX_IMAGE") or ""
        if not more["image"]:
            raise ConfigInvalid(f"SCRATCHBANK_SANDBOX_IMAGE: the {provider} sandboxes' image is not set")
        var = "SCRATCHBANK_PODMAN_URL" if provider == "podman" else "SCRATCHBANK_DOCKER_URL"
        fallback = env.get("CONTAINER_HOST") if provider == "podman" else "unix:///var/run/docker.sock"
        more["engine_url"] = env.get(var) or fallback
        if not more["engine_url"]:
            raise ConfigInvalid(f"{var}: where the {provider} API answers is not set")
    else:
        path = env.get("SCRATCHBANK_POD_TEMPLATE")
        if not path:
            raise ConfigInvalid("SCRATCHBANK_POD_TEMPLATE: the kubernetes provider needs a pod template file")
        more["pod_template"] = load_template(Path(path))
        more["pod_container"] = env.get("SCRATCHBANK_POD_CONTAINER") or None
        from .k8s_provider import check_template

        check_template(more["pod_template"], more["pod_container"])
        more["pod_namespace"] = env.get("SCRATCHBANK_POD_NAMESPACE") or _own_namespace()
        more["pod_start_seconds"] = _seconds(env, "SCRATCHBANK_POD_START_SECONDS", 120.0)
    log = env.get("SCRATCHBANK_RUNNER_LOG")
    return RunnerConfig(
        settings,
        settings.queue_url,
        Path(str(workflow)),
        provider,
        holder=env.get("SCRATCHBANK_RUNNER_NAME") or socket.gethostname() or "runner",
        queue_namespace=env.get("SCRATCHBANK_QUEUE_NAMESPACE") or "sb",
        interval=_seconds(env, "SCRATCHBANK_LEASE_INTERVAL", 30.0),
        lapse=_seconds(env, "SCRATCHBANK_LEASE_LAPSE", 60.0),
        ack_wait=_seconds(env, "SCRATCHBANK_ACK_WAIT", 240.0),
        sweep_every=_seconds(env, "SCRATCHBANK_SWEEP_EVERY", 60.0, zero=True),
        sweep_cutoff=_seconds(env, "SCRATCHBANK_SWEEP_CUTOFF", 0.0)
        if env.get("SCRATCHBANK_SWEEP_CUTOFF")
        else None,
        log=Path(log) if log else None,
        **more,
    )


def _own_namespace() -> str:
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def kubernetes_client() -> Any:
    """An API client from KUBECONFIG (or ~/.kube/config), else the in-cluster service account."""
    from .k8s_sandbox import kubernetes_client as client

    return client()


def open_provider(cfg: RunnerConfig) -> SandboxProvider:
    """The sandbox provider the settings name."""
    from .sandbox_provider import ContainerSandboxProvider, LocalSandboxProvider

    scratch = cfg.settings.scratch or DEFAULT_SCRATCH
    if cfg.provider == "local":
        assert cfg.sandboxes is not None
        cfg.sandboxes.mkdir(parents=True, exist_ok=True)
        return LocalSandboxProvider(cfg.sandboxes)
    if cfg.provider in ("docker", "podman"):
        assert cfg.image
        assert cfg.engine_url
        return ContainerSandboxProvider(
            cfg.engine_url, cfg.image, scratch=scratch, podman=cfg.provider == "podman"
        )
    from .k8s_provider import KubernetesSandboxProvider

    assert cfg.pod_template is not None
    return KubernetesSandboxProvider(
        kubernetes_client(),
        namespace=cfg.pod_namespace,
        template=cfg.pod_template,
        scratch=scratch,
        container=cfg.pod_container,
        start_seconds=cfg.pod_start_seconds,
    )
