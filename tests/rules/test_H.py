"""Rules H: a hostile sandbox: what it sends is bounded and nothing it plants is believed (ADR 0008).
The pure tier's tests of H1, H4, H7 (tests/tiers.py: a file of tests/rules/ has its tier in its name).

Each section holds tests first written in the file it names; their helpers and fixtures are in
tests/rigs/ (named for what they hold)."""

from __future__ import annotations

import ast
import io
import threading
from pathlib import Path

import pytest
from rigs.scripted_transport import (
    EXEC_PARTS,
    HUNG,
    Recording,
    Scripted,
    Stalled,
    drive,
    no_thread_left,  # noqa: F401 - a fixture
)

import scratchbank.adapters as adapters_pkg
from scratchbank.adapters.exec_output import Bounded, ExecResult
from scratchbank.adapters.exec_pump import STDERR, STDOUT
from scratchbank.adapters.script_reports import QuiesceHead, quiesce_verdict
from scratchbank.adapters.scripted import REAP, Exec, ForwardingSandbox, ScriptedSandbox
from scratchbank.application.cancellation import Cancel, CancelScope, Deadline
from scratchbank.application.ports import QuiesceReport, SandboxFacts
from scratchbank.domain.errors import ExecFailed, OutputOverBound, StreamBroken

# ---- from tests/rules/test_[HT]*.py: One cancellation scope (issue 25, build item 0): a scope owns its deadline, its cancel and its threads, and joins them on exit; nothing outlives it silently. And ``retry_within``, the one retry loop (its ``again`` and ``stop``).


def test_H7_a_thread_started_in_a_scope_is_joined_at_its_exit() -> None:
    """The body returns before its thread: the exit waits for the thread to end.
    Proves ``scratchbank.application.cancellation.CancelScope``."""
    release, ended = threading.Event(), threading.Event()

    def work() -> None:
        release.wait(HUNG)
        ended.set()

    with CancelScope(60.0, name="t") as scope:
        thread = scope.start(work, "work")
        release.set()
    assert ended.is_set() and not thread.is_alive()
    assert scope.outlived == () and not scope.fired


def test_H7_a_scope_deadline_cancels_its_children() -> None:
    """The deadline passes: the scope's cancel is cut, its hooks run, a nested scope is cut.
    Proves ``scratchbank.application.cancellation.CancelScope``."""
    cut = threading.Event()
    with CancelScope(0.05, name="outer") as outer:
        outer.on_cut(cut.set)
        with CancelScope(parent=outer, name="inner") as inner:
            assert inner.deadline.at <= outer.deadline.at
            scope_thread = inner.start(lambda: inner.cancel.wait(HUNG), "waits-for-the-cut")
        assert inner.fired and inner.cancelled
        assert outer.cancel.wait(HUNG)  # its own deadline, the same instant
    assert outer.fired and cut.is_set() and not scope_thread.is_alive()


def test_H7_an_outer_cancel_cuts_the_scope_at_once() -> None:
    """A run context (the deadline's Cancel) cancelled: the scope and its deadline are cut.
    Proves ``scratchbank.application.cancellation.Cancel``."""
    run_context = Cancel()
    with CancelScope(Deadline.after(3600.0, run_context), name="s") as scope:
        waiter = scope.start(lambda: scope.cancel.wait(HUNG), "waiter")
        run_context.cut("the lease was lost")
    assert scope.fired and scope.deadline.passed() and not waiter.is_alive()
    assert scope.cancel.why == "the lease was lost"


def test_H7_nested_scopes_an_inner_cut_stays_inner_an_outer_cut_reaches_down() -> None:
    """Cutting an inner scope leaves the outer one running; cutting the outer cuts the inner.
    Proves ``scratchbank.application.cancellation.CancelScope``."""
    with CancelScope(60.0, name="outer") as outer:
        with CancelScope(parent=outer, name="inner") as inner:
            inner.cut("done here")
        assert inner.cancelled and not outer.cancelled
        with CancelScope(parent=outer, name="second") as second:
            waiter = second.start(lambda: second.cancel.wait(HUNG), "waiter")
            outer.cut("the outer scope is cut")
        assert second.fired and second.cancel.why == "the outer scope is cut" and not waiter.is_alive()
    assert not outer.fired


def test_H7_a_scope_exited_by_an_exception_cuts_and_still_joins() -> None:
    """The body raises: the scope cuts (its threads see it) and joins them before the raise.
    Proves ``scratchbank.application.cancellation.CancelScope``."""
    threads: list[threading.Thread] = []
    scope = CancelScope(3600.0, name="s")

    def body() -> None:
        with scope:
            threads.append(scope.start(lambda: scope.cancel.wait(HUNG), "waiter"))
            raise KeyError("boom")

    with pytest.raises(KeyError):
        body()
    assert scope.cancelled and not threads[0].is_alive() and scope.outlived == ()


def test_H7_a_thread_that_will_not_stop_is_named_never_leaked_silently(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A thread that ignores the cut outlives the grace: the scope names it and logs it.
    Proves ``scratchbank.application.cancellation.CancelScope``."""
    stubborn = threading.Event()
    with CancelScope(0.01, name="s", grace=0.05) as scope:
        thread = scope.start(lambda: stubborn.wait(HUNG), "stubborn")
    try:
        assert scope.outlived == ("s:stubborn",)
        assert "s:stubborn" in caplog.text
    finally:
        stubborn.set()
        thread.join(HUNG)


def test_H7_the_deadline_timer_is_joined_too() -> None:
    """No thread of the scope's own (its deadline timer) is left after the exit.
    Proves ``scratchbank.application.cancellation.CancelScope``."""
    before = threading.active_count()
    with CancelScope(3600.0, name="s"):
        pass
    assert threading.active_count() == before


# ---- from tests/rules/test_[HLX]*.py: One exec pump for every transport (issue 25, build item 0; ADR 0008): the pump owns stdin's feeding, the bounded sinks, the deadline and the cut; a transport supplies only send/receive/cut. Driven here through a scripted transport (no engine): the engines' own runs are tests/test_deadlines.py, test_hostile_sandbox.py and test_sandboxes.py.


def test_H7_the_pump_feeds_stdin_drains_both_channels_and_returns_the_exit_code(no_thread_left: None) -> None:
    """Every byte in, stdout to the sink, stderr as its tail, the exec's own status.
    Proves ``scratchbank.adapters.exec_pump.pump``."""
    exec_ = Scripted([(STDOUT, b"out"), (STDERR, b"err")], code=3)
    sink = Bounded(100, "test")
    done = drive(exec_, io.BytesIO(b"x" * 5000), sink, Deadline.after(HUNG))
    assert (done.exit_code, sink.getvalue(), done.stderr) == (3, b"out", b"err")
    assert bytes(exec_.received) == b"x" * 5000 and exec_.closed_input and exec_.closed
    assert exec_.cuts == 0  # an exec that ended is never cut (its watchdog lives on)


def test_H7_a_call_returns_at_its_deadline_whatever_holds_its_output(no_thread_left: None) -> None:
    """A detached child holds the output open: the deadline cuts, the call says so by name.
    Proves ``scratchbank.adapters.exec_pump.pump``."""
    exec_ = Scripted([(STDOUT, b"partial")], hold=True)
    with pytest.raises(StreamBroken, match="deadline"):
        drive(exec_, None, Bounded(100, "test"), Deadline.after(0.1))
    assert exec_.cuts >= 1 and exec_.closed
    quiet = Scripted([], hold=True)
    with pytest.raises(ExecFailed, match="deadline"):  # no streams: given up, ExecFailed
        drive(quiet, None, None, Deadline.after(0.1))


def test_H1_output_past_its_bound_cuts_the_exec_and_raises_its_own_name(no_thread_left: None) -> None:
    """A sink's OutputOverBound passes through as itself after the exec is cut."""
    exec_ = Scripted([(STDOUT, b"y" * 10)] * 5, hold=True)
    with pytest.raises(OutputOverBound):
        drive(exec_, None, Bounded(25, "the listing"), Deadline.after(3600.0))
    assert exec_.cuts >= 1


def test_H7_a_source_waiting_on_the_host_is_abandoned_when_the_exec_ends(no_thread_left: None) -> None:
    """A restore refused early: the verdict's source is told, the feeder ends with the call.
    Proves ``scratchbank.adapters.exec_pump.pump``."""
    source = Stalled(b"frame")
    exec_ = Scripted([(STDOUT, b"refused")], code=21)
    done = drive(exec_, source, Bounded(100, "t"), Deadline.after(3600.0))
    assert done.exit_code == 21 and source.answered.is_set() and exec_.stopped


def test_H7_a_peer_that_stops_reading_does_not_hold_the_call(no_thread_left: None) -> None:
    """The exec exits without reading stdin: the blocked send is released, its status stands.
    Proves ``scratchbank.adapters.exec_pump.pump``."""
    exec_ = Scripted([(STDERR, b"no space")], reads=False, code=1)
    done = drive(exec_, io.BytesIO(b"z" * 100), None, Deadline.after(3600.0))
    assert done.exit_code == 1 and exec_.cuts == 0


def test_H7_no_transport_keeps_its_own_feeder() -> None:
    """local, Docker/Podman and Kubernetes start no thread of their own: the pump's scope does.
    Proves ``scratchbank.adapters.exec_pump.pump``."""
    root = Path(adapters_pkg.__file__).parent
    for name in ("local_sandbox.py", "docker_sandbox.py", "k8s_sandbox.py", "watchdog.py"):
        banned = {"Thread", "Feeder", "Timer"}
        tree = ast.parse((root / name).read_text())
        named = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        named |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert not banned & named, name  # a Watchdog's cut is an alarm on alarms.py's one thread


def test_H7_what_to_run_is_one_Exec_value_no_transport_or_proxy_repeats_its_signature() -> None:
    """Only ScriptedSandbox.run (the tests' convenience) spells the exec's parts as
    parameters: the transports, the pump and the proxies take one ``Exec``."""
    src = Path(adapters_pkg.__file__).parent.parent  # the installed package's root
    spelled = []
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                params = {a.arg for a in node.args.args + node.args.kwonlyargs}
                if params >= EXEC_PARTS:
                    spelled.append(f"{path.relative_to(src)}:{node.name}")
    assert spelled == ["adapters/scripted.py:run"], spelled


def test_H7_a_proxy_forwards_the_Exec_whole_and_overrides_only_what_it_changes() -> None:
    """The hostile kit over a forwarding base: the call's Exec reaches the transport with
    its streams, user, deadline and token; only the source is shadowed, never the reaper's.
    Proves ``scratchbank.adapters.exec_output.Bounded``."""
    from scratchbank.testing.hostile import HostileSandbox

    inner = Recording(fail=True)
    inner.facts = None  # type: ignore[assignment]
    hostile = HostileSandbox(inner, "tar() { :; }")
    assert isinstance(hostile, ForwardingSandbox) and hostile.list_bytes == 7
    sink, deadline = Bounded(10, "t"), Deadline.after(HUNG)
    with pytest.raises(StreamBroken):
        hostile.call(Exec("echo", ["a"], stdout=sink, user="u", deadline=deadline))
    call, reaper = inner.seen
    assert call.source == "tar() { :; }\necho" and call.args == ("a",)
    assert (call.stdout, call.user, call.deadline) == (sink, "u", deadline) and call.token
    assert reaper.source == REAP and reaper.args == (call.token,) and reaper.user == "u"


# -- H4: the quiesce's verdict: no report line after it is the quiesce's ---------------------


def test_H4_the_quiesce_alone_takes_no_report_line_after_its_verdict() -> None:
    """``quiesce.sh stop``'s report ends at its first verdict line: the watchdog's line and
    anything a tool run after it printed (a count, a reason) is no part of the report.
    Proves ``scratchbank.adapters.script_reports.quiesce_verdict``."""
    lines = ["stopped 2", "scratchbank-quiesced 0", "watchdog 7", "stopped 999", "unquiesced: forged"]
    assert quiesce_verdict(0, lines) == QuiesceReport(True, False, (), 2)


def test_H4_a_verdict_line_that_is_not_the_exit_code_or_none_is_no_quiesce() -> None:
    """A verdict line whose code is not the script's exit code (one written ahead of the
    script's own), or an exit 0 without one, reads unquiesced, named.
    Proves ``scratchbank.adapters.script_reports.quiesce_verdict``."""
    forged = quiesce_verdict(4, ["scratchbank-quiesced 0", "unquiesced: pid 1 (w) wrote", "stopped 1"])
    assert not forged.quiesced and "says 0, its exit code is 4" in forged.reasons[0], forged
    silent = quiesce_verdict(0, ["stopped 3"])
    assert not silent.quiesced and "without its verdict line" in silent.reasons[0], silent
    refused = quiesce_verdict(3, ["refused: the shell's kill is not its builtin", "scratchbank-quiesced 3"])
    assert refused.refused and refused.reasons == ("the shell's kill is not its builtin",), refused


class _Banked(ScriptedSandbox):
    """A sandbox whose bank exec sends ``stdout`` and ends with ``code`` (no engine)."""

    def __init__(self, stdout: bytes, code: int) -> None:
        self.stdout, self.code = stdout, code
        self.facts = SandboxFacts("/tmp/iterion-scratch", False, True, "own PID namespace")

    def execute(self, exec_: Exec) -> ExecResult:
        assert exec_.stdout is not None
        exec_.stdout.write(self.stdout)
        return ExecResult(self.code, stderr=b"scratchbank-bank: continued\n")


def _banked(stdout: bytes, code: int) -> QuiesceReport:
    return (
        _Banked(stdout, code)
        .quiesce_and_archive(io.BytesIO(), budget_seconds=5, wait_seconds=1, compress=False)
        .quiesce
    )


def test_H4_a_verdict_line_written_ahead_of_the_scripts_own_is_told_by_the_banks_exit_code() -> None:
    """PID 1 (never stopped, same user) writes ``scratchbank-quiesced 0`` to the script's stdout
    ahead of the script's own verdict (seen on Docker BusyBox: the record read quiesced): the
    bank's exit code, which only its shell sets, carries the verdict (tar's 0 + 32 x 1, partial)
    and the record reads unquiesced, named. A confirmed line stands; a status too large to carry
    a verdict confirms no quiesced line. Proves ``scratchbank.adapters.script_reports.confirmed``."""
    real = b"unquiesced: pid 1 (sh) wrote\nstopped 0\nscratchbank-quiesced 4\n"
    forged = _banked(b"scratchbank-quiesced 0\n" + real, 0 + 32 * 1)
    assert not forged.quiesced and "says 0, the bank's exit code says 4" in forged.reasons[0], forged
    assert _banked(real, 32) == QuiesceReport(False, False, ("pid 1 (sh) wrote",), 0)
    assert _banked(b"stopped 2\nscratchbank-quiesced 0\n", 0) == QuiesceReport(True, False, (), 2)
    assert not _banked(b"scratchbank-quiesced 0\n", 137).quiesced


def test_H4_a_verdict_line_of_thousands_of_digits_is_no_verdict_line() -> None:
    """A workload process writes ``scratchbank-quiesced`` and 5000 digits into the bank's
    stdout ahead of the script's verdict: no line of more than 3 digits is a verdict, the
    script's own is read after it (found by attack: int() refused the digits, a raw
    ValueError out of the stream's sink). Proves ``scratchbank.adapters.script_reports.QuiesceHead``."""
    tar = io.BytesIO()
    head = QuiesceHead(tar)
    head.write(b"scratchbank-quiesced " + b"0" * 5000 + b"\nstopped 2\n")
    head.write(b"unquiesced: pid 1 wrote\nstopped 3\nscratchbank-quiesced 4\nTAR")
    assert head.code == 4 and head.report is not None and not head.report.quiesced
    assert tar.getvalue() == b"TAR"


def test_H4_a_bank_exec_cut_after_a_verdict_line_keeps_no_quiesced_word() -> None:
    """A process of the script's user writes ``scratchbank-quiesced 0`` to its stdout, then
    stops the script (SIGSTOP) until the call's deadline cuts the exec: no exit code
    confirms the line, so the pass reads unquiesced, named, its stopped count kept (found by
    attack: the record said quiesced). Proves ``scratchbank.adapters.scripted.ScriptedSandbox.quiesce_and_archive``."""

    class Cut(_Banked):
        def execute(self, exec_: Exec) -> ExecResult:
            assert exec_.stdout is not None
            exec_.stdout.write(self.stdout)
            raise StreamBroken("cut at its deadline")

    done = Cut(b"stopped 2\nscratchbank-quiesced 0\n", 0).quiesce_and_archive(
        io.BytesIO(), budget_seconds=5, wait_seconds=1, compress=False
    )
    assert done.archive is None and isinstance(done.failure, StreamBroken) and not done.continued
    assert not done.quiesce.quiesced and not done.quiesce.refused and done.quiesce.stopped == 2
    assert "cut before its exit code" in done.quiesce.reasons[0]
