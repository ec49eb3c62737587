"""Sandboxes to bench on, and what a user would run on each instead of scratchbank.

``Engine(name).make(tree)`` starts a sandbox whose scratch holds ``tree`` and returns a
``Box``: the Sandbox, how to run a shell in it, how to close it, and the engine's own
copy tool (``docker cp`` / ``podman cp`` / ``kubectl cp``) out of and back into it.
The local engine links its scratch to the cached tree (archived through the link, T18)
so that a 1 GB or a million-file tree is not copied for each run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.scripted import ScriptedSandbox

SCRATCH = "/tmp/iterion-scratch"
ENGINES = ("local", "k8s-double", "docker", "podman")


@attrs.frozen
class Box:
    engine: str
    sandbox: ScriptedSandbox
    close: Callable[[], None]
    cp_out: Callable[[Path], None] | None = None  # the engine's own copy of the scratch to a host dir
    cp_in: Callable[[Path], None] | None = None  # and of a host dir back into the scratch


def available() -> list[str]:
    names = ["local", "k8s-double"]
    if os.environ.get("SCRATCHBANK_DOCKER_URL"):
        names.append("docker")
    if os.environ.get("SCRATCHBANK_PODMAN_URL"):
        names.append("podman")
    return names


def make(engine: str, tree: Path) -> Box:
    if engine == "local":
        return _local(tree)
    if engine == "k8s-double":
        return _k8s(tree)
    return _container(engine, tree)


def _local(tree: Path) -> Box:
    box = LocalSandbox()
    os.symlink(tree, box.facts.scratch)
    return Box("local", box, box.destroy)


def _cli(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, env=os.environ | {"DOCKER_HOST": ""})


def _fresh(dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)


def _container(engine: str, tree: Path) -> Box:
    import docker

    from scratchbank.adapters.docker_sandbox import DockerSandbox

    url = os.environ["SCRATCHBANK_DOCKER_URL" if engine == "docker" else "SCRATCHBANK_PODMAN_URL"]
    client = docker.DockerClient(base_url=url, timeout=600)
    image = "scratchbank-busybox:test" if engine == "docker" else "localhost/scratchbank-busybox:test"
    c = client.containers.run(image, ["sleep", "1000000"], detach=True, network_mode="none")
    c.exec_run(["mkdir", "-p", SCRATCH])
    with tempfile.TemporaryFile() as buf:
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(tree, arcname=".")
        buf.seek(0)
        c.put_archive(SCRATCH, buf)
    box = DockerSandbox(c.id, scratch=SCRATCH, podman=engine == "podman", client=client)

    def close() -> None:
        c.remove(force=True)
        client.close()

    def cp_out(dest: Path) -> None:
        _fresh(dest)
        _cli(engine, "cp", f"{c.id}:{SCRATCH}/.", str(dest))

    def cp_in(src: Path) -> None:
        c.exec_run(["sh", "-c", f"rm -rf {SCRATCH}.cp && mkdir -p {SCRATCH}.cp"])
        _cli(engine, "cp", f"{src}/.", f"{c.id}:{SCRATCH}.cp")

    return Box(engine, box, close, cp_out, cp_in)


def _kubeconfig(url: str) -> Path:
    with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig", delete=False) as kc:
        kc.write(
            "apiVersion: v1\nkind: Config\n"
            f'clusters: [{{name: double, cluster: {{server: "{url}"}}}}]\n'
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: c, context: {cluster: double, user: u, namespace: ns1}}]\n"
            "current-context: c\n"
        )
    return Path(kc.name)


def _k8s(tree: Path) -> Box:
    """A pod of the API double (tests/k8s_double.py), through the Kubernetes adapter."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from k8s_double import running_double
    from kubernetes import client as k8s

    from scratchbank.adapters.k8s_sandbox import KubernetesSandbox

    ctx = running_double()
    double = ctx.__enter__()
    pod = double.add_pod("ns1", "bench")
    os.symlink(tree, pod.sandbox.facts.scratch)
    config = k8s.Configuration()
    config.host = double.url
    api = k8s.ApiClient(config)
    box = KubernetesSandbox("bench", namespace="ns1", scratch=pod.sandbox.facts.scratch, api_client=api)
    kubeconfig = _kubeconfig(double.url)
    scratch = pod.sandbox.facts.scratch

    def close() -> None:
        api.close()
        kubeconfig.unlink()
        with contextlib.suppress(Exception):
            pod.sandbox.destroy()
        ctx.__exit__(None, None, None)

    def cp_out(dest: Path) -> None:
        _fresh(dest)
        _cli("kubectl", "--kubeconfig", str(kubeconfig), "cp", f"ns1/bench:{scratch}/.", str(dest))

    def cp_in(src: Path) -> None:
        _cli("kubectl", "--kubeconfig", str(kubeconfig), "cp", f"{src}/.", f"ns1/bench:{scratch}.cp")

    return Box("k8s-double", box, close, cp_out, cp_in)


def run_shell(box: Box, script: str, *, stdin: Any = None, stdout: Any = None) -> None:
    done = box.sandbox.run(script, [box.sandbox.facts.scratch], stdin=stdin, stdout=stdout)
    assert done.exit_code == 0, done.err
