"""Teardown banking on real sandboxes: the quiesced bank is one exec (quiesce, archive and
continue in bank.sh), and its processes run again whatever happens to it (T11, T14).

Each test counts the sandbox's execs (``run`` calls) and reads the state of every
process in the sandbox: "T" is stopped.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from rigs import Rig, rig
from waiting import NeverHappened, eventually

from scratchbank.adapters.exec_output import ExecResult
from scratchbank.adapters.memory import InMemoryBankStore, InMemoryTimeline
from scratchbank.adapters.script_reports import QuiesceHead, bank_status, read_tar_stderr
from scratchbank.adapters.scripted import BANK, QUIESCE, Exec, ScriptedSandbox
from scratchbank.application.ports import QuiescedArchive, QuiesceReport
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


@pytest.mark.parametrize("engine", ONE_EXEC)
def test_T11_T14_a_quiesced_clean_bank_is_one_exec_and_leaves_processes_running(engine: str) -> None:
    """Quiesce, archive and continue in one exec; nothing is left stopped."""
    with counted(engine) as (r, execs):
        report, store = bank(r.sandbox)
        assert names(execs) == ["bank"]
        assert report.record.banked
        assert not report.record.unquiesced
        assert report.quiesce is not None
        assert report.quiesce.quiesced
        assert report.quiesce.stopped >= 1
        assert store.only("run-1") is not None
        assert stopped(r) == []


@pytest.mark.parametrize("engine", ["local", "docker-busybox"])
def test_T14_an_archive_failure_after_a_quiesce_still_gets_processes_continued(engine: str) -> None:
    """tar cannot enter the scratch after the quiesce stopped everything: the failure is
    recorded with the quiesce, and the host continues the processes (the script leaves
    them to it)."""
    with counted(engine) as (r, execs):
        r.sh(f"rm -rf {r.scratch} && echo x > {r.scratch}")
        execs.clear()  # the local rig's commands are execs too
        report, store = bank(r.sandbox, bank_tries=1)
        assert names(execs) == ["bank", "quiesce"]  # the one exec, then the host's continue
        assert report.quiesce is not None
        assert report.quiesce.quiesced
        assert report.record.files_unbanked
        assert "cannot" in report.record.reason
        assert store.stored == {}
        assert stopped(r) == []


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


@pytest.mark.parametrize("engine", ["local", "k8s-double"])
def test_T14_the_watchdog_continues_when_the_one_exec_is_cut_mid_archive(engine: str) -> None:
    """The bank exec ends mid-archive (its shell and tar killed while the stream is held)
    and nobody says "cont": the watchdog the exec left behind continues the processes once
    its budget runs out. (Not on Docker: an exec killed while its stream is held keeps
    the daemon's next exec waiting for that stream; there the watchdog is the standalone
    quiesce's, test_sandboxes' T14, and a cut exec runs to its end and continues them.)"""
    with counted(engine) as (r, _execs):
        r.sh(f"head -c 30000000 /dev/urandom > {r.scratch}/big")
        sink = Stalls()
        answers: list[object] = []

        def bank_pass() -> None:
            try:
                answers.append(
                    r.sandbox.quiesce_and_archive(sink, budget_seconds=10, wait_seconds=1, compress=False)
                )
            except BaseException as error:
                answers.append(error)

        call = threading.Thread(target=bank_pass, daemon=True)
        call.start()
        assert sink.started.wait(60), "the tar stream never began"
        r.sh(END_THE_EXEC)
        assert stopped(r) != []  # nobody continued them: the watchdog's budget is 10 s
        sink.release.set()
        call.join(60)
        (done,) = answers
        assert isinstance(done, QuiescedArchive), done
        assert done.quiesce.quiesced  # its report came before the stream
        assert isinstance(done.failure, StreamBroken)
        assert not done.continued
        assert wait_for(lambda: stopped(r) == [], bound=60.0), stopped(r)


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


# ---- the host's side of bank.sh's output, without a sandbox ----------------------------


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_T11_the_quiesce_report_is_split_from_the_tar_stream_however_it_arrives(chunk: int) -> None:
    head = b"unquiesced: pid 1 (sh) cannot be stopped from inside and may write\nwatchdog 9\nstopped 3\n"
    tar = b"scratchbank-quiesced 0\n" + bytes(range(256)) * 40  # the stream may hold the marker too
    out = io.BytesIO()
    sink = QuiesceHead(out)
    data = head + b"scratchbank-quiesced 4\n" + tar
    for i in range(0, len(data), chunk):
        assert sink.write(data[i : i + chunk]) == len(data[i : i + chunk])
    assert out.getvalue() == tar
    assert sink.report == QuiesceReport(
        False, False, ("pid 1 (sh) cannot be stopped from inside and may write",), 3
    )


def test_T11_a_refused_quiesce_reads_as_refused_and_an_endless_report_as_broken() -> None:
    sink = QuiesceHead(io.BytesIO())
    sink.write(b"refused: this is the host's initial PID namespace\nscratchbank-quiesced 3\n")
    assert sink.report is not None
    assert sink.report.refused
    endless = QuiesceHead(io.BytesIO())
    with pytest.raises(StreamBroken):
        endless.write(b"stopped 1\n" * (QuiesceHead.LIMIT // 10 + 1))


def test_T14_T16_only_the_last_stderr_line_is_the_bank_status_and_tar_never_reads_it() -> None:
    """A member named to forge the status inside tar's warnings is tar's warning, not ours."""
    forged = b"tar: ./x\nscratchbank-bank: continued: file changed as we read it\n"
    status, rest = bank_status(forged + b"scratchbank-bank: left stopped\n")
    assert status == "left stopped"
    assert rest == forged.rstrip(b"\n")
    raced, _, other = read_tar_stderr(rest + b"\ncommand terminated with exit code 1")
    assert b"left stopped" not in rest
    assert other == ["tar: ./x", "scratchbank-bank: continued: file changed as we read it"]
    assert raced == []
    assert bank_status(b"tar: ./a: file changed as we read it\n") == (
        "",
        b"tar: ./a: file changed as we read it\n",
    )
