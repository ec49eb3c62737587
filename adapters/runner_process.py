"""The runner as a process of its own: NATS JetStream deliveries and leases, a timeline
by URL, banks on disk, local sandboxes and the reference engine, wired from arguments.

    python -m scratchbank.adapters.runner_process --nats nats://... \\
        --timeline postgresql://... --banks DIR --sandboxes DIR --workflow FILE.json

Each delivery it handles is one JSON line on ``--log`` (or stdout). Every
``--sweep-every`` seconds (0: never) it runs the orphan sweeper under the sweeper's
lease (one sweeper at a time across runner processes): runs the timeline lists as
queued and unclaimed past ``--sweep-cutoff`` (default: the lease arithmetic's, L4) are
published again or parked, each with its record; each sweep is a JSON line too.
(Fault tests hold its bank store from outside: ``tests/held_runner.py``.)
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from scratchbank.application.orphans import Sweeper
from scratchbank.application.ports import BankStore
from scratchbank.application.runner import Handling, Runner, RunnerSettings
from scratchbank.application.runner_ports import DeliveryQueue
from scratchbank.application.teardown import Budgets
from scratchbank.domain.lease import HoldBudgets, LeaseTiming, sweeper_cutoff

from .event_store import EventStoreTimeline
from .fs_bank import FilesystemBankStore
from .nats_queue import NatsConnection, NatsDeliveryQueue, NatsKvLease
from .reference_engine import Node, ReferenceEngine
from .sandbox_provider import LocalSandboxProvider


class Log:
    """One JSON object per line, flushed at once (a SIGKILL loses nothing written)."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.lock = out, threading.Lock()

    def say(self, **event: object) -> None:
        with self.lock:
            self.out.write(json.dumps(event, sort_keys=True, default=str) + "\n")
            self.out.flush()


def load_workflow(path: Path) -> tuple[Node, ...]:
    """Nodes from a JSON list of {name, kind, command, children}."""

    def node(obj: dict[str, object]) -> Node:
        children = tuple(node(c) for c in obj.get("children", []))  # type: ignore[attr-defined]
        return Node(
            str(obj["name"]), str(obj.get("kind", "tool")), str(obj.get("command", "true")), False, children
        )

    return tuple(node(o) for o in json.loads(path.read_text()))


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scratchbank-runner")
    p.add_argument("--nats", required=True)
    p.add_argument("--namespace", default="sb")
    p.add_argument("--timeline", required=True)
    p.add_argument("--banks", required=True, type=Path)
    p.add_argument("--sandboxes", required=True, type=Path)
    p.add_argument("--workflow", required=True, type=Path)
    p.add_argument("--holder", default="runner")
    p.add_argument("--interval", type=float, default=30.0)
    p.add_argument("--lapse", type=float, default=60.0)
    p.add_argument("--ack-wait", type=float, default=240.0)
    p.add_argument("--sweep-every", type=float, default=60.0)
    p.add_argument("--sweep-cutoff", type=float, default=None)
    p.add_argument("--log", type=Path)
    return p.parse_args(argv)


def build(args: argparse.Namespace, log: Log) -> tuple[Runner, NatsConnection, EventStoreTimeline]:
    conn = NatsConnection(args.nats, name=args.holder)
    queue = NatsDeliveryQueue(conn, ack_wait=args.ack_wait, namespace=args.namespace)
    lease = NatsKvLease(conn, lapse=args.lapse, namespace=args.namespace)
    timeline = EventStoreTimeline(args.timeline)
    store: BankStore = FilesystemBankStore(args.banks)
    timing = LeaseTiming(interval=args.interval, lapse=args.lapse, ack_wait=args.ack_wait)
    teardown = Budgets(banking_seconds=60.0, record_seconds=10.0, continue_seconds=10.0)
    settings = RunnerSettings(args.holder, timing=timing, teardown=teardown)
    engine = ReferenceEngine(load_workflow(args.workflow), timeline)
    provider = LocalSandboxProvider(args.sandboxes)
    return Runner(queue, lease, timeline, store, provider, engine, settings), conn, timeline


def build_sweeper(
    args: argparse.Namespace, queue: DeliveryQueue, conn: NatsConnection, timeline: EventStoreTimeline
) -> Sweeper:
    """The orphan sweeper on this process's queue, its own lease bucket and the timeline's outbox."""
    lease = NatsKvLease(conn, lapse=args.lapse, bucket=f"{args.namespace}_sweeper")
    timing = LeaseTiming(interval=args.interval, lapse=args.lapse, ack_wait=args.ack_wait)
    cutoff = sweeper_cutoff(HoldBudgets(), timing) if args.sweep_cutoff is None else args.sweep_cutoff
    return Sweeper(lease, timeline, timeline, queue, args.holder, cutoff)


def sweep_on_schedule(sweeper: Sweeper, every: float, stop: threading.Event, log: Log) -> None:
    """Sweep every ``every`` seconds until stopped; a sweep's failure is said, never fatal."""
    while not stop.wait(every):
        try:
            report = sweeper.sweep_once()
        except Exception as error:
            log.say(event="sweep-error", error=f"{type(error).__name__}: {error}")
            continue
        if report.held:
            swept = [
                {"run": s.run_id, "sweep": s.verdict.sweep.value if s.verdict else None, "acted": s.acted}
                for s in report.swept
            ]
            log.say(event="sweep", holder=sweeper.holder, swept=swept, detail=report.detail)


def _said(log: Log, handling: Handling) -> None:
    d = handling.delivery
    log.say(
        event="handled",
        run=d.run_id,
        attempt=d.attempt,
        handled=handling.handled.value,
        detail=handling.detail,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    out = open(args.log, "a") if args.log else sys.stdout  # noqa: SIM115 - for the process's life
    log = Log(out)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    runner, conn, timeline = build(args, log)
    if args.sweep_every > 0:
        sweeper = build_sweeper(args, runner.queue, conn, timeline)
        threading.Thread(
            target=sweep_on_schedule, args=(sweeper, args.sweep_every, stop, log), name="sweeper", daemon=True
        ).start()
    log.say(event="ready", holder=args.holder)
    while not stop.is_set():
        try:
            handling = runner.run_once(0.5)
        except Exception as error:  # a queue outage: say it, wait, try again
            log.say(event="error", error=f"{type(error).__name__}: {error}")
            time.sleep(0.5)
            continue
        if handling is not None:
            _said(log, handling)
    conn.close()
    timeline.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
