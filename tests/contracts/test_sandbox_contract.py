"""The shipped contract suites and checkers, run against every adapter we ship: the
Sandbox contract on the fake, local, Docker, Podman and the Kubernetes double (T2, T4,
T14, T15, T19); ``check_bank_store`` on memory, filesystem and S3; ``check_timeline``
on memory and SQLite (PostgreSQL runs the class suite in test_timeline_stores)."""

from __future__ import annotations

import contextlib
import io
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from rigs.real_sandboxes import Rig, rig

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.fs_bank import FilesystemBankStore
from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.memory import FakeSandbox, InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.s3_bank import S3BankStore
from scratchbank.application.ports import QuiesceReport, Sandbox
from scratchbank.domain.errors import ArchiveFailed
from scratchbank.testing.contracts import SandboxContract, check_bank_store, check_timeline


class TestFakeSandboxContract(SandboxContract):
    @contextlib.contextmanager
    def sandbox(self) -> Iterator[Sandbox]:
        yield FakeSandbox({})

    def write(self, sandbox: Sandbox, files: dict[str, bytes]) -> None:
        assert isinstance(sandbox, FakeSandbox)
        sandbox.files = {**(sandbox.files or {}), **files}

    def kill(self, sandbox: Sandbox) -> None:
        assert isinstance(sandbox, FakeSandbox)
        sandbox.gone = True

    def stopped(self, sandbox: Sandbox) -> bool:
        assert isinstance(sandbox, FakeSandbox)
        return sandbox.stopped

    def unquiescable(self, sandbox: Sandbox) -> None:
        assert isinstance(sandbox, FakeSandbox)
        sandbox.quiesce_report = QuiesceReport(False, False, ("process 7 of another user",), 1)

    def refusing(self, sandbox: Sandbox) -> None:
        assert isinstance(sandbox, FakeSandbox)
        sandbox.quiesce_report = QuiesceReport(False, True, ("this is the host's initial PID namespace",))

    def break_scratch(self, sandbox: Sandbox) -> None:
        assert isinstance(sandbox, FakeSandbox)
        sandbox.faults["archive"] = [ArchiveFailed("cannot list the scratch")]


class RigContract(SandboxContract):
    """The contract on a real engine's sandbox (one fresh sandbox per clause)."""

    engine = ""
    rig: Rig

    @contextlib.contextmanager
    def sandbox(self) -> Iterator[Sandbox]:
        with rig(self.engine) as r:
            self.rig = r
            yield r.sandbox

    def start_workload(self, sandbox: Sandbox) -> None:
        self.rig.spawn("sleep 1000")
        self.rig.sh("while ! grep -qs '^sleep$' /proc/[0-9]*/comm; do sleep 0.05; done")

    def stopped(self, sandbox: Sandbox) -> bool:
        """Is any process but the one reading stopped (state T, after the last ") ")?"""
        out = self.rig.sh("cat /proc/[0-9]*/stat 2>/dev/null", check=False)
        return any(line.rsplit(") ", 1)[1].split()[0] == "T" for line in out.splitlines() if ") " in line)

    def unquiescable(self, sandbox: Sandbox) -> None:
        """A root workload the quiesce, run as nobody, can neither stop nor continue; the
        namespaced rigs (their commands run as root) hide other users' processes instead."""
        self.start_workload(sandbox)
        if self.engine in ("local", "k8s-double"):
            self.rig.sh("mount -o remount,hidepid=2 /proc")
        else:
            self.rig.sandbox.admin_user = "65534"

    def break_scratch(self, sandbox: Sandbox) -> None:
        """A scratch that is a file: tar cannot enter it (archive.sh's 12)."""
        self.rig.sh(f"rm -rf {self.rig.scratch} && echo x > {self.rig.scratch}")

    def write(self, sandbox: Sandbox, files: dict[str, bytes]) -> None:
        for name, data in files.items():
            folder = os.path.dirname(name) or "."
            script = f'mkdir -p "$1/{folder}" && cat > "$1/{name}"'
            done = sandbox.run(script, [sandbox.facts.scratch], stdin=io.BytesIO(data))  # type: ignore[attr-defined]
            assert done.exit_code == 0, done.err

    def kill(self, sandbox: Sandbox) -> None:
        if isinstance(sandbox, LocalSandbox):
            sandbox.destroy()
        elif hasattr(sandbox, "container_id"):
            sandbox.client.containers.get(sandbox.container_id).kill()  # type: ignore[attr-defined]
        else:
            pytest.skip("the Kubernetes double's pods are not deleted through the adapter")


class TestLocalSandboxContract(RigContract):
    engine = "local"


class TestDockerBusyboxSandboxContract(RigContract):
    engine = "docker-busybox"


class TestDockerGnuSandboxContract(RigContract):
    engine = "docker-gnu"


class TestPodmanBusyboxSandboxContract(RigContract):
    engine = "podman-busybox"


class TestKubernetesDoubleSandboxContract(RigContract):
    engine = "k8s-double"


def test_check_bank_store_memory(tmp_path: Path) -> None:
    assert len(check_bank_store(lambda _: InMemoryBankStore(), tmp_path)) >= 11


def test_check_bank_store_filesystem(tmp_path: Path) -> None:
    assert len(check_bank_store(lambda folder: FilesystemBankStore(folder / "banks"), tmp_path)) >= 11


def test_check_bank_store_s3(tmp_path: Path, s3_endpoint: str) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id="k",
        aws_secret_access_key="s",
        region_name="us-east-1",
    )

    def make(_: Path) -> S3BankStore:
        bucket = "contract-" + uuid.uuid4().hex[:10]
        client.create_bucket(Bucket=bucket)
        return S3BankStore(bucket, "team", client=client)

    assert len(check_bank_store(make, tmp_path)) >= 11


def test_check_timeline_memory_and_sqlite(tmp_path: Path) -> None:
    assert len(check_timeline(InMemoryTimeline)) >= 6
    urls = iter(f"sqlite:///{tmp_path}/t{i}.db" for i in range(100))
    assert len(check_timeline(lambda: EventStoreTimeline(next(urls)))) >= 6


def test_the_checkers_catch_a_store_that_breaks_the_contract(tmp_path: Path) -> None:
    """A store that answers an empty bank for a missing one is caught (never BankGone)."""

    class Lenient(InMemoryBankStore):
        def fetch(self, run_id, dest, *, max_bytes, name=None, deadline=None):  # type: ignore[no-untyped-def]
            if name is None and run_id not in self.banks:
                self.banks[run_id] = b""
            return super().fetch(run_id, dest, max_bytes=max_bytes, name=name, deadline=deadline)

    with pytest.raises(pytest.fail.Exception, match=r"DID NOT RAISE .*BankGone"):
        check_bank_store(lambda _: Lenient(), tmp_path)


del docker  # imported for the rigs' engines (skips cleanly when a service is missing)
