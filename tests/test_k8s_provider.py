"""The Kubernetes sandbox provider against the API server double (issue 23): a pod per run
attempt from the operator's template, watched until it runs, named start failures,
labels, deletion, the sweep of a dead runner's pod through the lease, the RBAC it needs,
and the whole story with the runner.

The double's "kubelet" runs each created pod's container in Docker (the template's
image, ``--network none``), and exec enters it: the scratch lives in a real container.
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engines import EXERCISED
from k8s_double import ApiDouble, running_double
from kubernetes import client as k8s
from nats_server import namespace, nats_url  # noqa: F401 - a fixture
from runner_rigs import STORY, queue_resume
from waiting import eventually

from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.inprocess import InProcessLease, InProcessQueue
from scratchbank.adapters.k8s_provider import (
    ATTEMPT_LABEL,
    MANAGED,
    NEEDS,
    RUN_ANNOTATION,
    RUN_LABEL,
    KubernetesSandboxProvider,
    label_value,
)
from scratchbank.adapters.k8s_sandbox import KubernetesSandbox
from scratchbank.adapters.memory import InMemoryTimeline
from scratchbank.adapters.reference_engine import ReferenceEngine
from scratchbank.application.runner import Handled, Runner, RunnerSettings, Verdicts
from scratchbank.domain.errors import (
    ExecFailed,
    PodDeleted,
    PodEvicted,
    PodImagePull,
    PodStartTimeout,
    PodUnschedulable,
    SandboxGone,
    ScratchbankError,
)
from scratchbank.domain.lease import LeaseTiming
from scratchbank.domain.records import NodeFinished, RunStarted, ScratchBanked, ScratchRestored

pytestmark = pytest.mark.docker

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


# -- one pod per attempt ----------------------------------------------------------------------


def test_P1_a_pod_per_attempt_from_the_template_labelled_with_run_and_attempt_then_deleted(
    double: ApiDouble,
) -> None:
    """The template's fields are kept; run and attempt are labels (hashed past 63 characters)
    and annotations; restartPolicy Never; the container runs commands; stop deletes the pod."""
    run = "Run_" + "x" * 70
    p = provider(double)
    sandbox = p.start(run, attempt="a1")
    assert isinstance(sandbox, KubernetesSandbox)
    pod = double.pods[(NS, sandbox.pod)]
    assert pod.phase == "Running" and pod.container_id
    meta, spec = pod.manifest["metadata"], pod.manifest["spec"]  # type: ignore[index]
    assert meta["labels"] == {
        "team": "agents",
        MANAGED: "scratchbank",
        RUN_LABEL: label_value(run),
        ATTEMPT_LABEL: "a1",
    }
    assert label_value(run).startswith("h-") and len(label_value(run)) <= 63
    assert meta["annotations"][RUN_ANNOTATION] == run
    assert spec["serviceAccountName"] == "scratchbank-sandbox" and spec["nodeSelector"] == {
        "pool": "sandboxes"
    }
    assert spec["restartPolicy"] == "Never"
    assert sandbox.pod.startswith("sb-run-x") and sandbox.pod == sandbox.pod.lower()
    assert sandbox.run("echo hi > /tmp/f && cat /tmp/f", []).stdout == b"hi\n"
    p.stop(sandbox)
    assert (NS, sandbox.pod) not in double.pods
    p.stop(sandbox)  # already gone: nothing to do


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("image_pull", PodImagePull),
        ("evicted", PodEvicted),
        ("unschedulable", PodUnschedulable),
        ("pending", PodStartTimeout),
    ],
)
def test_P2_a_pod_that_does_not_run_is_named_and_deleted(
    double: ApiDouble, fault: str, error: type[ScratchbankError]
) -> None:
    """Image pull and eviction at once; no node, or no start, at the deadline: each by name,
    and the pod is deleted (nothing left behind)."""
    double.faults.pod_start = fault
    with pytest.raises(error):
        provider(double, start_seconds=1.0).start("run-1", attempt="a1")
    assert creates(double) == 1 and not double.pods


def test_P2_an_image_the_node_cannot_pull_is_named(double: ApiDouble) -> None:
    """No fault set: the kubelet cannot find the template's image (the double pulls nothing)."""
    template = {**TEMPLATE, "spec": {"containers": [{"name": "sandbox", "image": "nope/missing:1"}]}}
    with pytest.raises(PodImagePull):
        provider(double, template).start("run-1")
    assert not double.pods


def test_P2_a_pod_deleted_while_it_starts_is_named(double: ApiDouble) -> None:
    """Someone deletes the pod before it runs: the watch's DELETED ends the start by name."""
    double.faults.pod_start = "pending"

    def delete_when_created() -> None:
        (ns, name), _pod = next(iter(eventually(lambda: dict(double.pods), timeout=30, what="a pod").items()))
        double.delete_under(ns, name)

    deleter = threading.Thread(target=delete_when_created)
    deleter.start()
    try:
        with pytest.raises(PodDeleted):
            provider(double).start("run-1")
    finally:
        deleter.join(30)


def test_P2_a_pod_deleted_before_its_watch_began_is_named(double: ApiDouble) -> None:
    """The pod is gone between its create and the first watch (whose list is then empty, so no
    DELETED ever comes): the start reads the pod between watch windows and names it."""
    double.faults.pod_start = "pending"
    p = provider(double)
    create = p.core.create_namespaced_pod

    def create_then_lose(ns: str, body: dict[str, Any], **kwargs: Any) -> Any:
        made = create(ns, body, **kwargs)
        double.delete_under(ns, body["metadata"]["name"])
        return made

    p.core.create_namespaced_pod = create_then_lose  # type: ignore[method-assign]
    with pytest.raises(PodDeleted):
        p.start("run-1")
    assert not double.pods


def test_P3_orphans_are_the_runs_pods_another_runner_started(double: ApiDouble) -> None:
    """By label and annotation: another provider's running pod for the run is an orphan (once);
    one's own pod is not; another run's pod is not; a pod that no longer runs is deleted."""
    mine, theirs = provider(double), provider(double)
    left = theirs.start("run-1", attempt="a1")
    evicted = theirs.start("run-1", attempt="a1")
    other = theirs.start("run-2", attempt="a1")
    own = mine.start("run-1", attempt="a2")
    double.evict(NS, evicted.pod)  # type: ignore[attr-defined]
    found = mine.orphans("run-1")
    assert [o.pod for o in found] == [left.pod]  # type: ignore[attr-defined]
    assert (NS, evicted.pod) not in double.pods  # type: ignore[attr-defined]
    assert mine.orphans("run-1") == []
    for box in (own, *found):
        mine.stop(box)
    theirs.stop(other)
    assert not double.pods


# -- RBAC: what it needs beyond pods get and pods/exec create -------------------------------


def _cycle(d: ApiDouble) -> None:
    """Everything the runner does with pods: start (create, watch), exec (get, exec),
    sweep (list), stop (delete)."""
    mine, theirs = provider(d, start_seconds=20.0), provider(d, start_seconds=20.0)
    left = theirs.start("run-1")
    [found] = mine.orphans("run-1")
    assert found.run("true", []).exit_code == 0
    mine.stop(found)
    assert left.pod not in {name for _, name in d.pods}  # type: ignore[attr-defined]


def test_P4_the_role_grants_exactly_what_the_provider_uses(double: ApiDouble) -> None:
    """With only NEEDS granted (deploy/rbac.yaml), the whole cycle runs."""
    assert frozenset(NEEDS) - {("pods", "get"), ("pods/exec", "create")} == {
        ("pods", "create"),
        ("pods", "list"),
        ("pods", "watch"),
        ("pods", "delete"),
    }
    double.faults.rbac = NEEDS
    _cycle(double)


@pytest.mark.parametrize("missing", sorted(NEEDS))
def test_P4_each_permission_is_needed_and_its_lack_is_named(
    double: ApiDouble, missing: tuple[str, str]
) -> None:
    """Take one permission away: the cycle stops with a named error, never a traceback."""
    double.faults.rbac = NEEDS - {missing}
    with pytest.raises(ScratchbankError):
        _cycle(double)


# -- kubectl parity: what kubectl can do against the double -----------------------------------


def kubectl(d: ApiDouble, *args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig", delete=False) as kc:
        kc.write(kubeconfig(d))
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


def kubeconfig(d: ApiDouble) -> str:
    return (
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: double, cluster: {{server: "{d.url}"}}}}]\n'
        "users: [{name: u, user: {token: t}}]\n"
        f"contexts: [{{name: c, context: {{cluster: double, user: u, namespace: {NS}}}}}]\n"
        "current-context: c\n"
    )


def test_P5_kubectl_sees_the_runs_pods_by_label_and_deletes_one(double: ApiDouble) -> None:
    """An operator's `kubectl get -l` lists what the provider labelled; `kubectl delete`
    removes it, and the provider's own delete after that is no error."""
    p = provider(double)
    box = p.start("run-1", attempt="a1")
    listed = kubectl(double, "get", "pods", "-l", f"{RUN_LABEL}=run-1", "-o", "name")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == [f"pod/{box.pod}"]  # type: ignore[attr-defined]
    assert kubectl(double, "get", "pods", "-l", f"{RUN_LABEL}=run-2", "-o", "name").stdout == ""
    done = kubectl(double, "delete", "pod", box.pod, "--wait=false")  # type: ignore[attr-defined]
    assert done.returncode == 0, done.stderr
    assert not double.pods
    p.stop(box)


# -- the story with the runner: park in one pod, resume in a new one ------------------------


def test_P6_a_run_parked_in_one_pod_resumes_in_a_new_pod_with_its_scratch_and_a_stale_one_is_refused(
    double: ApiDouble, tmp_path: Path
) -> None:
    """a1 runs to its gate in pod 1 and banks; a2 restores into pod 2 and finishes; both pods
    are deleted. A third run whose bank went stale (R2) is refused with no pod created."""
    timeline = InMemoryTimeline()
    queue = InProcessQueue(ack_wait=30.0)
    p = provider(double)
    runner = Runner(
        queue,
        InProcessLease(lapse=10.0),
        timeline,
        FilesystemBankStore(tmp_path / "banks"),
        p,
        ReferenceEngine(STORY, timeline),
        RunnerSettings("runner-a", timing=LeaseTiming(interval=1.0, lapse=10.0)),
        Verdicts(),
    )
    timeline.append("run-1", [RunStarted()])
    queue_resume(timeline, queue, "run-1", "a1")
    first = runner.run_once(5)
    assert first is not None and first.handled is Handled.RAN, first.detail
    pods_after_first = creates(double)
    queue_resume(timeline, queue, "run-1", "a2")
    second = runner.run_once(5)
    assert second is not None and second.handled is Handled.RAN, second.detail
    assert creates(double) == pods_after_first + 1 == 2 and not double.pods
    labels = [
        (m["metadata"]["labels"][RUN_LABEL], m["metadata"]["labels"][ATTEMPT_LABEL]) for m in double.created
    ]
    assert labels == [("run-1", "a1"), ("run-1", "a2")]  # a new pod per attempt, labelled by the runner
    records = timeline.read("run-1")
    assert any(isinstance(r, ScratchRestored) and r.restored for r in records)
    measured = [r for r in records if isinstance(r, NodeFinished) and r.node == "measure"]
    assert measured and measured[0].succeeded
    assert isinstance(records[-1], ScratchBanked) and records[-1].finished

    timeline.append("run-2", [RunStarted()])
    queue_resume(timeline, queue, "run-2", "a1")
    assert runner.run_once(5).handled is Handled.RAN  # type: ignore[union-attr]
    queue_resume(timeline, queue, "run-2", "a2")  # queued while the bank was current...
    timeline.append("run-2", [NodeFinished(node="late", succeeded=True, kind="agent", in_sandbox=True)])
    before, made = list(timeline.read("run-2")), creates(double)
    refused = runner.run_once(5)  # ...judged again under the lease: stale now (R2)
    assert refused is not None and refused.handled is Handled.REFUSED, refused.detail
    assert refused.decision is not None and refused.decision.rule == "R2"
    assert creates(double) == made and not double.pods
    after = list(timeline.read("run-2"))
    assert after[: len(before)] == before  # only the lease's token and the refusal were written
    assert [type(r).__name__ for r in after[len(before) :]] == ["LeaseTaken", "ResumeRefused"]


# -- a runner killed mid-teardown: taken over through the lease, its pod swept ---------------

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


@pytest.mark.postgres
@pytest.mark.s3
def test_P7_a_runner_killed_mid_teardown_is_taken_over_and_its_pod_swept(
    double: ApiDouble,
    tmp_path: Path,
    nats_url: str,  # noqa: F811 - the fixture
    postgres_url: str,
    s3_endpoint: str,
) -> None:
    """Runner processes configured by settings only (NATS, PostgreSQL, S3, pods through the
    double). Runner a is SIGKILLed while its teardown's bank exec is in flight; after its
    lease lapses runner b banks a's pod, deletes it, parks the run again; a2 resumes in a
    new pod with the clone and finishes; no pod is left."""
    import signal
    import sys

    from scratchbank.adapters.event_store import EventStoreTimeline
    from scratchbank.adapters.nats_queue import NatsConnection, NatsDeliveryQueue
    from scratchbank.domain.records import AttemptClaimed, RunStatus, RunStatusChanged

    ns = namespace()
    env = runner_env(
        double,
        tmp_path,
        nats=nats_url,
        ns=ns,
        postgres=postgres_url,
        s3=s3_endpoint,
        bucket=_bucket(s3_endpoint),
    )
    procs: list[subprocess.Popen[bytes]] = []

    def runner(holder: str) -> subprocess.Popen[bytes]:
        log = tmp_path / f"{holder}.log"
        more = {"SCRATCHBANK_RUNNER_NAME": holder, "SCRATCHBANK_RUNNER_LOG": str(log)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "scratchbank.adapters.runner_process"], env={**env, **more}
        )
        procs.append(proc)
        _until(lambda: log.exists() and '"ready"' in log.read_text(), f"runner {holder} ready")
        return proc

    conn = NatsConnection(nats_url)
    timeline = EventStoreTimeline(postgres_url)
    queue = NatsDeliveryQueue(conn, ack_wait=3.0, namespace=ns)
    run = f"run-{ns[-8:]}"

    def parks() -> int:
        recs = timeline.read(run)
        paused = [r for r in recs if isinstance(r, RunStatusChanged) and r.status is RunStatus.PAUSED]
        return len(paused) if recs and isinstance(recs[-1], ScratchBanked) else 0

    try:
        timeline.append(run, [RunStarted()])
        a = runner("a")
        double.faults.hold_exec = "scratchbank-bank:"  # the teardown's one bank exec
        queue_resume(timeline, queue, run, "a1")
        _until(double.faults.held.is_set, "a's teardown reaches its bank exec")
        a.kill()
        a.wait(10)
        double.faults.release.set()  # the exec a left is dropped with it
        [(_, left)] = list(double.pods)
        assert not [r for r in timeline.read(run) if isinstance(r, ScratchBanked)]
        runner("b")
        _until(lambda: parks() >= 2, "b banks the pod a left, runs a1 again and parks the run")
        assert (NS, left) not in double.pods  # swept, through the lease
        queue_resume(timeline, queue, run, "a2")
        finished = RunStatusChanged(status=RunStatus.FINISHED)
        _until(
            lambda: finished in timeline.read(run) and isinstance(timeline.read(run)[-1], ScratchBanked),
            "a2 ends",
        )
        recs = timeline.read(run)
        assert [r.attempt for r in recs if isinstance(r, AttemptClaimed)] == ["a1", "a1", "a2"]
        assert any(isinstance(r, ScratchRestored) and r.restored for r in recs)
        banked = [r for r in recs if isinstance(r, ScratchBanked)]
        assert banked[0].banked  # b banked what a left (the clone was in it)
        measured = [r for r in recs if isinstance(r, NodeFinished) and r.node == "measure"]
        assert measured and measured[0].succeeded
        _until(lambda: not double.pods, "every pod deleted")
        assert creates(double) == 3  # a1 by a, a1 again by b, a2 by b
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        conn.close()
        timeline.close()


def test_P8_every_api_call_has_a_deadline(double: ApiDouble) -> None:
    """An API server that stops answering reads: the watch, the list and the pod read each
    end by name at their deadline, never hang; nothing is left behind."""
    p = KubernetesSandboxProvider(
        api(double), namespace=NS, template=TEMPLATE, scratch=SCRATCH, request_seconds=1.0, start_seconds=2.0
    )
    box = provider(double).start("run-1")  # a start that may take its time on a loaded machine
    double.faults.stall_api = 10.0
    with pytest.raises(PodStartTimeout):
        p.start("run-2")  # created, then the watch answers nothing
    with pytest.raises(SandboxGone):
        KubernetesSandboxProvider(
            api(double), namespace=NS, template=TEMPLATE, scratch=SCRATCH, request_seconds=1.0
        ).orphans("run-1")
    with pytest.raises(ExecFailed):
        KubernetesSandbox(box.pod, namespace=NS, api_client=api(double), request_seconds=1.0)  # type: ignore[attr-defined]
    double.faults.stall_api = 0.0
    p.stop(box)
    assert not double.pods
