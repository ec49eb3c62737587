"""The whole story on the services a deployment has: NATS JetStream deliveries and leases,
a PostgreSQL timeline, banks in S3, Docker sandboxes (Podman too), the reference engine."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import boto3
import pytest
from engines import EXERCISED
from nats_server import namespace, nats_url  # noqa: F401 - a fixture
from runner_rigs import queue_resume

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.nats_queue import NatsConnection, NatsDeliveryQueue, NatsKvLease
from scratchbank.adapters.reference_engine import Node, ReferenceEngine
from scratchbank.adapters.s3_bank import S3BankStore
from scratchbank.adapters.sandbox_provider import ContainerSandboxProvider
from scratchbank.application.runner import Handled, Runner, RunnerSettings, Verdicts
from scratchbank.domain.lease import LeaseTiming
from scratchbank.domain.records import NodeFinished, RunStarted, ScratchBanked, ScratchRestored

pytestmark = [pytest.mark.postgres, pytest.mark.s3]

SCRATCH = "/tmp/iterion-scratch"
WORKFLOW = (
    Node("clone", "tool", "mkdir -p clone && echo 'a clone' > clone/README.md"),
    Node("review", "human"),
    Node("measure", "agent", "test -f clone/README.md && echo measured > measure.txt"),
)


def _bucket(endpoint: str) -> str:
    name = "sb-" + uuid.uuid4().hex[:12]
    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t"
    )
    client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def services(
    nats_url: str,
    postgres_url: str,
    s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[NatsConnection, EventStoreTimeline, S3BankStore]]:
    for var, value in (
        ("AWS_ACCESS_KEY_ID", "t"),
        ("AWS_SECRET_ACCESS_KEY", "t"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(var, value)
    conn = NatsConnection(nats_url)
    timeline = EventStoreTimeline(postgres_url)
    store = S3BankStore(_bucket(s3_endpoint), "runner", endpoint_url=s3_endpoint)
    try:
        yield conn, timeline, store
    finally:
        conn.close()
        timeline.close()


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_story_on_nats_postgres_s3_and_containers(
    services: tuple[NatsConnection, EventStoreTimeline, S3BankStore],
    engine: str,
    request: pytest.FixtureRequest,
) -> None:
    """Queued over JetStream, run to its gate in a container and banked to S3; resumed in a
    new container with the scratch restored; the run finishes."""
    conn, timeline, store = services
    url = request.getfixturevalue(f"{engine}_url")
    image = "scratchbank-busybox:test" if engine == "docker" else "localhost/scratchbank-busybox:test"
    provider = ContainerSandboxProvider(url, image, scratch=SCRATCH, podman=engine == "podman")
    ns = namespace()
    queue = NatsDeliveryQueue(conn, ack_wait=30.0, namespace=ns)
    runner = Runner(
        queue,
        NatsKvLease(conn, lapse=10.0, namespace=ns),
        timeline,
        store,
        provider,
        ReferenceEngine(WORKFLOW, timeline),
        RunnerSettings("runner-a", timing=LeaseTiming(interval=1.0, lapse=10.0)),
        Verdicts(),
    )
    run = f"run-{uuid.uuid4().hex[:10]}"
    timeline.append(run, [RunStarted()])
    queue_resume(timeline, queue, run, "a1")
    first = runner.run_once(10)
    assert first is not None and first.handled is Handled.RAN, first.detail
    assert first.teardown is not None and first.teardown.record.banked
    queue_resume(timeline, queue, run, "a2")
    second = runner.run_once(10)
    assert second is not None and second.handled is Handled.RAN, second.detail
    records = timeline.read(run)
    assert any(isinstance(r, ScratchRestored) and r.restored for r in records)
    measure = [r for r in records if isinstance(r, NodeFinished) and r.node == "measure"]
    assert measure and measure[0].succeeded
    assert isinstance(records[-1], ScratchBanked) and records[-1].finished
    assert not provider.client.containers.list(all=True, filters={"label": f"scratchbank.run={run}"})
    EXERCISED.add(engine)


def test_container_provider_finds_the_sandbox_a_lapsed_runner_left(docker_url: str) -> None:
    """Another runner's container for the run (by label) is an orphan; its own are not."""
    mine = ContainerSandboxProvider(docker_url, "scratchbank-busybox:test", scratch=SCRATCH)
    theirs = ContainerSandboxProvider(docker_url, "scratchbank-busybox:test", scratch=SCRATCH)
    run = f"run-{uuid.uuid4().hex[:10]}"
    left = theirs.start(run)
    own = mine.start(run)
    try:
        found = mine.orphans(run)
        assert [o.container_id for o in found] == [left.container_id]  # type: ignore[attr-defined]
        assert mine.orphans(run) == []  # taken over once
        assert mine.orphans(f"{run}-other") == []
    finally:
        mine.stop(own)
        theirs.stop(left)
    EXERCISED.add("docker")
