"""Deliveries per second through runner processes (issue #19): one and two runners.

    python bench/runner_deliveries.py [--runs N] [--timeline URL] [--out FILE.json]

A nats-server of its own (JetStream, a temporary store), a timeline (a fresh PostgreSQL
database on ``SCRATCHBANK_POSTGRES_URL`` when set, else a SQLite file), local sandboxes,
banks on disk, a one-node workflow that finishes. ``--runs`` runs are queued and
published through the service (the one queueing path) once 1 (and then 2) runner
processes are ready, and the wall time from the first publication until every run's
finish is recorded is measured: deliveries per second = runs / that time. Only arguments every version of
the runner process takes are passed, so the same script measures the code it is run
with (``/work/main/.venv/bin/python bench/runner_deliveries.py`` for "before").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scratchbank.adapters.event_store import EventStoreTimeline
from scratchbank.adapters.memory import InMemoryBankStore
from scratchbank.adapters.nats_queue import NatsConnection, NatsDeliveryQueue
from scratchbank.application.service import ScratchService
from scratchbank.domain.records import AttemptClaimed, RunStarted, RunStatus, RunStatusChanged

WORKFLOW = [{"name": "work", "kind": "tool", "command": "echo done > out.txt"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timeline_url(base: Path, given: str | None) -> str:
    if given:
        return given
    pg = os.environ.get("SCRATCHBANK_POSTGRES_URL")
    if not pg:
        return f"sqlite:///{base}/timeline.db"
    import psycopg

    name = "bench_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return pg.rsplit("/", 1)[0] + "/" + name


def ended(timeline: EventStoreTimeline, run: str) -> str | None:
    """How the run ended: "ok" (finished once), else by name; None while it is not over."""
    statuses = [r.status for r in timeline.read(run) if isinstance(r, RunStatusChanged)]
    finishes = statuses.count(RunStatus.FINISHED)
    if finishes > 1:
        return "finished more than once"
    if finishes == 1:
        return "ok"
    if statuses and statuses[-1] in (RunStatus.FAILED, RunStatus.CANCELLED):
        return statuses[-1].value
    return None


def finished(timeline: EventStoreTimeline, run: str) -> bool:
    return ended(timeline, run) is not None


def one_side(runners: int, n: int, url: str, base: Path) -> float:
    """Queue and publish ``n`` runs, start ``runners`` processes; seconds to finish them all."""
    return float(measure(runners, n, url, base)["seconds"])


def measure(
    runners: int,
    n: int,
    url: str,
    base: Path,
    limit: float = 600.0,
    window: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """``one_side`` with each run's time from the first publication to its end (seen by
    polling every 50 ms), how each ended by name (exactly once: ``ok``), and its claims.
    ``window("start")`` and ``window("end")`` bracket the deliveries (the runners are up)."""
    nats_bin = shutil.which("nats-server") or "/usr/sbin/nats-server"
    port, store = free_port(), base / f"nats-{runners}"
    server = subprocess.Popen(
        [nats_bin, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        time.sleep(0.5)
        nats_url, ns = f"nats://127.0.0.1:{port}", "b" + uuid.uuid4().hex[:8]
        conn = NatsConnection(nats_url)
        queue = NatsDeliveryQueue(conn, namespace=ns)
        timeline = EventStoreTimeline(url)
        service = ScratchService(timeline, InMemoryBankStore(), queue=queue)
        (base / "workflow.json").write_text(json.dumps(WORKFLOW))
        logs = [base / f"r{runners}-{i}.log" for i in range(runners)]
        for i, log in enumerate(logs):
            argv = [
                sys.executable,
                "-m",
                "scratchbank.adapters.runner_process",
                *("--nats", nats_url, "--namespace", ns, "--timeline", url),
                *("--banks", str(base / "banks"), "--sandboxes", str(base / f"sandboxes-{runners}-{i}")),
                *("--workflow", str(base / "workflow.json"), "--holder", f"r{i}", "--log", str(log)),
            ]
            procs.append(subprocess.Popen(argv))
        while not all(log.exists() and '"ready"' in log.read_text() for log in logs):
            time.sleep(0.05)
        runs = [f"bench-{runners}-{i}-{uuid.uuid4().hex[:6]}" for i in range(n)]
        for run in runs:
            timeline.append(run, [RunStarted()])
        window("start")
        started = time.monotonic()  # every runner is ready: publishing is part of the path
        for run in runs:
            service.queue_resume(run)
        left, took = set(runs), {}
        while left and time.monotonic() - started < limit:
            now = time.monotonic() - started
            for run in [r for r in left if finished(timeline, r)]:
                took[run] = now
                left.discard(run)
            time.sleep(0.05)
        seconds = time.monotonic() - started
        window("end")
        outcomes = Counter(ended(timeline, r) or f"not over within {limit:g} s" for r in runs)
        claims = sum(isinstance(x, AttemptClaimed) for r in runs for x in timeline.read(r))
        conn.close()
        timeline.close()
        if left and limit >= 600:
            raise SystemExit(f"{len(left)} runs did not finish within {limit:g} s")
        return {
            "seconds": seconds,
            "latencies": sorted(took.values()),
            "outcomes": dict(outcomes),
            "claims": claims,
        }
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        server.terminate()
        server.wait(10)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--timeline")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="sb-bench-runner-"))
    url = timeline_url(base, args.timeline)
    out: dict[str, object] = {"runs": args.runs, "timeline": url.split(":", 1)[0]}
    for runners in (1, 2):
        seconds = one_side(runners, args.runs, url, base)
        out[f"{runners}_runner"] = {
            "seconds": round(seconds, 2),
            "deliveries_per_s": round(args.runs / seconds, 2),
        }
        print(
            f"{runners} runner process(es): {args.runs} runs in {seconds:.1f} s = {args.runs / seconds:.2f}/s"
        )
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
