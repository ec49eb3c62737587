"""Helpers and fixtures of the tests first written in tests/rules/test_P_engines.py (The one image (Dockerfile,
scripts/image.sh) runs the story (issue 23, item 3): the runner inside it, configured by environment
only, on NATS + PostgreSQL + S3, driving Docker sandboxes, then pods through the API double.),
shared by the rule tests filed by family in tests/rules/ and by the tests that stayed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from nats_server import namespace, nats_url  # noqa: F401 - a fixture
from runner_rigs import queue_resume
from waiting import eventually

from rigs.k8s_provider import _bucket
from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.nats_queue import NatsConnection, NatsDeliveryQueue
from scratchbank.domain.records import (
    NodeFinished,
    RunStarted,
    RunStatus,
    RunStatusChanged,
    ScratchBanked,
    ScratchRestored,
)

ROOT = Path(__file__).resolve().parents[2]


WAIT = 180.0


def _digest() -> str:
    h = hashlib.sha256()
    for part in ("pyproject.toml", "Dockerfile", "domain", "application", "adapters", "src"):
        for path in sorted((ROOT / part).rglob("*")) if (ROOT / part).is_dir() else [ROOT / part]:
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


@pytest.fixture(scope="session")
def image(docker_url: str) -> str:
    tag = f"scratchbank:test-{_digest()}"
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False).returncode == 0:
        return tag
    if os.environ.get("CI") != "true" and os.environ.get("SCRATCHBANK_BUILD_IMAGE") != "1":
        pytest.skip(f"no image {tag}: build it with scripts/image.sh {tag} (or SCRATCHBANK_BUILD_IMAGE=1)")
    started = time.monotonic()
    done = subprocess.run(
        [str(ROOT / "scripts" / "image.sh"), tag], capture_output=True, text=True, timeout=1500, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"\nimage {tag} built in {time.monotonic() - started:.0f} s: {done.stderr.strip()[-200:]}")
    return tag


def _until(pred: Callable[[], bool], what: str) -> None:
    eventually(pred, timeout=WAIT, what=what, interval=0.2)


@pytest.fixture
def services(
    nats_url: str,
    postgres_url: str,
    s3_endpoint: str,
) -> Iterator[tuple[str, NatsDeliveryQueue, EventStoreTimeline, dict[str, str]]]:
    ns = namespace()
    conn = NatsConnection(nats_url)
    timeline = EventStoreTimeline(postgres_url)
    env = {
        "SCRATCHBANK_QUEUE": nats_url,
        "SCRATCHBANK_QUEUE_NAMESPACE": ns,
        "SCRATCHBANK_TIMELINE": postgres_url,
        "SCRATCHBANK_BANK": f"s3://{_bucket(s3_endpoint)}/runs",
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "t",
        "AWS_SECRET_ACCESS_KEY": "t",
        "AWS_DEFAULT_REGION": "us-east-1",
        "SCRATCHBANK_WORKFLOW": "/etc/scratchbank/workflow.json",
        "SCRATCHBANK_SCRATCH": "/tmp/scratchbank-scratch",
        "SCRATCHBANK_LEASE_INTERVAL": "1",
        "SCRATCHBANK_LEASE_LAPSE": "10",
        "SCRATCHBANK_ACK_WAIT": "30",
    }
    try:
        yield ns, NatsDeliveryQueue(conn, ack_wait=30.0, namespace=ns), timeline, env
    finally:
        conn.close()
        timeline.close()


def _run_in_image(image: str, env: dict[str, str], files: Path, *extra: str) -> str:
    """The runner in the image: read-only root, non-root, host network (the services listen
    on loopback), its settings in the environment, its files mounted."""
    name = f"sb-runner-{uuid.uuid4().hex[:8]}"
    files.chmod(0o755)  # the image's user (10001) reads them
    for path in files.iterdir():
        path.chmod(0o644)
    argv = ["docker", "run", "-d", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp"]
    argv += ["-v", f"{files}:/etc/scratchbank:ro", *extra]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    argv += [
        "--entrypoint",
        "/opt/scratchbank/bin/python",
        image,
        "-m",
        "scratchbank.adapters.runner_process",
    ]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return name


def _logs(name: str) -> str:
    done = subprocess.run(["docker", "logs", name], capture_output=True, text=True, timeout=60, check=False)
    return done.stdout + done.stderr


def _story(run: str, queue: NatsDeliveryQueue, timeline: EventStoreTimeline, runner: str) -> None:
    """Queued, parked at its gate and banked; resumed with its scratch; finished."""
    _until(lambda: '"ready"' in _logs(runner), "the runner in the image is ready")
    timeline.append(run, [RunStarted()])
    queue_resume(timeline, queue, run, "a1")

    def parked() -> bool:
        recs = timeline.read(run)
        return (
            bool(recs)
            and isinstance(recs[-1], ScratchBanked)
            and any(isinstance(r, RunStatusChanged) and r.status is RunStatus.PAUSED for r in recs)
        )

    _until(parked, "a1 parks and banks")
    queue_resume(timeline, queue, run, "a2")
    finished = RunStatusChanged(status=RunStatus.FINISHED)
    _until(
        lambda: finished in timeline.read(run) and isinstance(timeline.read(run)[-1], ScratchBanked),
        "a2 finishes",
    )
    recs = timeline.read(run)
    assert any(isinstance(r, ScratchRestored) and r.restored for r in recs)
    assert [r.succeeded for r in recs if isinstance(r, NodeFinished) and r.node == "measure"] == [True]


def _stop(name: str) -> None:
    print(f"\n--- {name}:\n{_logs(name)[-3000:]}")  # shown when the test fails
    subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60, check=False)
