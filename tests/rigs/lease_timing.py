"""A lease with short timings, a stuck archive and provider, a store cut after its put, a bounded
runner.

First written for tests/rules/test_L_engines.py: The run's lease while banking (L1-L5): ceilings,
back-off, sweeper cutoff, the keeper."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import attrs
from waiting import NeverHappened, eventually

from scratchbank.adapters.exec_output import ExecResult
from scratchbank.adapters.inprocess import InProcessLease
from scratchbank.adapters.local_sandbox import LocalSandbox
from scratchbank.adapters.memory import InMemoryBankStore
from scratchbank.adapters.sandbox_provider import OWNER, LocalSandboxProvider
from scratchbank.adapters.scripted import BANK, Exec
from scratchbank.application.cancellation import Cancel, Deadline
from scratchbank.application.ports import Sandbox
from scratchbank.application.runner import Handling, Runner
from scratchbank.domain.lease import (
    HoldBudgets,
    LeaseTiming,
)
from scratchbank.domain.objects import BankStamp

B, T = HoldBudgets(), LeaseTiming()


MIN = 60.0


def _short(lapse: float = 0.3) -> tuple[InProcessLease, HoldBudgets, LeaseTiming]:
    return InProcessLease(lapse=lapse), HoldBudgets(), LeaseTiming(interval=0.05, lapse=lapse)


class StuckArchive(LocalSandbox):
    """A real local sandbox whose tar blocks until cut (a hung filesystem); it says when
    the archive is running and counts the continues (T14)."""

    def __init__(self, root: Path | None = None) -> None:
        super().__init__(root)
        self.continues = 0

    def execute(self, exec_: Exec) -> ExecResult:
        source = exec_.source
        if source == BANK:  # quiesced for real; the marker is written where tar would start
            tar = 'archive_scratch "$1" "$2" "$verify"'
            source = source.replace(tar, f"touch {self.root}/archiving; exec sleep 1000\n{tar}")
            assert source != BANK
        return super().execute(attrs.evolve(exec_, source=source))

    def wait_archiving(self, bound: float = 30.0) -> bool:
        try:
            return eventually((self.root / "archiving").exists, timeout=bound, interval=0.02)
        except NeverHappened:
            return False

    def continue_processes(self, *, deadline: Deadline | None = None) -> None:
        super().continue_processes(deadline=deadline)
        self.continues += 1


def _states(box: LocalSandbox) -> list[str]:
    """The state letter of every process in the sandbox (after the last ") ")."""
    out = box.run("cat /proc/[0-9]*/stat 2>/dev/null", []).stdout.decode(errors="replace")
    return [line.rsplit(") ", 1)[1].split()[0] for line in out.splitlines() if ") " in line]


class CutAfterPut(InMemoryBankStore):
    """The lease is lost the moment the upload lands: the bank reached the store."""

    def __init__(self, cancel: Cancel) -> None:
        super().__init__()
        self.cancel = cancel

    def put(
        self,
        run_id: str,
        archive: Path,
        *,
        sha256: str,
        stamp: BankStamp | None = None,
        deadline: Deadline | None = None,
    ) -> str:
        name = super().put(run_id, archive, sha256=sha256, stamp=stamp, deadline=deadline)
        self.cancel.cut("past the post-engine ceiling: the lease was let go (L5)")
        return name


class StuckProvider(LocalSandboxProvider):
    """Runner A's sandboxes: their tar blocks until cut."""

    def start(self, run_id: str, attempt: str | None = None) -> Sandbox:
        root = self.base / f"{run_id}-{uuid.uuid4().hex[:8]}"
        sandbox = StuckArchive(root)
        init = sandbox._init.pid if sandbox._init is not None else None
        (root / OWNER).write_text(json.dumps({"run": run_id, "init": init}))
        self.started.append(sandbox)
        return sandbox


def run_bounded(runner: Runner) -> Handling:
    """One delivery on a thread, joined with a generous bound (a hang fails, not a timing)."""
    out: list[Handling | None] = []
    worker = threading.Thread(target=lambda: out.append(runner.run_once(5)), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the runner did not let go: its bank was never cut"
    assert out and out[0] is not None
    return out[0]
