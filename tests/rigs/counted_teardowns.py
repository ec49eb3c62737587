"""Teardowns in real sandboxes whose execs are counted or stalled.

First written for tests/rules/test_T_engines.py: Teardown banking on real sandboxes: the quiesced
bank is one exec (quiesce, archive and continue in bank.sh), and its processes run again whatever
happens to it (T11, T14)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from waiting import NeverHappened, eventually

from rigs.real_sandboxes import Rig, rig
from scratchbank.adapters.exec_output import ExecResult
from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.scripted import BANK, QUIESCE, Exec, ScriptedSandbox
from scratchbank.application.teardown import Budgets, TeardownReport, bank_at_teardown
from scratchbank.domain.errors import StreamBroken
from scratchbank.testing.builders import started

ONE_EXEC = ["local", "docker-busybox", "podman-busybox", "k8s-double"]


@contextmanager
def counted(name: str) -> Iterator[tuple[Rig, list[str]]]:
    """A rig whose sandbox notes the script of every exec it makes, and a workload the
    quiesce stops (a sleeping process)."""
    with rig(name) as r:
        execs: list[str] = []
        real = r.sandbox.execute

        def execute(exec_: Exec) -> ExecResult:
            execs.append(exec_.source)
            return real(exec_)

        r.sh(f"mkdir -p {r.scratch}/src && echo 'int main(){{}}' > {r.scratch}/src/main.c")
        r.spawn("sleep 1000")
        r.sh("while ! grep -qs '^sleep$' /proc/[0-9]*/comm; do sleep 0.05; done")
        r.sandbox.execute = execute  # type: ignore[method-assign]
        yield r, execs


def stopped(r: Rig) -> list[str]:
    """The sandbox's stopped processes, "pid (comm)" each."""
    out = r.sh("cat /proc/[0-9]*/stat 2>/dev/null", check=False)
    return [line.rsplit(") ", 1)[0] + ")" for line in out.splitlines() if ") T " in line]


def bank(sandbox: ScriptedSandbox, **budgets: Any) -> tuple[TeardownReport, InMemoryBankStore]:
    timeline, store = InMemoryTimeline(), InMemoryBankStore()
    timeline.append("run-1", [started()])
    report = bank_at_teardown(
        "run-1",
        timeline=timeline,
        store=store,
        sandbox=sandbox,
        run_finished=False,
        budgets=Budgets(**budgets),
    )
    return report, store


def names(execs: list[str]) -> list[str]:
    return [{BANK: "bank", QUIESCE: "quiesce"}.get(source, source[:40]) for source in execs]


class Stalls:
    """A host sink that stalls on the tar stream's first bytes until released, then fails:
    the exec is held mid-archive (its tar blocked on a full pipe), then cut."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def write(self, data: bytes, /) -> int:
        self.started.set()
        self.release.wait(120)
        raise StreamBroken("the host's sink failed")


#: Kill the bank script's shell and its tar, never the watchdog (its command line differs)
#: nor this shell (its own spells the marker apart).
END_THE_EXEC = (
    "for p in /proc/[0-9]*; do"
    ' if grep -qs "scratchbank-$(echo quiesced)" $p/cmdline || grep -qsx tar $p/comm;'
    " then kill -9 ${p#/proc/} 2>/dev/null; fi; done; true"
)


def wait_for(check: Any, *, bound: float) -> bool:
    """Poll ``check`` until it holds or ``bound`` seconds have passed (a bound, not a timing)."""
    try:
        return bool(eventually(check, timeout=bound, interval=0.2))
    except NeverHappened:
        return False
