"""Rules P: deploying: the runner, its settings, its image and its Kubernetes pods (ADR 0012). The
engines tier's tests of P1, P2, P3, P4, P5, P6, P7, P8, P9, P10, P11, P12 (tests/tiers.py: a file of
tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from engines import EXERCISED
from k8s_double import ApiDouble, running_double
from nats_server import namespace, nats_url  # noqa: F401 - a fixture
from rigs import k8s_provider
from rigs.image import (
    _run_in_image,
    _stop,
    _story,
    _until,
    image,  # noqa: F401 - a fixture
    services,  # noqa: F401 - a fixture
)
from rigs.k8s_provider import (
    NS,
    SCRATCH,
    TEMPLATE,
    WORKFLOW,
    _bucket,
    _cycle,
    api,
    creates,
    double,  # noqa: F401 - a fixture
    kubeconfig,
    kubectl,
    provider,
    runner_env,
)
from rigs.runner_env import env  # noqa: F401 - a fixture
from runner_rigs import STORY, queue_resume
from waiting import eventually

from scratchbank.adapters.config import settings_from
from scratchbank.adapters.event_store import EventStoreTimeline
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
from scratchbank.adapters.nats_queue import NatsDeliveryQueue
from scratchbank.adapters.reference_engine import ReferenceEngine
from scratchbank.adapters.runner_process import configure, parse
from scratchbank.adapters.runner_settings import runner_config
from scratchbank.adapters.scripted import Exec
from scratchbank.application.runner import Handled, Runner, RunnerSettings, Verdicts
from scratchbank.domain.errors import (
    ConfigInvalid,
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

# ---- from tests/rules/test_P_engines.py: The one image (Dockerfile, scripts/image.sh) runs the story (issue 23, item 3): the runner inside it, configured by environment only, on NATS + PostgreSQL + S3, driving Docker sandboxes, then pods through the API double.


@pytest.mark.docker
@pytest.mark.postgres
@pytest.mark.s3
def test_P12_the_runner_in_the_image_drives_docker_sandboxes(
    image: str, services: tuple[str, NatsDeliveryQueue, EventStoreTimeline, dict[str, str]], tmp_path: Path
) -> None:
    """Non-root in the image, the Docker socket lent by group; containers from the busybox image.
    Proves ``scratchbank.domain.records.RunStarted``."""
    ns, queue, timeline, env = services
    (tmp_path / "workflow.json").write_text(json.dumps(WORKFLOW))
    env = {
        **env,
        "SCRATCHBANK_SANDBOX_PROVIDER": "docker",
        "SCRATCHBANK_SANDBOX_IMAGE": "scratchbank-busybox:test",
    }
    sock = "/var/run/docker.sock"
    gid = str(os.stat(sock).st_gid)
    runner = _run_in_image(image, env, tmp_path, "-v", f"{sock}:{sock}", "--group-add", gid)
    run = f"run-{ns[-8:]}"
    try:
        _story(run, queue, timeline, runner)

        def none_left() -> bool:
            left = subprocess.run(
                ["docker", "ps", "-aq", "--filter", f"label=scratchbank.run={run}"],
                capture_output=True,
                text=True,
                check=True,
            )
            return left.stdout.strip() == ""

        _until(none_left, "the run's containers removed after their teardown banked")
        assert (
            "10001"
            in subprocess.run(
                [
                    "docker",
                    "exec",
                    runner,
                    "/opt/scratchbank/bin/python",
                    "-c",
                    "import os; print(os.getuid())",
                ],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
        )
    finally:
        _stop(runner)
    EXERCISED.add("image")


@pytest.mark.docker
@pytest.mark.postgres
@pytest.mark.s3
def test_P12_the_runner_in_the_image_drives_pods_through_the_double(
    image: str, services: tuple[str, NatsDeliveryQueue, EventStoreTimeline, dict[str, str]], tmp_path: Path
) -> None:
    """The same image, SCRATCHBANK_SANDBOX_PROVIDER=kubernetes: two pods, both deleted.
    Proves ``scratchbank.adapters.local_sandbox.LocalSandbox.destroy``."""
    ns, queue, timeline, env = services
    with running_double() as double:
        (tmp_path / "workflow.json").write_text(json.dumps(WORKFLOW))
        (tmp_path / "pod.json").write_text(json.dumps(TEMPLATE))
        (tmp_path / "kubeconfig").write_text(kubeconfig(double))
        env = {
            **env,
            "SCRATCHBANK_SANDBOX_PROVIDER": "kubernetes",
            "SCRATCHBANK_POD_TEMPLATE": "/etc/scratchbank/pod.json",
            "SCRATCHBANK_POD_NAMESPACE": NS,
            "KUBECONFIG": "/etc/scratchbank/kubeconfig",
        }
        runner = _run_in_image(image, env, tmp_path)
        try:
            _story(f"run-{ns[-8:]}", queue, timeline, runner)
            _until(lambda: not double.pods, "every pod deleted")
            assert creates(double) == 2
        finally:
            _stop(runner)
    EXERCISED.add("image")


# ---- from tests/rules/test_P_engines.py: The Kubernetes sandbox provider against the API server double (issue 23): a pod per run attempt from the operator's template, watched until it runs, named start failures, labels, deletion, the sweep of a dead runner's pod through the lease, the RBAC it needs, and the whole story with the runner.


@pytest.mark.docker
def test_P1_a_pod_per_attempt_from_the_template_labelled_with_run_and_attempt_then_deleted(
    double: ApiDouble,
) -> None:
    """The template's fields are kept; run and attempt are labels (hashed past 63 characters)
    and annotations; restartPolicy Never; the container runs commands; stop deletes the pod.
    Proves ``scratchbank.adapters.k8s_provider.label_value``."""
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


@pytest.mark.docker
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
    and the pod is deleted (nothing left behind).
    Proves ``scratchbank.adapters.k8s_provider.KubernetesSandboxProvider``."""
    double.faults.pod_start = fault
    with pytest.raises(error):
        provider(double, start_seconds=1.0).start("run-1", attempt="a1")
    assert creates(double) == 1 and not double.pods


@pytest.mark.docker
def test_P2_an_image_the_node_cannot_pull_is_named(double: ApiDouble) -> None:
    """No fault set: the kubelet cannot find the template's image (the double pulls nothing).
    Proves ``scratchbank.adapters.k8s_provider.KubernetesSandboxProvider``."""
    template = {**TEMPLATE, "spec": {"containers": [{"name": "sandbox", "image": "nope/missing:1"}]}}
    with pytest.raises(PodImagePull):
        provider(double, template).start("run-1")
    assert not double.pods


@pytest.mark.docker
def test_P2_a_pod_deleted_while_it_starts_is_named(double: ApiDouble) -> None:
    """Someone deletes the pod before it runs: the watch's DELETED ends the start by name.
    Proves ``scratchbank.adapters.k8s_provider.KubernetesSandboxProvider``."""
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


@pytest.mark.docker
def test_P2_a_pod_deleted_before_its_watch_began_is_named(double: ApiDouble) -> None:
    """The pod is gone between its create and the first watch (whose list is then empty, so no
    DELETED ever comes): the start reads the pod between watch windows and names it.
    Proves ``scratchbank.adapters.k8s_provider.KubernetesSandboxProvider``."""
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


@pytest.mark.docker
def test_P3_orphans_are_the_runs_pods_another_runner_started(double: ApiDouble) -> None:
    """By label and annotation: another provider's running pod for the run is an orphan (once);
    one's own pod is not; another run's pod is not; a pod that no longer runs is deleted.
    Proves ``scratchbank.adapters.k8s_provider.KubernetesSandboxProvider``."""
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


@pytest.mark.docker
def test_P4_the_role_grants_exactly_what_the_provider_uses(double: ApiDouble) -> None:
    """With only NEEDS granted (deploy/rbac.yaml), the whole cycle runs.
    Proves ``scratchbank.application.ports.SandboxProvider.orphans``."""
    assert frozenset(NEEDS) - {("pods", "get"), ("pods/exec", "create")} == {
        ("pods", "create"),
        ("pods", "list"),
        ("pods", "watch"),
        ("pods", "delete"),
    }
    double.faults.rbac = NEEDS
    _cycle(double)


@pytest.mark.docker
@pytest.mark.parametrize("missing", sorted(NEEDS))
def test_P4_each_permission_is_needed_and_its_lack_is_named(
    double: ApiDouble, missing: tuple[str, str]
) -> None:
    """Take one permission away: the cycle stops with a named error, never a traceback.
    Proves ``scratchbank.application.ports.SandboxProvider.orphans``."""
    double.faults.rbac = NEEDS - {missing}
    with pytest.raises(ScratchbankError):
        _cycle(double)


@pytest.mark.docker
def test_P4_a_pod_whose_start_is_refused_leaves_no_container_once_the_double_ends(docker_url: str) -> None:
    """The start stops at the missing watch permission just after the pod was created (and
    deletes it), while the double's kubelet still starts its container: once the double has
    ended, no container it started is left (one was left running by every suite run, before
    the kubelet removed a container whose pod went while it started, and the double's end
    waited for its kubelets). Proves ``scratchbank.adapters.k8s_provider.KubernetesSandboxProvider``."""
    with running_double() as d:
        d.faults.rbac = NEEDS - {("pods", "watch")}
        with pytest.raises(ScratchbankError):
            provider(d).start("run-1")
    assert d.created and d.containers, "the kubelet never started the pod's container"
    left = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc", *(f"--filter=id={c}" for c in d.containers)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert left.stdout.strip() == "", f"the double left its containers {left.stdout.split()}"


@pytest.mark.docker
def test_P5_kubectl_sees_the_runs_pods_by_label_and_deletes_one(double: ApiDouble) -> None:
    """An operator's `kubectl get -l` lists what the provider labelled; `kubectl delete`
    removes it, and the provider's own delete after that is no error.
    Proves ``scratchbank.adapters.k8s_provider.KubernetesSandboxProvider``."""
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


@pytest.mark.docker
def test_P6_a_run_parked_in_one_pod_resumes_in_a_new_pod_with_its_scratch_and_a_stale_one_is_refused(
    double: ApiDouble, tmp_path: Path
) -> None:
    """a1 runs to its gate in pod 1 and banks; a2 restores into pod 2 and finishes; both pods
    are deleted. A third run whose bank went stale (R2) is refused with no pod created.
    Proves ``scratchbank.adapters.inprocess.InProcessQueue``."""
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


@pytest.mark.docker
@pytest.mark.postgres
@pytest.mark.s3
def test_P7_a_runner_killed_mid_teardown_is_taken_over_and_its_pod_swept(
    double: ApiDouble,
    tmp_path: Path,
    nats_url: str,
    postgres_url: str,
    s3_endpoint: str,
) -> None:
    """Runner processes configured by settings only (NATS, PostgreSQL, S3, pods through the
    double). Runner a is SIGKILLed while its teardown's bank exec is in flight; after its
    lease lapses runner b banks a's pod, deletes it, parks the run again; a2 resumes in a
    new pod with the clone and finishes; no pod is left.
    Proves ``scratchbank.adapters.nats_queue.NatsConnection``."""
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
        k8s_provider._until(lambda: log.exists() and '"ready"' in log.read_text(), f"runner {holder} ready")
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
        k8s_provider._until(double.faults.held.is_set, "a's teardown reaches its bank exec")
        a.kill()
        a.wait(10)
        double.faults.release.set()  # the exec a left is dropped with it
        [(_, left)] = list(double.pods)
        assert not [r for r in timeline.read(run) if isinstance(r, ScratchBanked)]
        runner("b")
        k8s_provider._until(lambda: parks() >= 2, "b banks the pod a left, runs a1 again and parks the run")
        assert (NS, left) not in double.pods  # swept, through the lease
        queue_resume(timeline, queue, run, "a2")
        finished = RunStatusChanged(status=RunStatus.FINISHED)
        k8s_provider._until(
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
        k8s_provider._until(lambda: not double.pods, "every pod deleted")
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


@pytest.mark.docker
def test_P8_every_api_call_has_a_deadline(double: ApiDouble) -> None:
    """An API server that stops answering reads: the watch, the list, the pod read and the exec
    handshake each
    end by name at their deadline, never hang, and each is asked once (urllib3's own retries
    would make a 1 s deadline a 4 s wait); nothing is left behind.
    Proves ``scratchbank.adapters.k8s_sandbox.tried_once``."""
    p = KubernetesSandboxProvider(
        api(double), namespace=NS, template=TEMPLATE, scratch=SCRATCH, request_seconds=1.0, start_seconds=2.0
    )
    box = provider(double).start("run-1")  # a start that may take its time on a loaded machine
    near = KubernetesSandbox(box.pod, namespace=NS, api_client=api(double), request_seconds=1.0)  # type: ignore[attr-defined]
    pods = f"GET /api/v1/namespaces/{NS}/pods"
    double.faults.stall_api = 10.0
    with pytest.raises(ExecFailed):  # found by attack: the exec handshake had no deadline at all
        near.execute(Exec("true"))
    double.log.clear()
    with pytest.raises(PodStartTimeout):
        p.start("run-2")  # created, then the watch answers nothing
    assert double.log.count(pods) == 1, double.log  # one watch window, asked once
    double.log.clear()
    with pytest.raises(SandboxGone):
        KubernetesSandboxProvider(
            api(double), namespace=NS, template=TEMPLATE, scratch=SCRATCH, request_seconds=1.0
        ).orphans("run-1")
    assert double.log == [pods]
    double.log.clear()
    with pytest.raises(ExecFailed):
        KubernetesSandbox(box.pod, namespace=NS, api_client=api(double), request_seconds=1.0)  # type: ignore[attr-defined]
    assert double.log == [f"{pods}/{box.pod}"]  # type: ignore[attr-defined]
    double.faults.stall_api = 0.0
    p.stop(box)
    assert not double.pods


# ---- from tests/rules/test_P_engines.py: The runner configured by settings only (issue 23, item 2): the same timeline, bank store and queue as `scratchbank serve` and `scratchbank mcp` read, plus the runner's own; every bad value a named error naming its variable.


def test_P9_the_runner_reads_the_surfaces_settings_and_its_own(env: dict[str, str]) -> None:
    """Timeline, bank and queue are exactly what serve/mcp read from the same environment.
    Proves ``scratchbank.adapters.runner_settings.runner_config``."""
    cfg = runner_config(env)
    assert cfg.settings == settings_from(env)
    assert (cfg.provider, cfg.pod_namespace, cfg.holder) == ("kubernetes", "runs", "runner-7")
    assert cfg.pod_template is not None and cfg.pod_template["spec"]["containers"][0]["name"] == "sandbox"
    assert "secret" not in cfg.describe()  # the password never shows


def test_P9_flags_win_over_the_environment(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's flags (for a person at a shell) override the environment (a Deployment).
    Proves ``scratchbank.adapters.runner_process.configure``."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = configure(parse(["--holder", "h2", "--bank", "file:///tmp/banks", "--lapse", "9"]))
    assert (cfg.holder, cfg.settings.bank_url, cfg.lapse) == ("h2", "file:///tmp/banks", 9.0)
    assert cfg.settings.timeline_url == env["SCRATCHBANK_TIMELINE"]


@pytest.mark.parametrize(
    ("var", "value", "named"),
    [
        ("SCRATCHBANK_QUEUE", "", "SCRATCHBANK_QUEUE"),
        ("SCRATCHBANK_QUEUE", "http://x", "queue URL"),
        ("SCRATCHBANK_SANDBOX_PROVIDER", "lambda", "SCRATCHBANK_SANDBOX_PROVIDER"),
        ("SCRATCHBANK_POD_TEMPLATE", "", "SCRATCHBANK_POD_TEMPLATE"),
        ("SCRATCHBANK_POD_TEMPLATE", "/nonexistent/pod.yaml", "SCRATCHBANK_POD_TEMPLATE"),
        ("SCRATCHBANK_POD_CONTAINER", "nope", "no container 'nope'"),
        ("SCRATCHBANK_POD_START_SECONDS", "-1", "SCRATCHBANK_POD_START_SECONDS"),
        ("SCRATCHBANK_LEASE_LAPSE", "soon", "SCRATCHBANK_LEASE_LAPSE"),
        ("SCRATCHBANK_WORKFLOW", "/nonexistent.json", "SCRATCHBANK_WORKFLOW"),
    ],
)
def test_P10_every_bad_setting_is_named(env: dict[str, str], var: str, value: str, named: str) -> None:
    """ConfigInvalid naming the variable (or the form it takes), before anything is opened."""
    env[var] = value
    with pytest.raises(ConfigInvalid, match=named):
        runner_config(env)


def test_P10_a_template_that_is_not_a_pod_is_named(env: dict[str, str], tmp_path: Path) -> None:
    """A Deployment, a list, or YAML that does not parse: each ConfigInvalid."""
    for text in ("kind: Deployment\nspec: {containers: [{name: a}]}\n", "- a\n- b\n", "a: [b\n"):
        (tmp_path / "pod.yaml").write_text(text)
        env["SCRATCHBANK_POD_TEMPLATE"] = str(tmp_path / "pod.yaml")
        with pytest.raises(ConfigInvalid, match=r"SCRATCHBANK_POD_TEMPLATE|not a Pod"):
            runner_config(env)


def test_P11_docker_and_local_providers_by_settings(env: dict[str, str], tmp_path: Path) -> None:
    """docker needs its image (and takes the engine's URL); local needs a folder.
    Proves ``scratchbank.adapters.runner_settings.runner_config``."""
    env["SCRATCHBANK_SANDBOX_PROVIDER"] = "docker"
    with pytest.raises(ConfigInvalid, match="SCRATCHBANK_SANDBOX_IMAGE"):
        runner_config(env)
    env["SCRATCHBANK_SANDBOX_IMAGE"] = "sandbox:1"
    cfg = runner_config(env)
    assert (cfg.image, cfg.engine_url) == ("sandbox:1", "unix:///var/run/docker.sock")
    env["SCRATCHBANK_SANDBOX_PROVIDER"] = "local"
    env["SCRATCHBANK_SANDBOXES"] = str(tmp_path / "boxes")
    assert runner_config(env).sandboxes == tmp_path / "boxes"


def test_P10_the_runner_process_names_a_bad_setting_without_a_traceback(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 and one line naming the error; the password in a URL masked.
    Proves ``scratchbank.adapters.runner_process.main``."""
    from scratchbank.adapters.runner_process import main

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SCRATCHBANK_SANDBOX_PROVIDER", "lambda")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: CONFIG_INVALID:") and "Traceback" not in err and "secret" not in err
