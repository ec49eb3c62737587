"""The runner as a process of its own: NATS JetStream deliveries and leases, the timeline
and bank store by URL, the sandbox provider and the reference engine, wired from the
settings (``runner_settings``: the environment, as ``scratchbank serve`` reads it)::

    SCRATCHBANK_QUEUE=nats://... SCRATCHBANK_TIMELINE=postgresql://... \\
    SCRATCHBANK_BANK=s3://bucket/prefix SCRATCHBANK_WORKFLOW=FILE.json \\
    SCRATCHBANK_SANDBOX_PROVIDER=kubernetes SCRATCHBANK_POD_TEMPLATE=pod.yaml \\
        python -m scratchbank.adapters.runner_process

The flags below, when given, win over the environment. Each delivery it handles is one
JSON line on ``--log`` (or stdout). ``--slow-put`` and ``--slow-fetch`` hold the bank
store for that many seconds first, announcing it on the log, so that fault tests can
kill the process in the middle of a teardown or a restore.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO, TextIO

from scratchbank.application.ports import BankStore, StoredBank, Timeline
from scratchbank.application.retry import Deadline
from scratchbank.application.runner import Handling, Runner, RunnerSettings
from scratchbank.application.teardown import Budgets
from scratchbank.domain.errors import ScratchbankError
from scratchbank.domain.lease import LeaseTiming

from .config import open_bank_store, open_timeline, redact
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


class HeldBankStore:
    """A bank store that waits before each put or fetch, saying so (for fault tests)."""

    def __init__(self, inner: BankStore, log: Log, *, put: float, fetch: float) -> None:
        self.inner, self.log, self.put_wait, self.fetch_wait = inner, log, put, fetch
        self.keeps_banks = inner.keeps_banks

    def put(self, run_id: str, archive: Path, *, sha256: str, deadline: Deadline | None = None) -> None:
        self.log.say(event="put-started", run=run_id)
        time.sleep(self.put_wait)
        self.inner.put(run_id, archive, sha256=sha256, deadline=deadline)

    def fetch(
        self, run_id: str, dest: BinaryIO, *, max_bytes: int, deadline: Deadline | None = None
    ) -> StoredBank:
        self.log.say(event="fetch-started", run=run_id)
        time.sleep(self.fetch_wait)
        return self.inner.fetch(run_id, dest, max_bytes=max_bytes, deadline=deadline)

    def delete(self, run_id: str) -> None:
        self.inner.delete(run_id)

    def sweep(self, run_id: str) -> None:
        self.inner.sweep(run_id)

    def stat(self, run_id: str) -> StoredBank | None:
        return self.inner.stat(run_id)


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
    p.add_argument("--slow-put", type=float, default=0.0)
    p.add_argument("--slow-fetch", type=float, default=0.0)
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
        log=args.log,
    )


def build(
    cfg: RunnerConfig, log: Log, args: argparse.Namespace | None = None
) -> tuple[Runner, NatsConnection, Timeline]:
    conn = NatsConnection(cfg.queue_url, name=cfg.holder)
    queue = NatsDeliveryQueue(conn, ack_wait=cfg.ack_wait, namespace=cfg.queue_namespace)
    lease = NatsKvLease(conn, lapse=cfg.lapse, namespace=cfg.queue_namespace)
    timeline = open_timeline(cfg.settings.timeline_url, create=True)
    store = open_bank_store(cfg.settings.bank_url)
    if args is not None and (args.slow_put or args.slow_fetch):
        store = HeldBankStore(store, log, put=args.slow_put, fetch=args.slow_fetch)
    timing = LeaseTiming(interval=cfg.interval, lapse=cfg.lapse, ack_wait=cfg.ack_wait)
    teardown = Budgets(banking_seconds=60.0, record_seconds=10.0, continue_seconds=10.0)
    settings = RunnerSettings(cfg.holder, timing=timing, teardown=teardown)
    engine = ReferenceEngine(load_workflow(cfg.workflow), timeline)
    provider = open_provider(cfg)
    return Runner(queue, lease, timeline, store, provider, engine, settings), conn, timeline


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
    runner, conn, timeline = build(cfg, log, args)
    log.say(event="ready", holder=cfg.holder, provider=cfg.provider)
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
    closer = getattr(timeline, "close", None)
    if callable(closer):
        closer()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
