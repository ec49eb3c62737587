"""Helpers and fixtures of the tests first written in tests/rules/test_P_engines.py (The Kubernetes
sandbox provider against the API server double (issue 23): a pod per run attempt from the operator's
template, watched until it runs, named start failures, labels, deletion, the sweep of a dead
runner's pod through the lease, the RBAC it needs, and the whole story with the runner.), shared by
the rule tests filed by family in tests/rules/ and by the tests that stayed."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engines import EXERCISED
from k8s_double import ApiDouble, running_double
from kubernetes import client as k8s
from nats_server import namespace, nats_url  # noqa: F401 - a fixture
from waiting import eventually

from scratchbank.adapters.k8s_provider import (
    KubernetesSandboxProvider,
)

NS = "runs"


IMAGE = "scratchbank-busybox:test"


SCRATCH = "/tmp/scratchbank-scratch"


TEMPLATE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"labels": {"team": "agents"}},
    "spec": {
        "serviceAccountName": "scratchbank-sandbox",
        "automountServiceAccountToken": False,
        "nodeSelector": {"pool": "sandboxes"},
        "containers": [
            {
                "name": "sandbox",
                "image": IMAGE,
                "command": ["sleep", "1000000"],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            }
        ],
    },
}


@pytest.fixture
def double(docker_url: str) -> Iterator[ApiDouble]:
    with running_double() as d:
        yield d
    EXERCISED.add("docker")


def api(d: ApiDouble) -> k8s.ApiClient:
    config = k8s.Configuration()
    config.host = d.url
    return k8s.ApiClient(config)


def provider(
    d: ApiDouble, template: dict[str, Any] = TEMPLATE, start_seconds: float = 60.0
) -> KubernetesSandboxProvider:
    return KubernetesSandboxProvider(
        api(d), namespace=NS, template=template, scratch=SCRATCH, start_seconds=start_seconds
    )


def creates(d: ApiDouble) -> int:
    return d.log.count(f"POST /api/v1/namespaces/{NS}/pods")


def _cycle(d: ApiDouble) -> None:
    """Everything the runner does with pods: start (create, watch), exec (get, exec),
    sweep (list), stop (delete)."""
    mine, theirs = provider(d, start_seconds=20.0), provider(d, start_seconds=20.0)
    left = theirs.start("run-1")
    [found] = mine.orphans("run-1")
    assert found.run("true", []).exit_code == 0
    mine.stop(found)
    assert left.pod not in {name for _, name in d.pods}  # type: ignore[attr-defined]


def kubectl(d: ApiDouble, *args: str, ns: str = NS) -> subprocess.CompletedProcess[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig", delete=False) as kc:
        kc.write(kubeconfig(d, ns))
    try:
        return subprocess.run(
            ["kubectl", "--kubeconfig", kc.name, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        Path(kc.name).unlink()


def kubeconfig(d: ApiDouble, ns: str = NS) -> str:
    return (
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: double, cluster: {{server: "{d.url}"}}}}]\n'
        "users: [{name: u, user: {token: t}}]\n"
        f"contexts: [{{name: c, context: {{cluster: double, user: u, namespace: {ns}}}}}]\n"
        "current-context: c\n"
    )


WORKFLOW = [
    {"name": "clone", "kind": "tool", "command": "mkdir -p clone && echo 'a clone' > clone/README.md"},
    {"name": "review", "kind": "human"},
    {"name": "measure", "kind": "agent", "command": "test -f clone/README.md && echo measured > measure.txt"},
]


WAIT = 120.0


def _bucket(endpoint: str) -> str:
    import uuid

    import boto3

    name = "sb-" + uuid.uuid4().hex[:12]
    s3 = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
    )
    s3.create_bucket(Bucket=name)
    return name


def runner_env(
    d: ApiDouble, tmp: Path, *, nats: str, ns: str, postgres: str, s3: str, bucket: str
) -> dict[str, str]:
    """Everything a runner process reads: the same settings a Deployment gives it (no flags)."""
    import json
    import os

    (tmp / "kubeconfig").write_text(kubeconfig(d))
    (tmp / "pod.json").write_text(json.dumps(TEMPLATE))
    (tmp / "workflow.json").write_text(json.dumps(WORKFLOW))
    return {
        **os.environ,
        "SCRATCHBANK_QUEUE": nats,
        "SCRATCHBANK_QUEUE_NAMESPACE": ns,
        "SCRATCHBANK_TIMELINE": postgres,
        "SCRATCHBANK_BANK": f"s3://{bucket}/runs",
        "AWS_ENDPOINT_URL": s3,
        "AWS_ACCESS_KEY_ID": "t",
        "AWS_SECRET_ACCESS_KEY": "t",
        "AWS_DEFAULT_REGION": "us-east-1",
        "SCRATCHBANK_WORKFLOW": str(tmp / "workflow.json"),
        "SCRATCHBANK_SANDBOX_PROVIDER": "kubernetes",
        "SCRATCHBANK_POD_TEMPLATE": str(tmp / "pod.json"),
        "SCRATCHBANK_POD_NAMESPACE": NS,
        "SCRATCHBANK_POD_START_SECONDS": "60",
        "SCRATCHBANK_SCRATCH": SCRATCH,
        "KUBECONFIG": str(tmp / "kubeconfig"),
        "SCRATCHBANK_LEASE_INTERVAL": "0.3",
        "SCRATCHBANK_LEASE_LAPSE": "1.5",
        "SCRATCHBANK_ACK_WAIT": "3",
    }


def _until(pred: Any, what: str) -> None:
    """A bounded wait for a state (the test fails by name past it; nothing is timed)."""
    eventually(pred, timeout=WAIT, what=what, interval=0.1)
