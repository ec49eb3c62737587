"""Sandbox providers: a fresh sandbox for a run, torn down after its teardown banked.

``LocalSandboxProvider`` (the embedded default: a directory and a PID namespace of
its own) and ``ContainerSandboxProvider`` (Docker, or Podman over its API socket:
a container from an image, no network, the scratch inside it). Pods on Kubernetes:
``k8s_provider.KubernetesSandboxProvider`` (imported only when named: it needs the
``kubernetes`` client). ``runner_settings.open_provider`` opens the one the settings name
(SCRATCHBANK_SANDBOX_PROVIDER: one of ``KINDS``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from pathlib import Path

from scratchbank.application.ports import Sandbox
from scratchbank.domain.errors import ExecFailed, SandboxGone
from scratchbank.domain.runs import check_run_id

from .local_sandbox import LocalSandbox

OWNER = "owner.json"
#: The providers, by the name SCRATCHBANK_SANDBOX_PROVIDER gives them.
KINDS = {
    "local": "scratchbank.adapters.sandbox_provider:LocalSandboxProvider",
    "docker": "scratchbank.adapters.sandbox_provider:ContainerSandboxProvider",
    "podman": "scratchbank.adapters.sandbox_provider:ContainerSandboxProvider",
    "kubernetes": "scratchbank.adapters.k8s_provider:KubernetesSandboxProvider",
}
LABEL = "scratchbank.run"


def _end_process_group(pid: int) -> None:
    """End a namespace a lapsed runner left: its init's group (its PID 1 dies with it)."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


class LocalSandboxProvider:
    """Local sandboxes under ``base``, one fresh directory per start (``<run>-<id>/``).

    Each directory names its run and the process that holds its namespace
    (``owner.json``), so that a runner taking a lapsed lease can find the sandbox
    another runner left, end its processes, and bank its scratch from the host side.
    """

    def __init__(self, base: Path) -> None:
        self.base = base
        self.started: list[LocalSandbox] = []

    def start(self, run_id: str, attempt: str | None = None) -> Sandbox:
        root = self.base / f"{check_run_id(run_id)}-{uuid.uuid4().hex[:8]}"
        sandbox = LocalSandbox(root)
        init = sandbox._init.pid if sandbox._init is not None else None
        (root / OWNER).write_text(json.dumps({"run": run_id, "init": init}))
        self.started.append(sandbox)
        return sandbox

    def stop(self, sandbox: Sandbox) -> None:
        if not isinstance(sandbox, LocalSandbox):
            raise TypeError(f"not a local sandbox: {sandbox!r}")
        sandbox.destroy()

    def orphans(self, run_id: str) -> list[Sandbox]:
        ours = {s.root for s in self.started}
        found: list[Sandbox] = []
        for owner in sorted(self.base.glob(f"{check_run_id(run_id)}-*/{OWNER}")):
            root = owner.parent
            facts = json.loads(owner.read_text())
            if root in ours or facts.get("run") != run_id:
                continue
            if isinstance(facts.get("init"), int):
                _end_process_group(facts["init"])
            sandbox = LocalSandbox(root)
            self.started.append(sandbox)
            found.append(sandbox)
        return found


class ContainerSandboxProvider:
    """Docker (or Podman, ``podman=True``) containers from ``image``, scratch at ``scratch``."""

    def __init__(self, base_url: str, image: str, *, scratch: str, podman: bool = False) -> None:
        from .config import require_extra

        require_extra("docker")  # the [docker] extra: imported here, never by the local provider
        from .docker_sandbox import engine_client

        self.client = engine_client(base_url, timeout=120)  # its sandboxes share it (H7)
        self.image, self.scratch, self.podman = image, scratch, podman
        self.started: set[str] = set()

    def start(self, run_id: str, attempt: str | None = None) -> Sandbox:
        import docker.errors

        from .docker_sandbox import DockerSandbox

        name = f"sb-run-{check_run_id(run_id)[:40]}-{uuid.uuid4().hex[:8]}"
        try:
            box = self.client.containers.run(
                self.image,
                ["sleep", "1000000"],
                detach=True,
                network_mode="none",
                name=name,
                labels={LABEL: run_id, **({f"{LABEL}.attempt": attempt} if attempt else {})},
            )
        except docker.errors.DockerException as error:
            raise ExecFailed(f"cannot start a sandbox from {self.image}: {error}") from error
        self.started.add(box.id)
        return DockerSandbox(box.id, scratch=self.scratch, podman=self.podman, client=self.client)

    def orphans(self, run_id: str) -> list[Sandbox]:
        """The run's containers another runner started (by label), still there."""
        import docker.errors

        from .docker_sandbox import DockerSandbox

        try:
            boxes = self.client.containers.list(all=True, filters={"label": f"{LABEL}={run_id}"})
        except docker.errors.DockerException as error:
            raise ExecFailed(f"cannot list the run's containers: {error}") from error
        found: list[Sandbox] = []
        for box in boxes:
            if box.id in self.started:
                continue
            self.started.add(box.id)
            found.append(DockerSandbox(box.id, scratch=self.scratch, podman=self.podman, client=self.client))
        return found

    def stop(self, sandbox: Sandbox) -> None:
        import docker.errors

        from .docker_sandbox import DockerSandbox

        if not isinstance(sandbox, DockerSandbox):
            raise TypeError(f"not a container sandbox: {sandbox!r}")
        try:
            self.client.containers.get(sandbox.container_id).remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.DockerException as error:
            raise SandboxGone(f"cannot remove {sandbox.container_id}: {error}") from error
