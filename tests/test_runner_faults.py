"""Faults on real servers: runner processes on a NATS JetStream server of the test's own
and a PostgreSQL timeline, local sandboxes, banks on disk (issue #13, item 5).

Each test is bounded: every wait has a deadline, past which it fails with the timeline
it saw. Short settings: lease interval 0.3 s, lapse 1.5 s, ack wait 3 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
from nats_server import NatsServer, namespace
from runner_rigs import queue_resume, types
from waiting import eventually

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.nats_queue import NatsConnection, NatsDeliveryQueue
from scratchbank.domain.records import (
    AttemptClaimed,
    LeaseTaken,
    NodeFinished,
    Record,
    RunStarted,
    RunStatus,
    RunStatusChanged,
    ScratchBanked,
    ScratchRestored,
)

pytestmark = pytest.mark.postgres

WORKFLOW = [
    {"name": "clone", "kind": "tool", "command": "mkdir -p clone && echo 'a clone' > clone/README.md"},
    {"name": "review", "kind": "human"},
    {"name": "build", "kind": "tool", "command": "sleep 3 && echo built > built.txt"},
    {"name": "measure", "kind": "agent", "command": "test -f clone/README.md && test -f built.txt"},
]
DEADLINE = 90.0
RUNNER = "scratchbank.adapters.runner_process"


@attrs.define
class Cluster:
    tmp: Path
    nats: NatsServer
    pg: str
    ns: str
    timeline: EventStoreTimeline
    conn: NatsConnection
    queue: NatsDeliveryQueue
    procs: list[subprocess.Popen[bytes]] = attrs.Factory(list)

    def close(self) -> None:
        """End the runner processes (continued first if stopped), their sandboxes, the
        connection, the timeline and the NATS server."""
        try:
            for proc in self.procs:
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
            for proc in self.procs:
                proc.wait(10)
        finally:  # a runner that outlived its wait still leaves no server or connection behind
            # (two NATS servers were left running when a traced run made a wait time out)
            _end_leftover_sandboxes(self.tmp / "sandboxes")
            self.conn.close()
            self.timeline.close()
            self.nats.stop()

    def runner(self, holder: str, **opts: float) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.tmp / f"{holder}.log"
        held = any(name in opts for name in ("slow_put", "slow_fetch"))
        entry = [str(Path(__file__).with_name("held_runner.py"))] if held else ["-m", RUNNER]
        argv = [
            sys.executable,
            *entry,
            *("--nats", self.nats.url, "--namespace", self.ns, "--timeline", self.pg),
            *("--banks", str(self.tmp / "banks"), "--sandboxes", str(self.tmp / "sandboxes")),
            *("--workflow", str(self.tmp / "workflow.json"), "--holder", holder, "--log", str(log)),
            *("--interval", "0.3", "--lapse", "1.5", "--ack-wait", "3"),
        ]
        for name, value in opts.items():
            argv += [f"--{name.replace('_', '-')}", str(value)]
        proc = subprocess.Popen(argv)
        self.procs.append(proc)
        wait_for(lambda: '"ready"' in _text(log), f"{holder} ready", self, None)
        return proc, log

    def records(self, run: str) -> list[Record]:
        return list(self.timeline.read(run))


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def events(log: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in _text(log).splitlines() if line.strip()]


def handled(log: Path) -> list[str]:
    return [e["handled"] for e in events(log) if e["event"] == "handled"]


def wait_for(pred: Callable[[], bool], what: str, c: Cluster, run: str | None) -> None:
    eventually(pred, timeout=DEADLINE, what=what, detail=lambda: types(c.records(run)) if run else [])


def drained(c: Cluster) -> bool:
    """The queue's consumer holds no delivery: none pending, none delivered and unacked."""
    info = c.conn.call(c.conn.js.consumer_info(c.queue.stream, c.queue.durable))
    return info.num_pending == 0 and info.num_ack_pending == 0


def _end_leftover_sandboxes(base: Path) -> None:
    """Sandboxes a killed runner left: end their namespaces by the pid each one recorded."""
    for owner in base.glob("*/owner.json"):
        pid = json.loads(owner.read_text()).get("init")
        if isinstance(pid, int):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def cluster(tmp_path: Path, postgres_url: str) -> Iterator[Cluster]:
    (tmp_path / "workflow.json").write_text(json.dumps(WORKFLOW))
    server = NatsServer(tmp_path / "nats")
    server.start()
    ns = namespace()
    conn = NatsConnection(server.url)
    queue = NatsDeliveryQueue(conn, ack_wait=3.0, namespace=ns)
    c = Cluster(tmp_path, server, postgres_url, ns, EventStoreTimeline(postgres_url), conn, queue)
    try:
        yield c
    finally:
        c.close()


def show(c: Cluster, run: str, *logs: Path) -> None:
    """What the timeline holds after the fault, and what each runner did (pytest -s)."""
    print(f"\n{run}: {' '.join(types(c.records(run)))}")
    for log in logs:
        print(f"  {log.stem}: {', '.join(handled(log))}")


def new_run(c: Cluster) -> str:
    run = f"run-{uuid.uuid4().hex[:10]}"
    c.timeline.append(run, [RunStarted()])
    return run


def paused(c: Cluster, run: str, times: int = 1) -> Callable[[], bool]:
    def check() -> bool:
        recs = c.records(run)
        parks = [r for r in recs if isinstance(r, RunStatusChanged) and r.status is RunStatus.PAUSED]
        return len(parks) >= times and isinstance(recs[-1], ScratchBanked)

    return check


def finished(c: Cluster, run: str) -> Callable[[], bool]:
    def check() -> bool:
        recs = c.records(run)
        return any(isinstance(r, RunStatusChanged) and r.status is RunStatus.FINISHED for r in recs) and (
            isinstance(recs[-1], ScratchBanked)
        )

    return check


def finishes(records: list[Record]) -> dict[str, int]:
    """How many successful finishes each node has: each must be 1 (nothing run twice)."""
    out: dict[str, int] = {}
    for r in records:
        if isinstance(r, NodeFinished) and r.succeeded:
            out[r.node] = out.get(r.node, 0) + 1
    return out


def to_first_park(c: Cluster, run: str) -> None:
    """The run's first execution, on a runner of its own, to its park and bank."""
    proc, _ = c.runner("first")
    queue_resume(c.timeline, c.queue, run, "a1")
    wait_for(paused(c, run), "the first park", c, run)
    proc.terminate()
    proc.wait(10)


def test_fault_SIGKILL_mid_teardown_another_runner_banks_what_it_left(cluster: Cluster) -> None:
    """A runner dies uploading the park's bank; after its lease lapses another runner banks the
    sandbox it left, parks the run again, and the next resume finds the clone."""
    c, run = cluster, new_run(cluster)
    a, a_log = c.runner("a", slow_put=60)
    queue_resume(c.timeline, c.queue, run, "a1")
    wait_for(lambda: "put-started" in _text(a_log), "a's upload", c, run)
    a.kill()
    assert not [r for r in c.records(run) if isinstance(r, ScratchBanked)]
    c.runner("b")
    wait_for(paused(c, run, times=2), "b banks a's sandbox and parks again", c, run)
    queue_resume(c.timeline, c.queue, run, "a2")
    wait_for(finished(c, run), "the resume finishes the run", c, run)
    recs = c.records(run)
    assert finishes(recs) == {"clone": 1, "review": 1, "build": 1, "measure": 1}
    assert [r.attempt for r in recs if isinstance(r, AttemptClaimed)] == ["a1", "a1", "a2"]
    assert any(isinstance(r, ScratchRestored) and r.restored for r in recs)
    show(c, run, a_log, c.tmp / "b.log")


def test_fault_SIGKILL_mid_restore_the_bank_holds_and_another_runner_restores(cluster: Cluster) -> None:
    """A runner dies fetching the bank; its half-restored sandbox is not banked over the bank;
    another runner restores it and finishes the run."""
    c, run = cluster, new_run(cluster)
    to_first_park(c, run)
    a, a_log = c.runner("a", slow_fetch=60)
    queue_resume(c.timeline, c.queue, run, "a2")
    wait_for(lambda: "fetch-started" in _text(a_log), "a's fetch", c, run)
    a.kill()
    banks_before = sum(isinstance(r, ScratchBanked) for r in c.records(run))
    c.runner("b")
    wait_for(finished(c, run), "b finishes the run", c, run)
    recs = c.records(run)
    assert finishes(recs) == {"clone": 1, "review": 1, "build": 1, "measure": 1}
    banks = [r for r in recs if isinstance(r, ScratchBanked)]
    assert len(banks) == banks_before + 1 and banks[-1].finished  # only the finish's record
    assert [r.attempt for r in recs if isinstance(r, AttemptClaimed)] == ["a1", "a2", "a2"]
    show(c, run, a_log, c.tmp / "b.log")


def test_fault_SIGSTOP_past_the_lease_then_SIGCONT_the_fence_refuses_its_writes(cluster: Cluster) -> None:
    """A runner stopped mid-node past its lease; another takes over and finishes; the
    stopped one, continued, writes nothing: its writes are refused by the fence."""
    c, run = cluster, new_run(cluster)
    to_first_park(c, run)
    a, a_log = c.runner("a")
    queue_resume(c.timeline, c.queue, run, "a2")
    wait_for(lambda: "review" in finishes(c.records(run)), "a answers the gate", c, run)
    os.kill(a.pid, signal.SIGSTOP)
    c.runner("b")
    wait_for(finished(c, run), "b finishes the run", c, run)
    tokens = [r.token for r in c.records(run) if isinstance(r, LeaseTaken)]
    os.kill(a.pid, signal.SIGCONT)
    wait_for(lambda: "fenced" in handled(a_log), "a is fenced", c, run)
    recs = c.records(run)
    assert [r.token for r in recs if isinstance(r, LeaseTaken)] == tokens
    assert finishes(recs) == {"clone": 1, "review": 1, "build": 1, "measure": 1}
    assert not [r for r in recs if isinstance(r, NodeFinished) and not r.succeeded]
    show(c, run, a_log, c.tmp / "b.log")


def test_fault_two_runners_race_one_delivery_exactly_one_claims(cluster: Cluster) -> None:
    """One resume published twice (a publisher past the de-dup window): two runners each take
    a copy; exactly one claims and runs, the other writes nothing."""
    c, run = cluster, new_run(cluster)
    _, a_log = c.runner("a")
    _, b_log = c.runner("b")
    queue_resume(c.timeline, c.queue, run, "a1")
    _publish_again(c, run, "a1")
    wait_for(paused(c, run), "the park", c, run)
    wait_for(lambda: len(settled(a_log) + settled(b_log)) >= 2, "both copies acked", c, run)
    recs = c.records(run)
    assert [r.attempt for r in recs if isinstance(r, AttemptClaimed)] == ["a1"]
    assert len([r for r in recs if isinstance(r, LeaseTaken)]) == 1
    assert sorted(settled(a_log) + settled(b_log)) == ["done", "ran"]
    show(c, run, a_log, b_log)


def settled(log: Path) -> list[str]:
    """What the runner acked (a delivery nak'd for a held lease comes back)."""
    return [h for h in handled(log) if h not in ("lease_held", "redeliver")]


def _publish_again(c: Cluster, run: str, attempt: str) -> None:
    payload = json.dumps({"run_id": run, "attempt": attempt, "force": False, "accept_scratch_loss": False})
    headers = {"Nats-Msg-Id": f"{run}.{attempt}.again"}
    c.conn.call(c.conn.js.publish(f"{c.queue.subject}.{run}", payload.encode(), headers=headers))


def test_fault_a_delivery_for_an_older_attempt_is_acked_with_nothing_written(cluster: Cluster) -> None:
    """Queued again before any runner came: the older attempt's delivery writes nothing (C6)."""
    c, run = cluster, new_run(cluster)
    queue_resume(c.timeline, c.queue, run, "a1")
    queue_resume(c.timeline, c.queue, run, "a2")
    _, log = c.runner("a")
    wait_for(paused(c, run), "the park", c, run)
    wait_for(lambda: len(settled(log)) >= 2, "both settled", c, run)
    assert settled(log) == ["superseded", "ran"]
    assert [r.attempt for r in c.records(run) if isinstance(r, AttemptClaimed)] == ["a2"]
    show(c, run, log)


def test_fault_NATS_restarted_mid_flow_no_delivery_lost_none_applied_twice(cluster: Cluster) -> None:
    """The server restarts while runs are being carried on: each run parks exactly once."""
    c = cluster
    runs = [new_run(c) for _ in range(4)]
    c.runner("a")
    for run in runs:
        queue_resume(c.timeline, c.queue, run, "a1")
    wait_for(lambda: any(paused(c, r)() for r in runs), "a first park", c, runs[0])
    c.nats.stop()
    wait_for(lambda: not c.nats.answers(), "the server is down", c, None)  # the runner's connection drops
    c.nats.start()
    for run in runs:
        wait_for(paused(c, run), "every run parks", c, run)
    # a delivery whose ack was lost stays unacked until its ack wait passes and it comes back:
    # wait until the consumer holds none, pending or unacked (then none can come back)
    wait_for(lambda: drained(c), "every delivery acked", c, runs[0])
    for run in runs:
        recs = c.records(run)
        assert finishes(recs) == {"clone": 1}, types(recs)
        assert sum(isinstance(r, ScratchBanked) for r in recs) == 1
        assert [r.attempt for r in recs if isinstance(r, AttemptClaimed)] == ["a1"]
        show(c, run)
    show(c, runs[0], c.tmp / "a.log")
