"""The runner as a process of its own: NATS JetStream deliveries and leases, a timeline
by URL, banks on disk, local sandboxes and the reference engine, wired from arguments.

    python -m scratchbank.adapters.runner_process --nats nats://... \\
        --timeline postgresql://... --banks DIR --sandboxes DIR --workflow FILE.json

Each delivery it handles is one JSON line on ``--log`` (or stdout). ``--slow-put`` and
``--slow-fetch`` hold the bank store for that many seconds first, announcing it on the
log, so that fault tests can kill the process in the middle of a teardown or a restore.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, TextIO

from scratchbank.application.ports import BankStore, StoredBank
from scratchbank.application.retry import Deadline
from scratchbank.application.runner import Handling, Runner, RunnerSettings
from scratchbank.application.teardown import Budgets
from scratchbank.domain.lease import LeaseTiming
from scratchbank.domain.objects import BankStamp, StoredObject

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


class HeldBankStore:
    """A bank store that waits before each put or fetch, saying so (for fault tests)."""

    def __init__(self, inner: FilesystemBankStore, log: Log, *, put: float, fetch: float) -> None:
        self.inner, self.log, self.put_wait, self.fetch_wait = inner, log, put, fetch
        self.keeps_banks = inner.keeps_banks

    def put(
        self,
        run_id: str,
        archive: Path,
        *,
        sha256: str,
        stamp: BankStamp | None = None,
        deadline: Deadline | None = None,
    ) -> str:
        self.log.say(event="put-started", run=run_id)
        time.sleep(self.put_wait)
        return self.inner.put(run_id, archive, sha256=sha256, stamp=stamp, deadline=deadline)

    def fetch(
        self,
        run_id: str,
        dest: BinaryIO,
        *,
        max_bytes: int,
        name: str | None = None,
        deadline: Deadline | None = None,
    ) -> StoredBank:
        self.log.say(event="fetch-started", run=run_id)
        time.sleep(self.fetch_wait)
        return self.inner.fetch(run_id, dest, max_bytes=max_bytes, name=name, deadline=deadline)

    def delete(self, run_id: str, name: str | None = None) -> None:
        self.inner.delete(run_id, name)

    def sweep(self, run_id: str) -> None:
        self.inner.sweep(run_id)

    def stat(self, run_id: str, name: str | None = None) -> StoredBank | None:
        return self.inner.stat(run_id, name)

    def objects(self, run_id: str) -> Sequence[StoredObject]:
        return self.inner.objects(run_id)


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
    p.add_argument("--slow-put", type=float, default=0.0)
    p.add_argument("--slow-fetch", type=float, default=0.0)
    p.add_argument("--log", type=Path)
    return p.parse_args(argv)


def build(args: argparse.Namespace, log: Log) -> tuple[Runner, NatsConnection, EventStoreTimeline]:
    conn = NatsConnection(args.nats, name=args.holder)
    queue = NatsDeliveryQueue(conn, ack_wait=args.ack_wait, namespace=args.namespace)
    lease = NatsKvLease(conn, lapse=args.lapse, namespace=args.namespace)
    timeline = EventStoreTimeline(args.timeline)
    store: BankStore = FilesystemBankStore(args.banks)
    if args.slow_put or args.slow_fetch:
        store = HeldBankStore(FilesystemBankStore(args.banks), log, put=args.slow_put, fetch=args.slow_fetch)
    timing = LeaseTiming(interval=args.interval, lapse=args.lapse, ack_wait=args.ack_wait)
    teardown = Budgets(banking_seconds=60.0, record_seconds=10.0, continue_seconds=10.0)
    settings = RunnerSettings(args.holder, timing=timing, teardown=teardown)
    engine = ReferenceEngine(load_workflow(args.workflow), timeline)
    provider = LocalSandboxProvider(args.sandboxes)
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
    out = open(args.log, "a") if args.log else sys.stdout  # noqa: SIM115 - for the process's life
    log = Log(out)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    runner, conn, timeline = build(args, log)
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
