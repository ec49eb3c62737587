"""Sandbox providers: a fresh sandbox for a run, torn down after its teardown banked.

``LocalSandboxProvider`` (the embedded default: a directory and a PID namespace of
its own) and ``ContainerSandboxProvider`` (Docker, or Podman over its API socket:
a container from an image, no network, the scratch inside it).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import docker
import docker.errors

from scratchbank.application.ports import Sandbox
from scratchbank.domain.errors import ExecFailed, SandboxGone
from scratchbank.domain.runs import check_run_id

from .docker_sandbox import DockerSandbox
from .local_sandbox import LocalSandbox


class LocalSandboxProvider:
    """Local sandboxes under ``base``, one fresh directory per start."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.started: list[LocalSandbox] = []

    def start(self, run_id: str) -> Sandbox:
        root = self.base / f"{check_run_id(run_id)}-{uuid.uuid4().hex[:8]}"
        sandbox = LocalSandbox(root)
        self.started.append(sandbox)
        return sandbox

    def stop(self, sandbox: Sandbox) -> None:
        if not isinstance(sandbox, LocalSandbox):
            raise TypeError(f"not a local sandbox: {sandbox!r}")
        sandbox.destroy()


class ContainerSandboxProvider:
    """Docker (or Podman, ``podman=True``) containers from ``image``, scratch at ``scratch``."""

    def __init__(self, base_url: str, image: str, *, scratch: str, podman: bool = False) -> None:
        self.client = docker.DockerClient(base_url=base_url, timeout=120)
        self.image, self.scratch, self.podman = image, scratch, podman

    def start(self, run_id: str) -> Sandbox:
        name = f"sb-run-{check_run_id(run_id)[:40]}-{uuid.uuid4().hex[:8]}"
        try:
            box = self.client.containers.run(
                self.image, ["sleep", "1000000"], detach=True, network_mode="none", name=name
            )
        except docker.errors.DockerException as error:
            raise ExecFailed(f"cannot start a sandbox from {self.image}: {error}") from error
        return DockerSandbox(box.id, scratch=self.scratch, podman=self.podman, client=self.client)

    def stop(self, sandbox: Sandbox) -> None:
        if not isinstance(sandbox, DockerSandbox):
            raise TypeError(f"not a container sandbox: {sandbox!r}")
        try:
            self.client.containers.get(sandbox.container_id).remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.DockerException as error:
            raise SandboxGone(f"cannot remove {sandbox.container_id}: {error}") from error
