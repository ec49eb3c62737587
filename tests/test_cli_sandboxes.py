"""`scratchbank resume --sandbox SPEC` into each kind of sandbox the spec names, for real:
a Docker and a Podman container, a Kubernetes pod (the API-server double, through a
kubeconfig), and a sandbox that does not exist (SANDBOX_GONE, nothing written)."""

from __future__ import annotations

from pathlib import Path

import pytest
from k8s_double import running_double
from operator_rigs import RUN, cli, parked_run, tree_digest
from rigs.real_sandboxes import container_rig

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: double, cluster: {{server: "{url}"}}}}]
users: [{{name: operator, user: {{}}}}]
contexts: [{{name: double, context: {{cluster: double, user: operator}}}}]
current-context: double
"""


@pytest.mark.parametrize("engine", ["docker-busybox", "podman-busybox"])
def test_resume_restores_into_the_container_the_spec_names(tmp_path: Path, engine: str) -> None:
    """docker:NAME and podman:NAME: the bank is restored into that container."""
    parked_run(tmp_path, stale=False)
    with container_rig(engine) as rig:
        spec = f"{engine.split('-')[0]}:{rig.sandbox.container_id}"
        done = cli("resume", RUN, "--sandbox", spec, "--scratch", rig.scratch, home=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "restore: restored" in done.stdout
        assert rig.sh(f"cat {rig.scratch}/a.txt") == "kept"


def test_resume_restores_into_the_pod_k8s_namespace_slash_pod(tmp_path: Path) -> None:
    """k8s:NAMESPACE/POD through a kubeconfig: the bank is restored into that pod."""
    parked_run(tmp_path / "home", stale=False)
    with running_double() as double:
        pod = double.add_pod("ns1", "p1")
        assert pod.sandbox is not None
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(KUBECONFIG.format(url=double.url))
        scratch = pod.sandbox.facts.scratch
        argv = ("resume", RUN, "--sandbox", "k8s:ns1/p1", "--scratch", scratch)
        done = cli(*argv, home=tmp_path / "home", KUBECONFIG=str(kubeconfig))
        assert done.returncode == 0, done.stderr
        assert (Path(scratch) / "a.txt").read_bytes() == b"kept"
        assert any("/namespaces/ns1/pods/p1/exec" in line for line in double.log)


def test_a_container_that_does_not_exist_is_SANDBOX_GONE_and_nothing_is_written(
    tmp_path: Path, docker_url: str
) -> None:
    """A missing container is SANDBOX_GONE (exit 5) and the home is unchanged."""
    parked_run(tmp_path, stale=False)
    before = tree_digest(tmp_path)
    done = cli("resume", RUN, "--sandbox", "docker:no-such-container-here", home=tmp_path)
    assert done.returncode == 5 and "error: SANDBOX_GONE: " in done.stderr and "Traceback" not in done.stderr
    assert tree_digest(tmp_path) == before
