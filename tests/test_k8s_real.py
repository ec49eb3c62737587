"""Opt-in: the Kubernetes adapter against a real cluster. Never run in CI.

    SCRATCHBANK_K8S_KUBECONFIG=~/.kube/config [SCRATCHBANK_K8S_IMAGE=busybox:1.36] \\
        ./dev test -m k8s_real tests/test_k8s_real.py

It creates a uniquely named namespace and a busybox pod, runs the checks, and deletes
the namespace in ``finally``. The provider's tests (issue 23) start pods from a template in
that namespace through ``KubernetesSandboxProvider``: create, wait, exec, bank, delete,
restore into a new pod, sweep another provider's pod.

Exact permissions for the identity used:
  namespaces  create, delete                       (cluster scope: the test's namespace)
  pods        get, list, watch, create, delete     (the provider, deploy/rbac.yaml)
  pods/exec   create (and get, for clusters older than 1.31 that authorize the websocket as get)
"""

from __future__ import annotations

import hashlib
import io
import os
import uuid
from collections.abc import Iterator

import pytest
from waiting import eventually

from scratchbank.adapters.k8s_provider import KubernetesSandboxProvider
from scratchbank.adapters.k8s_sandbox import KubernetesSandbox
from scratchbank.domain.errors import ExecFailed, SandboxGone

KUBECONFIG = os.environ.get("SCRATCHBANK_K8S_KUBECONFIG")
pytestmark = [
    pytest.mark.k8s_real,
    pytest.mark.skipif(not KUBECONFIG, reason="opt-in: set SCRATCHBANK_K8S_KUBECONFIG"),
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[object, str]]:
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=KUBECONFIG)
    core = client.CoreV1Api(api_client)
    ns = f"scratchbank-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        image = os.environ.get("SCRATCHBANK_K8S_IMAGE", "busybox:1.36")
        for name, command in (("box", ["sleep", "100000"]), ("done", ["true"])):
            core.create_namespaced_pod(
                ns,
                {
                    "metadata": {"name": name},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": image, "command": command}],
                    },
                },
            )
        eventually(
            lambda: core.read_namespaced_pod("box", ns).status.phase == "Running",
            timeout=180,
            what="the pod runs",
            interval=1,
        )
        yield api_client, ns
    finally:
        core.delete_namespace(ns)


def sandbox(cluster: tuple[object, str], pod: str = "box", container: str | None = None) -> KubernetesSandbox:
    api_client, ns = cluster
    return KubernetesSandbox(pod, namespace=ns, container=container, api_client=api_client)  # type: ignore[arg-type]


def test_exit_codes(cluster: tuple[object, str]) -> None:
    sb = sandbox(cluster)
    assert [sb.run(c, []).exit_code for c in ("exit 0", "exit 7", "kill -9 $$")] == [0, 7, 137]


def test_stdin_eof_and_50_mb_both_ways(cluster: tuple[object, str]) -> None:
    sb = sandbox(cluster)
    data = os.urandom(50 << 20)
    done = sb.run("sha256sum | cut -d' ' -f1", [], stdin=io.BytesIO(data))
    assert done.stdout.decode().strip() == hashlib.sha256(data).hexdigest()
    out = io.BytesIO()
    sb.run("head -c 52428800 /dev/zero", [], stdout=out)
    assert len(out.getvalue()) == 50 << 20


def test_missing_pod_container_and_completed_pod(cluster: tuple[object, str]) -> None:
    with pytest.raises(SandboxGone):
        sandbox(cluster, pod="nope")
    with pytest.raises((ExecFailed, SandboxGone)):
        sandbox(cluster, container="nope").run("true", [])
    with pytest.raises((ExecFailed, SandboxGone)):
        sandbox(cluster, pod="done").run("true", [])


def test_a_long_silent_command(cluster: tuple[object, str]) -> None:
    assert sandbox(cluster).run("sleep 90; exit 3", []).exit_code == 3


def test_quiesce_archive_restore(cluster: tuple[object, str]) -> None:
    sb = sandbox(cluster)
    sb.run("mkdir -p /tmp/iterion-scratch && echo hi > /tmp/iterion-scratch/f", [])
    report = sb.quiesce(budget_seconds=30, wait_seconds=2)
    sb.continue_processes()
    assert not report.refused
    out = io.BytesIO()
    assert not sb.archive(out, compress=True, verify=False).empty


# -- the provider (issue 23): a pod per attempt, on the real thing ------------------------------


def provider(cluster: tuple[object, str]) -> KubernetesSandboxProvider:
    api_client, ns = cluster
    template = {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {
            "containers": [
                {
                    "name": "sandbox",
                    "image": os.environ.get("SCRATCHBANK_K8S_IMAGE", "busybox:1.36"),
                    "command": ["sleep", "100000"],
                }
            ]
        },
    }
    return KubernetesSandboxProvider(
        api_client,  # type: ignore[arg-type]
        namespace=ns,
        template=template,
        scratch="/tmp/scratchbank-scratch",
        start_seconds=180,
    )


def test_provider_banks_in_one_pod_and_restores_into_a_new_one(cluster: tuple[object, str]) -> None:
    """Create, exec, bank, delete; a new pod; restore; the file is back; deleted again."""
    from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
    from scratchbank.application.resume import resume
    from scratchbank.application.teardown import bank_at_teardown
    from scratchbank.domain import ResumeRequest
    from scratchbank.testing.builders import started

    p = provider(cluster)
    first = p.start("run-real", attempt="a1")
    first.run("mkdir -p /tmp/scratchbank-scratch && echo kept > /tmp/scratchbank-scratch/f", [])
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-real", [started()])
    report = bank_at_teardown("run-real", timeline=timeline, store=store, sandbox=first, run_finished=False)
    assert report.record.banked
    p.stop(first)
    second = p.start("run-real", attempt="a2")
    try:
        out = resume("run-real", ResumeRequest(), timeline=timeline, store=store, sandbox=second)
        assert out.proceeds
        assert second.run("cat /tmp/scratchbank-scratch/f", []).stdout == b"kept\n"
    finally:
        p.stop(second)


def test_provider_sweeps_the_pod_another_runner_left(cluster: tuple[object, str]) -> None:
    """Another provider's running pod for the run is an orphan, found by label; deleted."""
    theirs, mine = provider(cluster), provider(cluster)
    left = theirs.start("run-orphan", attempt="a1")
    [found] = mine.orphans("run-orphan")
    assert found.pod == left.pod  # type: ignore[attr-defined]
    mine.stop(found)

    def gone() -> bool:
        try:
            sandbox(cluster, pod=left.pod)  # type: ignore[attr-defined]
        except SandboxGone:
            return True
        return False

    # a deleted pod may show as Terminating for a moment
    eventually(gone, timeout=120, what=f"pod {left.pod} is deleted", interval=1)  # type: ignore[attr-defined]
