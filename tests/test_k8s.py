"""The Kubernetes adapter against the API double: transport faults, typed results, the
v4 fallback, kubectl parity, and banking/restoring end to end through a pod.

An opt-in suite runs against a real cluster when SCRATCHBANK_K8S_KUBECONFIG names a
kubeconfig (never in CI): see test_k8s_real.py.
"""

from __future__ import annotations

import io
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from k8s_double import ApiDouble, running_double
from kubernetes import client as k8s
from rigs.k8s_provider import kubectl as rig_kubectl

from scratchbank.adapters.k8s_sandbox import KubernetesSandbox, read_status
from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.application.resume import resume
from scratchbank.application.teardown import bank_at_teardown
from scratchbank.domain import ResumeRequest
from scratchbank.domain.errors import ExecFailed, SandboxGone, StreamBroken
from scratchbank.testing.builders import started


@pytest.fixture
def double() -> Iterator[ApiDouble]:
    with running_double() as d:
        d.add_pod("ns1", "p1")
        yield d


def adapter(d: ApiDouble, pod: str = "p1", token: str | None = None) -> KubernetesSandbox:
    config = k8s.Configuration()
    config.host = d.url
    if token:
        config.api_key = {"authorization": f"Bearer {token}"}
    scratch = d.pods[("ns1", pod)].sandbox.facts.scratch if ("ns1", pod) in d.pods else "/tmp/x"
    return KubernetesSandbox(pod, namespace="ns1", scratch=scratch, api_client=k8s.ApiClient(config))


def test_exit_codes_and_signals_are_typed(double: ApiDouble) -> None:
    sb = adapter(double)
    assert sb.run("exit 0", []).exit_code == 0
    done = sb.run("echo out; echo err >&2; exit 7", [])
    assert (done.exit_code, done.stdout, done.stderr) == (7, b"out\n", b"err\n")
    assert sb.run("kill -9 $$", []).exit_code == 137
    assert sb.protocol == "v5.channel.k8s.io"


def test_stdin_eof_and_50_mb_both_ways_with_digests(double: ApiDouble) -> None:
    import hashlib

    sb = adapter(double)
    data = bytes(range(256)) * (50 * 4096)
    done = sb.run("sha256sum | cut -d' ' -f1", [], stdin=io.BytesIO(data))
    assert done.stdout.decode().strip() == hashlib.sha256(data).hexdigest()
    out = io.BytesIO()
    assert sb.run("head -c 52428800 /dev/zero", [], stdout=out).exit_code == 0
    assert hashlib.sha256(out.getvalue()).hexdigest() == hashlib.sha256(bytes(50 << 20)).hexdigest()


def test_a_missing_pod_is_gone_and_bad_credentials_are_forbidden(double: ApiDouble) -> None:
    with pytest.raises(SandboxGone):
        adapter(double, pod="nope")
    sb = adapter(double)
    double.pods.pop(("ns1", "p1")).sandbox.destroy()
    with pytest.raises(SandboxGone):
        sb.run("true", [])
    double.add_pod("ns1", "p2")
    double.faults.token = "s3cret"
    with pytest.raises(ExecFailed):
        adapter(double, pod="p2", token="wrong")
    assert adapter(double, pod="p2", token="s3cret").run("exit 3", []).exit_code == 3


def test_a_stream_closed_without_status_is_not_success(double: ApiDouble) -> None:
    sb = adapter(double)
    double.faults.close_without_status = True
    with pytest.raises(StreamBroken, match="without a status"):
        sb.run("echo fine", [])


def test_a_stream_dropped_mid_archive_is_broken(double: ApiDouble) -> None:
    sb = adapter(double)
    double.faults.drop_after_bytes = 1000
    with pytest.raises(StreamBroken):
        sb.run("head -c 100000 /dev/zero", [], stdout=io.BytesIO())


def test_an_internal_error_fails_the_exec_by_name(double: ApiDouble) -> None:
    sb = adapter(double)
    double.faults.internal_error = True
    with pytest.raises(ExecFailed, match="500"):
        sb.run("true", [])


def test_v4_only_servers_still_restore_because_stdin_is_framed_by_count(double: ApiDouble) -> None:
    """v4 cannot close stdin: the restore script reads exactly SIZE bytes and never waits."""
    double.faults.v4_only = True
    double.faults.slow_reader = 0.001
    sb = adapter(double)
    pod = double.pods[("ns1", "p1")].sandbox
    Path(pod.facts.scratch).mkdir(parents=True)
    Path(pod.facts.scratch, "f").write_text("data")
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-1", [started()])
    report = bank_at_teardown("run-1", timeline=timeline, store=store, sandbox=sb, run_finished=False)
    assert report.record.banked and not report.record.unquiesced
    Path(pod.facts.scratch, "f").unlink()
    out = resume("run-1", ResumeRequest(), timeline=timeline, store=store, sandbox=sb)
    assert out.proceeds and Path(pod.facts.scratch, "f").read_text() == "data"
    assert sb.protocol == "v4.channel.k8s.io"


def test_pod_facts_read_share_process_namespace(double: ApiDouble) -> None:
    double.add_pod("ns1", "shared", share_process_namespace=True)
    facts = adapter(double, pod="shared").facts
    assert facts.process_isolated and "pause" in facts.isolation


def test_the_request_log_shows_the_pod_read_then_exec(double: ApiDouble) -> None:
    adapter(double).run("true", [])
    assert double.log[-2:] == [
        "GET /api/v1/namespaces/ns1/pods/p1",
        "GET /api/v1/namespaces/ns1/pods/p1/exec",
    ]


def test_status_parsing() -> None:
    assert read_status(b'{"status": "Success"}').exit_code == 0
    fail = b'{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"42"}]}}'
    assert read_status(fail).exit_code == 42
    assert read_status(b'{"status":"Failure","reason":"InternalError","message":"boom"}').exit_code is None
    assert read_status(b"not json").exit_code is None


# -- parity with kubectl ---------------------------------------------------------------------


def kubectl(d: ApiDouble, *args: str) -> subprocess.CompletedProcess[str]:
    return rig_kubectl(d, *args, ns="ns1")


@pytest.mark.parametrize("code", [0, 7, 137])
def test_kubectl_and_the_adapter_agree_on_exit_codes(double: ApiDouble, code: int) -> None:
    command = "kill -9 $$" if code == 137 else f"echo out; echo err >&2; exit {code}"
    done = kubectl(double, "exec", "p1", "--", "sh", "-c", command)
    assert done.returncode == code
    if code:
        assert done.stderr.endswith(f"command terminated with exit code {code}\n")
    assert adapter(double).run(command, []).exit_code == code


def test_kubectl_exits_0_on_a_stream_without_status_where_the_adapter_refuses(double: ApiDouble) -> None:
    """Why the adapter never trusts a missing status: kubectl reports success there."""
    double.faults.close_without_status = True
    assert kubectl(double, "exec", "p1", "--", "sh", "-c", "exit 5").returncode == 0
    with pytest.raises(StreamBroken):
        adapter(double).run("exit 5", [])
