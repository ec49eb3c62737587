"""The runner as a process of its own: NATS JetStream deliveries and leases, the timeline
and bank store by URL, the sandbox provider and the reference engine, wired from the
settings (``runner_settings``: the environment, as ``scratchbank serve`` reads it)::

    SCRATCHBANK_QUEUE=nats://... SCRATCHBANK_TIMELINE=postgresql://... \\
    SCRATCHBANK_BANK=s3://bucket/prefix SCRATCHBANK_WORKFLOW=FILE.json \\
    SCRATCHBANK_SANDBOX_PROVIDER=kubernetes SCRATCHBANK_POD_TEMPLATE=pod.yaml \\
        python -m scratchbank.adapters.runner_process

The flags, when given, win over the environment. Each delivery it handles is one JSON
line on ``--log`` (or stdout). Every ``--sweep-every`` seconds (0: never) it runs the
orphan sweeper under the sweeper's lease (one sweeper at a time across runner
processes): runs the timeline lists as queued and unclaimed past ``--sweep-cutoff``
(default: the lease arithmetic's, L4) are published again or parked, each with its
record; each sweep is a JSON line too. (Fault tests hold its bank store from outside:
``tests/held_runner.py``.)
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from scratchbank.application.orphans import Sweeper
from scratchbank.application.ports import BankStore, DeliveryQueue
from scratchbank.application.runner import Handling, Runner, RunnerSettings
from scratchbank.application.teardown import Budgets
from scratchbank.domain.errors import ScratchbankError
from scratchbank.domain.lease import HoldBudgets, LeaseTiming, sweeper_cutoff

from .config import open_bank_store, open_timeline, redact
from .event_store import EventStoreTimeline
from .nats_queue import NatsConnection, NatsDeliveryQueue, NatsKvLease
from .reference_engine import Node, ReferenceEngine
from .runner_settings import RunnerConfig, open_provider, runner_config


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
    """Flags over the environment (runner_settings); none is needed when the environment has all."""
    p = argparse.ArgumentParser(prog="scratchbank-runner")
    p.add_argument("--nats", help="SCRATCHBANK_QUEUE")
    p.add_argument("--namespace", help="SCRATCHBANK_QUEUE_NAMESPACE")
    p.add_argument("--timeline", help="SCRATCHBANK_TIMELINE")
    p.add_argument("--bank", help="SCRATCHBANK_BANK (file:///DIR or s3://BUCKET/PREFIX)")
    p.add_argument("--banks", type=Path, help="a folder: the same as --bank file:///DIR")
    p.add_argument("--sandboxes", type=Path, help="SCRATCHBANK_SANDBOXES")
    p.add_argument("--workflow", type=Path, help="SCRATCHBANK_WORKFLOW")
    p.add_argument("--holder", help="SCRATCHBANK_RUNNER_NAME")
    p.add_argument("--interval", type=float, help="SCRATCHBANK_LEASE_INTERVAL")
    p.add_argument("--lapse", type=float, help="SCRATCHBANK_LEASE_LAPSE")
    p.add_argument("--ack-wait", type=float, help="SCRATCHBANK_ACK_WAIT")
    p.add_argument("--sweep-every", type=float, help="SCRATCHBANK_SWEEP_EVERY (0: never)")
    p.add_argument("--sweep-cutoff", type=float, help="SCRATCHBANK_SWEEP_CUTOFF")
    p.add_argument("--log", type=Path, help="SCRATCHBANK_RUNNER_LOG")
    return p.parse_args(argv)


def configure(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> RunnerConfig:
    bank = args.bank or (f"file://{args.banks.resolve()}" if args.banks else None)
    return runner_config(
        env,
        queue=args.nats,
        namespace=args.namespace,
        timeline=args.timeline,
        bank=bank,
        sandboxes=args.sandboxes,
        workflow=args.workflow,
        holder=args.holder,
        interval=args.interval,
        lapse=args.lapse,
        ack_wait=args.ack_wait,
        sweep_every=args.sweep_every,
        sweep_cutoff=args.sweep_cutoff,
        log=args.log,
    )


def build(cfg: RunnerConfig) -> tuple[Runner, NatsConnection, EventStoreTimeline]:
    conn = NatsConnection(cfg.queue_url, name=cfg.holder)
    queue = NatsDeliveryQueue(conn, ack_wait=cfg.ack_wait, namespace=cfg.queue_namespace)
    lease = NatsKvLease(conn, lapse=cfg.lapse, namespace=cfg.queue_namespace)
    timeline = open_timeline(cfg.settings.timeline_url, create=True)
    assert isinstance(timeline, EventStoreTimeline)  # its outbox serves the sweeper
    store: BankStore = open_bank_store(cfg.settings.bank_url)
    timing = LeaseTiming(interval=cfg.interval, lapse=cfg.lapse, ack_wait=cfg.ack_wait)
    teardown = Budgets(banking_seconds=60.0, record_seconds=10.0, continue_seconds=10.0)
    settings = RunnerSettings(cfg.holder, timing=timing, teardown=teardown, retain=cfg.settings.retain)
    engine = ReferenceEngine(load_workflow(cfg.workflow), timeline)
    provider = open_provider(cfg)
    return Runner(queue, lease, timeline, store, provider, engine, settings), conn, timeline


def build_sweeper(
    cfg: RunnerConfig, queue: DeliveryQueue, conn: NatsConnection, timeline: EventStoreTimeline
) -> Sweeper:
    """The orphan sweeper on this process's queue, its own lease bucket and the timeline's outbox."""
    lease = NatsKvLease(conn, lapse=cfg.lapse, bucket=f"{cfg.queue_namespace}_sweeper")
    timing = LeaseTiming(interval=cfg.interval, lapse=cfg.lapse, ack_wait=cfg.ack_wait)
    cutoff = sweeper_cutoff(HoldBudgets(), timing) if cfg.sweep_cutoff is None else cfg.sweep_cutoff
    return Sweeper(lease, timeline, timeline, queue, cfg.holder, cutoff)


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
    try:
        cfg = configure(args)
    except ScratchbankError as error:  # a bad setting: named, no traceback
        print(f"error: {redact(str(error))}", file=sys.stderr)
        return 2
    out = open(cfg.log, "a") if cfg.log else sys.stdout  # noqa: SIM115 - for the process's life
    log = Log(out)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    runner, conn, timeline = build(cfg)
    if cfg.sweep_every > 0:
        sweeper = build_sweeper(cfg, runner.queue, conn, timeline)
        threading.Thread(
            target=sweep_on_schedule, args=(sweeper, cfg.sweep_every, stop, log), name="sweeper", daemon=True
        ).start()
    log.say(event="ready", holder=cfg.holder, provider=cfg.provider)
    while not stop.is_set():
        try:
            handling = runner.run_once(0.5)
        except Exception as error:  # a queue outage: say it, wait, try again
            log.say(event="error", error=f"{type(error).__name__}: {error}")
            stop.wait(0.5)  # a SIGTERM during the wait ends the process at once
            continue
        if handling is not None:
            _said(log, handling)
    conn.close()
    timeline.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
