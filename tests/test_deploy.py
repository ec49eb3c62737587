"""The deployment manifests (deploy/*.yaml) against the Kubernetes OpenAPI schema of the
client we install, offline, and against the product they deploy.

The schema: the installed ``kubernetes`` client's models are generated from the Kubernetes
OpenAPI document of its release and validate strictly (pydantic, ``extra='forbid'``):
an unknown field, a wrong type or a missing required field fails. No vendored copy, no
network, and it cannot drift from the client the provider itself speaks with (ADR 0012).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes.client import models

from scratchbank.adapters.k8s_provider import MANAGED, NEEDS, check_template
from scratchbank.adapters.runner_settings import VARIABLES, runner_config

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
MODELS = {
    ("v1", "Namespace"): models.V1Namespace,
    ("v1", "ConfigMap"): models.V1ConfigMap,
    ("v1", "Secret"): models.V1Secret,
    ("v1", "Service"): models.V1Service,
    ("v1", "ServiceAccount"): models.V1ServiceAccount,
    ("v1", "Pod"): models.V1Pod,
    ("apps/v1", "Deployment"): models.V1Deployment,
    ("rbac.authorization.k8s.io/v1", "Role"): models.V1Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): models.V1RoleBinding,
    ("networking.k8s.io/v1", "NetworkPolicy"): models.V1NetworkPolicy,
}


def documents(*where: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for folder in where:
        for path in sorted(folder.glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc is not None:
                    yield path.name, doc


ALL = list(documents(DEPLOY, DEPLOY / "examples"))


def find(kind: str, name: str | None = None) -> dict[str, Any]:
    [doc] = [d for _, d in ALL if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


def validate(doc: dict[str, Any]) -> None:
    """The document against its kind's model: unknown fields, types, required fields."""
    model = MODELS[(doc.get("apiVersion", ""), doc.get("kind", ""))]
    model.model_validate(doc)


def test_deploy_the_schema_is_the_installed_clients() -> None:
    """The pinned client (pyproject: kubernetes>=36) generates its models from the OpenAPI
    document of its release; they forbid unknown fields."""
    assert int(kubernetes.__version__.split(".")[0]) >= 36
    assert models.V1Deployment.model_config.get("extra") == "forbid"


@pytest.mark.parametrize(
    ("file", "doc"), ALL, ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in ALL]
)
def test_deploy_every_manifest_validates_against_the_schema(file: str, doc: dict[str, Any]) -> None:
    """Each document is a kind we know, in the scratchbank namespace, valid for the schema."""
    validate(doc)
    if doc["kind"] != "Namespace":
        assert doc["metadata"]["namespace"] == "scratchbank"


def test_deploy_the_validator_refuses_what_the_api_server_would() -> None:
    """The check has teeth: a misspelt field, a wrong type, a missing required field."""
    runner = find("Deployment", "scratchbank-runner")
    broken = json.loads(json.dumps(runner))
    broken["spec"]["template"]["spec"]["containers"][0]["imagee"] = "x"
    with pytest.raises(ValueError, match="imagee"):
        validate(broken)
    broken = json.loads(json.dumps(runner))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(ValueError, match="replicas"):
        validate(broken)
    broken = json.loads(json.dumps(runner))
    del broken["spec"]["selector"]
    with pytest.raises(ValueError, match="selector"):
        validate(broken)


def test_deploy_the_pod_template_is_a_pod_the_provider_takes() -> None:
    """The operator's template (a ConfigMap) is a valid Pod, and the provider accepts it."""
    template = yaml.safe_load(find("ConfigMap", "scratchbank-pod-template")["data"]["pod.yaml"])
    validate(template)
    check_template(template, "sandbox")
    assert (
        template["spec"]["serviceAccountName"]
        == find("ServiceAccount", "scratchbank-sandbox")["metadata"]["name"]
    )


def test_deploy_the_role_grants_exactly_what_the_provider_needs() -> None:
    """RBAC: pods get/list/watch/create/delete and pods/exec create, nothing else, bound to
    the runner's service account, which the runner Deployment uses."""
    role = find("Role", "scratchbank-runner")
    granted = set()
    for rule in role["rules"]:
        assert rule["apiGroups"] == [""]
        granted |= {(r, v) for r in rule["resources"] for v in rule["verbs"]}
    assert granted == set(NEEDS)
    binding = find("RoleBinding", "scratchbank-runner")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    [subject] = binding["subjects"]
    runner = find("Deployment", "scratchbank-runner")["spec"]["template"]["spec"]
    assert subject["name"] == runner["serviceAccountName"]


def test_deploy_the_network_policy_denies_the_sandbox_pods_egress() -> None:
    """It selects the label the provider puts on every sandbox pod; no egress rule."""
    policy = find("NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == {MANAGED: "scratchbank"}
    assert "Egress" in policy["spec"]["policyTypes"] and policy["spec"]["egress"] == []


def test_deploy_runners_share_the_lease_and_run_non_root() -> None:
    """N replicas (>= 2); every container of ours runs as non-root with a read-only root."""
    runner = find("Deployment", "scratchbank-runner")
    assert runner["spec"]["replicas"] >= 2
    for name in ("scratchbank-runner", "scratchbank-api"):
        deployment = find("Deployment", name)
        spec = deployment["spec"]["template"]["spec"]
        assert (
            deployment["spec"]["selector"]["matchLabels"].items()
            <= deployment["spec"]["template"]["metadata"]["labels"].items()
        )
        assert spec["securityContext"]["runAsNonRoot"] is True
        for container in spec["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_deploy_the_settings_configure_a_runner(tmp_path: Path) -> None:
    """Every variable the ConfigMap sets is one the product reads, and with the Secret's keys
    (examples) and the mounted files they make a runner's settings: kubernetes pods."""
    data = find("ConfigMap", "scratchbank-settings")["data"]
    assert set(data) <= set(VARIABLES), set(data) - set(VARIABLES)
    secret = find("Secret", "scratchbank")["stringData"]
    (tmp_path / "pod.yaml").write_text(find("ConfigMap", "scratchbank-pod-template")["data"]["pod.yaml"])
    (tmp_path / "workflow.json").write_text(
        find("ConfigMap", "scratchbank-workflow")["data"]["workflow.json"]
    )
    json.loads((tmp_path / "workflow.json").read_text())
    env = {
        **data,
        **secret,
        "SCRATCHBANK_POD_TEMPLATE": str(tmp_path / "pod.yaml"),
        "SCRATCHBANK_WORKFLOW": str(tmp_path / "workflow.json"),
        "SCRATCHBANK_RUNNER_NAME": "scratchbank-runner-abc12",
    }
    cfg = runner_config(env)
    assert cfg.provider == "kubernetes" and cfg.pod_namespace == "scratchbank"
    assert cfg.settings.timeline_url.startswith("postgresql://") and cfg.settings.bank_url.startswith("s3://")
    assert cfg.holder == "scratchbank-runner-abc12"
