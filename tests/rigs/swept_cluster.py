"""A cluster of runner processes sweeping orphans on PostgreSQL and NATS, and what they did.

First written for tests/rules/test_L_engines.py: The outbox on real servers (issue #19): runner
processes sweep the runs the timeline lists as queued and unclaimed, one sweeper at a time, through
a NATS restart."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import attrs
import pytest
from nats_server import NatsServer, namespace
from test_runner_faults import (
    WORKFLOW,
    Cluster,
    events,
)

from rigs.outbox import fresh_postgres
from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.nats_queue import NatsConnection, NatsDeliveryQueue
from scratchbank.domain.records import AttemptClaimed, AttemptQueued, OrphanSwept, RunStarted

LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


SWEEP = {"sweep_every": 0.3, "sweep_cutoff": 30.0}


@attrs.define
class Swept(Cluster):
    db: str = ""


@pytest.fixture
def swept(tmp_path: Path, postgres_url: str) -> Iterator[Swept]:
    (tmp_path / "workflow.json").write_text(json.dumps(WORKFLOW))
    server = NatsServer(tmp_path / "nats")
    server.start()
    try:  # a setup that fails after the server started must not leave it running
        ns, db = namespace(), fresh_postgres(postgres_url)
        conn = NatsConnection(server.url)
        queue = NatsDeliveryQueue(conn, ack_wait=3.0, namespace=ns)
        c = Swept(tmp_path, server, db, ns, EventStoreTimeline(db), conn, queue, db=db)
    except BaseException:
        server.stop()
        raise
    try:
        yield c
    finally:
        c.close()


def orphan(c: Cluster, name: str | None = None) -> str:
    """A run queued long ago whose publication was lost: no delivery was ever published."""
    run = name or f"run-{uuid.uuid4().hex[:10]}"
    c.timeline.append(run, [RunStarted(), AttemptQueued(at=LONG_AGO, attempt="a1")])
    return run


def acted(*logs: Path) -> list[str]:
    return sorted(
        s["run"]
        for log in logs
        for e in events(log)
        if e["event"] == "sweep"
        for s in e["swept"]  # type: ignore[attr-defined]
        if s["acted"]  # type: ignore[index]
    )


def assert_swept_once_and_carried_on(c: Swept, runs: list[str]) -> None:
    for run in runs:
        recs = c.records(run)
        swept = [r for r in recs if isinstance(r, OrphanSwept)]
        assert len(swept) == 1 and not swept[0].parked, [r.WIRE for r in recs]
        assert {r.attempt for r in recs if isinstance(r, AttemptClaimed)} == {"a1"}
    assert c.timeline.queued_unclaimed(datetime.now(UTC)) == []  # nothing left queued


def _waiting_on_a_lock(c: Swept) -> bool:
    import psycopg

    name = c.db.rsplit("/", 1)[1]
    with psycopg.connect(c.db.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
            (name,),
        ).fetchone()
    return bool(row and row[0])
